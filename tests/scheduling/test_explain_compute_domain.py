"""``explain`` on ComputeDomain devices: the pools are what ``gpudra compute-domain-node``
publishes (its own device and slice builders), the allocator is the reference one, and the
verdict says what holds a channel claim back in the domain's words."""

from __future__ import annotations

from typing import Any

import pytest

from gpudra.api import compute_domain as cd
from gpudra.controller.slices import build_slices
from gpudra.driver.compute_domain_devices import build_devices
from gpudra.driver.nvml import FabricInfo
from gpudra.scheduling.allocator import Allocator
from gpudra.scheduling.explain import default_device_classes, explain
from gpudra.scheduling.explain_compute_domain import device_classes, domain_templates
from gpudra.scheduling.explain_subjects import ExplainError, Subject, subjects
from tests.scheduling.test_allocator import h100_node

RACK = "9c6f5af3-53bf-49b5-a436-b66766c413c3"
UID = "6b1f0f8e-3c1a-4b7e-9d2a-5e8f7a6b5c4d"
CLASSES = default_device_classes("gpu.nvidia.com") + device_classes()


def _fabric(clique: int = 4026, state: str = "Completed") -> FabricInfo:
    return FabricInfo(cluster_uuid=RACK, clique_id=clique, state=state, status=0)


def _pool(node: str, fabric: FabricInfo | None = None, **counts: int) -> list[dict[str, Any]]:
    """The node's compute-domain slices as the node daemon builds them."""
    return list(build_slices(build_devices(fabric, **counts), driver=cd.DRIVER_NAME,
                             node_name=node))


def _claim(name: str, requests: list[dict[str, Any]],
           constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"devices": devices}}


CHANNEL = {"name": "channel", "exactly": {"deviceClassName": cd.CHANNEL_DEVICE_CLASS}}
DAEMON = {"name": "daemon", "exactly": {"deviceClassName": cd.DAEMON_DEVICE_CLASS}}
GPUS = {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}


def _held(node: str, devices: list[str], request: str = "channel") -> list[dict[str, Any]]:
    """Claims of other pods holding these devices of the node."""
    return [{**_claim(f"other-{d}", [CHANNEL]), "status": {"allocation": {"devices": {
        "results": [{"request": request, "driver": cd.DRIVER_NAME, "pool": node,
                     "device": d}]}}}} for d in devices]


def _explain(slices: list[dict[str, Any]], claim: dict[str, Any], nodes: list[str],
             allocations: list[dict[str, Any]] | None = None, classes: Any = None) -> Any:
    allocator = Allocator(slices, CLASSES if classes is None else classes, allocations or [])
    return explain(Subject(f"ResourceClaim default/{claim['metadata']['name']}", [claim]),
                   allocator, nodes)


def test_a_channel_fits_and_the_pod_waits_for_the_domains_daemon():
    claim = _claim("worker", [CHANNEL])
    claim["spec"]["devices"]["config"] = [{"opaque": {
        "driver": cd.DRIVER_NAME, "parameters": cd.channel_config(UID)}}]
    result = _explain(_pool("tray-0", _fabric()), claim, ["tray-0"])
    assert result.ok
    assert result.verdict == (
        "ALLOCATABLE on node tray-0: channel -> channel-0; then WAITS for ComputeDomainReady "
        "(the ComputeDomain's IMEX daemon on tray-0 Ready) before the pod binds")
    (hint,) = result.hints
    assert hint.startswith("channel-0 of node tray-0 (compute-domain.nvidia.com, published by "
                           "gpudra compute-domain-node) has binding conditions "
                           "ComputeDomainReady")
    assert "ComputeDomainFailed instead ends the wait" in hint


def test_a_daemon_slot_has_no_binding_condition():
    claim = _claim("imex", [DAEMON])
    claim["spec"]["devices"]["config"] = [{"requests": ["daemon"], "opaque": {
        "driver": cd.DRIVER_NAME, "parameters": cd.daemon_config(UID)}}]
    result = _explain(_pool("tray-0", _fabric()), claim, ["tray-0"])
    assert result.verdict == "ALLOCATABLE on node tray-0: daemon -> daemon-0"
    assert result.hints == []


def test_every_channel_of_the_node_taken():
    slices = _pool("tray-0", _fabric(), channels=2)
    result = _explain(slices, _claim("worker", [CHANNEL]), ["tray-0"],
                      _held("tray-0", ["channel-0", "channel-1"]))
    assert not result.allocatable
    assert result.verdict == (
        "NOT ALLOCATABLE: all 2 IMEX channels of the node are allocated to other claims "
        "(--channels of gpudra compute-domain-node)")
    # What the allocator said is kept.
    assert any(h.startswith("the allocator's own words: ") and "needs 1, 0 of" in h
               for h in result.hints), result.hints


def test_every_daemon_slot_taken_means_as_many_domains_on_the_node():
    slices = _pool("tray-0", _fabric(), daemons=1)
    result = _explain(slices, _claim("imex", [DAEMON]), ["tray-0"],
                      _held("tray-0", ["daemon-0"], request="daemon"))
    assert result.verdict.startswith(
        "NOT ALLOCATABLE: all 1 IMEX daemon slots of the node are taken: as many "
        "ComputeDomains already have an IMEX daemon there")


def test_a_node_whose_fabric_is_not_ready_publishes_no_channels():
    # The node daemon publishes an empty pool for a node outside a ready clique.
    result = _explain(_pool("tray-0", None) + _pool("tray-1", None),
                      _claim("worker", [CHANNEL]), ["tray-0", "tray-1"])
    assert result.verdict.startswith(
        "NOT ALLOCATABLE: the node publishes no IMEX channels: its NVLink fabric is not "
        "ready, or it is in no multi-node NVLink clique")
    assert result.verdict.endswith("(on all 2 nodes)")


def test_a_node_without_the_node_daemon():
    slices = h100_node("gpu-node", 2, dynamic_mig=False)
    result = _explain(slices, _claim("worker", [CHANNEL]), ["gpu-node"])
    assert result.verdict.startswith(
        "NOT ALLOCATABLE: no compute-domain.nvidia.com devices on the node: gpudra "
        "compute-domain-node does not run there (chart: computeDomains.enabled)")


def test_a_cluster_without_the_device_class():
    result = _explain(_pool("tray-0", _fabric()), _claim("worker", [CHANNEL]), ["tray-0"],
                      classes=default_device_classes("gpu.nvidia.com"))
    assert result.verdict == (
        "NOT ALLOCATABLE: DeviceClass compute-domain-default-channel.nvidia.com does not "
        "exist: the chart installs it, and runs gpudra compute-domain-node, with "
        "computeDomains.enabled")


def test_mixed_reasons_name_the_commonest_and_hint_the_rest():
    slices = (_pool("tray-0", _fabric(), channels=1) + _pool("tray-1", None)
              + _pool("tray-2", None))
    result = _explain(slices, _claim("worker", [CHANNEL]), ["tray-0", "tray-1", "tray-2"],
                      _held("tray-0", ["channel-0"]))
    assert result.verdict.startswith("NOT ALLOCATABLE: the node publishes no IMEX channels")
    assert result.verdict.endswith("(on 2 of 3 nodes)")
    assert result.hints[0] == ("all 1 IMEX channels of the node are allocated to other "
                               "claims (--channels of gpudra compute-domain-node) (on 1 node)")


def test_match_attribute_on_the_clique_with_gpus_that_publish_none():
    # GPUs and a channel tied to one clique: the GPU driver's devices carry no
    # compute-domain cliqueID, so the constraint can never hold.
    slices = h100_node("tray-0", 2, dynamic_mig=False) + _pool("tray-0", _fabric())
    claim = _claim("tied", [GPUS, CHANNEL], [{
        "requests": ["gpus", "channel"], "matchAttribute": "compute-domain.nvidia.com/cliqueID"}])
    result = _explain(slices, claim, ["tray-0"])
    assert not result.allocatable
    assert result.verdict.startswith(
        "NOT ALLOCATABLE: matchAttribute on compute-domain.nvidia.com/cliqueID cannot be met: "
        "the devices are in different NVLink cliques, or some publish no cliqueID")


def test_match_attribute_on_the_clique_across_cliques():
    # A pool whose channels are in two cliques (a tray moved mid-publish, say): two channels
    # of one claim that must share a clique cannot come from both.
    one, two = _pool("tray-0", _fabric(1), channels=1), _pool("tray-0", _fabric(2), channels=1)
    (first,), (second,) = one, two
    second["spec"]["devices"] = [{**d, "name": "channel-1"} for d in second["spec"]["devices"]
                                 if d["name"] == "channel-0"]
    first["spec"]["devices"] = first["spec"]["devices"] + second["spec"]["devices"]
    claim = _claim("pair", [{**CHANNEL, "exactly": {**CHANNEL["exactly"], "count": 2}}],
                   [{"matchAttribute": "compute-domain.nvidia.com/cliqueID"}])
    result = _explain([first], claim, ["tray-0"])
    assert "matchAttribute on compute-domain.nvidia.com/cliqueID cannot be met" in \
        result.verdict, result.verdict
    assert "differs from" in result.verdict


def test_gpu_claims_are_told_as_before():
    slices = h100_node("gpu-node", 1, dynamic_mig=False) + _pool("gpu-node", _fabric())
    result = _explain(slices, _claim("gpu", [GPUS]), ["gpu-node"])
    assert result.verdict.startswith("NOT ALLOCATABLE: request gpus: needs 2")
    assert not any("compute-domain" in h or "IMEX" in h for h in result.hints)


# --- the template a ComputeDomain stands for ------------------------------------------------

DOMAIN = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
          "metadata": {"name": "training", "namespace": "ml"},
          "spec": {"numNodes": 4, "channel": {"resourceClaimTemplate": {"name": "ch"},
                                              "allocationMode": "All"}}}


def test_a_domain_stands_for_the_channel_template_the_controller_makes():
    (template,) = domain_templates([DOMAIN])
    assert template["metadata"] == {"name": "ch", "namespace": "ml"}
    devices = template["spec"]["spec"]["devices"]
    assert devices["requests"] == [{"name": "channel", "exactly": {
        "deviceClassName": cd.CHANNEL_DEVICE_CLASS}}]
    parameters = devices["config"][0]["opaque"]["parameters"]
    assert parameters["kind"] == cd.CHANNEL_CONFIG_KIND
    assert parameters["allocationMode"] == "All"
    cd.parse_channel_config(parameters)  # the node side accepts it
    # Stable: the same domain gives the same stand-in uid.
    assert domain_templates([DOMAIN]) == [template]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w", "namespace": "ml"},
           "spec": {"resourceClaims": [{"name": "imex", "resourceClaimTemplateName": "ch"}],
                    "containers": [{"name": "c", "image": "x"}]}}
    found, _ = subjects([DOMAIN, pod, *domain_templates([DOMAIN, pod])])
    assert [s.title for s in found] == ["Pod ml/w"]


def test_a_template_in_the_input_wins_and_a_bad_domain_is_named():
    given = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
             "metadata": {"name": "ch", "namespace": "ml"}, "spec": {"spec": {"devices": {}}}}
    assert domain_templates([DOMAIN, given]) == []
    bad = {**DOMAIN, "spec": {"numNodes": -1, "channel": {"resourceClaimTemplate": {
        "name": "ch"}}}}
    with pytest.raises(ExplainError, match=r"ComputeDomain ml/training.*numNodes"):
        domain_templates([bad])


def test_the_names_explain_repeats_are_the_apis():
    from gpudra.scheduling import explain_compute_domain as ecd

    for name in ("DRIVER_NAME", "CHANNEL_DEVICE_CLASS", "DAEMON_DEVICE_CLASS",
                 "DEVICE_TYPE_CHANNEL", "DEVICE_TYPE_DAEMON", "ATTRIBUTE_TYPE",
                 "ATTRIBUTE_CLIQUE_ID"):
        assert getattr(ecd, name) == getattr(cd, name), name
    assert (ecd._GROUP, ecd._KIND) == (cd.GROUP, cd.KIND)


# --- configs, as the node side reads them at prepare ----------------------------------------

def _configured(parameters: Any, requests: list[str] | None = None) -> dict[str, Any]:
    claim = _claim("worker", [CHANNEL])
    entry: dict[str, Any] = {"opaque": {"driver": cd.DRIVER_NAME, "parameters": parameters}}
    if requests is not None:
        entry["requests"] = requests
    claim["spec"]["devices"]["config"] = [entry]
    return claim



@pytest.mark.parametrize(("parameters", "requests", "says"), [
    (cd.channel_config(UID), None, None),
    (cd.channel_config(UID), ["channel"], None),
    (None, None, "spec.devices.config: no ComputeDomainChannelConfig for driver "
                 "compute-domain.nvidia.com and request channel (which ComputeDomain?)"),
    (cd.channel_config(UID), ["other"], "no ComputeDomainChannelConfig"),
    (cd.daemon_config(UID), None, "spec.devices.config[0].opaque.parameters.kind: "
                                  "'ComputeDomainDaemonConfig' does not configure channel "
                                  "devices (want ComputeDomainChannelConfig)"),
    ({**cd.channel_config(UID), "domainID": "../etc"}, None,
     "spec.devices.config[0].opaque.parameters: ComputeDomainChannelConfig"),
    ({**cd.channel_config(UID), "apiVersion": "v1"}, None,
     "expected apiVersion resource.nvidia.com/v1beta1"),
], ids=["ok", "ok-for-request", "none", "other-request", "daemon-kind", "bad-uid",
        "bad-version"])
def test_a_channel_claims_config_is_checked_as_the_node_side_reads_it(parameters, requests,
                                                                      says):
    claim = _claim("worker", [CHANNEL]) if parameters is None else _configured(parameters,
                                                                              requests)
    result = _explain(_pool("tray-0", _fabric()), claim, ["tray-0"])
    if says is None:
        assert result.ok and result.config_errors == [], result.config_errors
        return
    assert result.allocatable and not result.ok
    (error,) = result.config_errors
    assert error.startswith("ResourceClaim default/worker: ") and says in error, error
    assert result.verdict.startswith(f"FAILS AT PREPARE: {error}")

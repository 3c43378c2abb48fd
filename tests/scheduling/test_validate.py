"""Offline checks of DeviceClasses and claims: API limits, CEL, this driver's attribute schema."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpudra.scheduling.validate import objects, validate_object

DRIVER = "gpu.nvidia.com"
A = "device.attributes['gpu.nvidia.com']"


def claim(*requests: dict, **devices: Any) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default"},
            "spec": {"devices": {"requests": list(requests), **devices}}}


def request(name: str = "gpu", *selectors: str, **exact: Any) -> dict:
    spec: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com"}
    if selectors:
        spec["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    spec.update(exact)
    return {"name": name, "exactly": spec}


def problems(obj: dict) -> list[tuple[str, str]]:
    return [(p.path, p.message) for p in validate_object(obj, driver=DRIVER)
            if not p.warning]


def test_a_good_claim_has_no_problems():
    obj = claim(request("gpu", f"{A}.productName.startsWith('NVIDIA H100')",
                        f"{A}.driverVersion.compareTo(semver('580.95.5')) >= 0",
                        "device.capacity['gpu.nvidia.com'].memory.isGreaterThan("
                        "quantity('40Gi'))"),
                request("mig", f"{A}.profile == '1g.10gb'", deviceClassName="mig.nvidia.com",
                        count=2),
                constraints=[{"requests": ["gpu", "mig"],
                              "matchAttribute": "gpu.nvidia.com/parentUUID"}],
                config=[{"requests": ["mig"], "opaque": {"driver": DRIVER, "parameters": {
                    "apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"}}}])
    assert problems(obj) == []


@pytest.mark.parametrize(("expression", "message"), [
    (f"{A}.productNmae == 'x'",
     "line 1, column 37: device.attributes['gpu.nvidia.com'].productNmae: no such attribute: "
     "productNmae is not published, so the scheduler fails with 'no such key'; did you mean "
     "'productName'?"),
    (f"has({A}.numaNod)", "numaNod is never published; did you mean 'numaNode'?"),
    (f"{A}.index == 0", "NVIDIA's driver removed 'index'"),
    ("device.attributes['resource.kubernetes.io'].pcieRot == 'x'", "did you mean 'pcieRoot'?"),
    ("device.capacity['gpu.nvidia.com'].mem.isGreaterThan(quantity('1'))",
     "no such capacity on this driver's devices; did you mean 'memory'?"),
    (f"{A}.driverVersion == '580.95.05'",
     "line 1, column 37: driverVersion is a version: '==' with a string fails at scheduling "
     "time ('no such overload'); use device.attributes['gpu.nvidia.com'].driverVersion."
     "compareTo(semver('580.95.5')) == 0"),
    (f"'580.95.5' != {A}.driverVersion",
     "driverVersion is a version: comparing it with a string is always true"),
    (f"{A}.driverVersion > semver('550.0.0')",
     "Invalid value: CEL compile error: found no matching overload for '_>_' applied to "
     "'(dyn, kubernetes.Semver)' (line 1, column 51); versions are compared with methods: "
     "device.attributes['gpu.nvidia.com'].driverVersion.compareTo(semver('550.0.0')) > 0"),
    (f"{A}.driverVersion > '550.0.0'",
     "driverVersion is a version: '>' fails at scheduling time ('no such overload': versions "
     "have no ordering operators); use device.attributes['gpu.nvidia.com'].driverVersion."
     "compareTo(semver('550.0.0')) > 0"),
    (f"{A}.numaNode == '0'", "numaNode is an int: comparing it with a string is always false"),
    (f"{A}.numaNode < '1'", "numaNode is an int: '<' with a string fails at scheduling time"),
    (f"{A}.productName == semver('1.0.0')",
     "productName is a string: comparing it with a Semver is always false"),
    (f"semver('1.0.0') == {A}.productName",
     "productName is a string: '==' with a Semver fails at scheduling time"),
    # capacities are statically Quantities: the apiserver refuses these at create
    ("device.capacity['gpu.nvidia.com'].memory > quantity('40Gi')",
     "CEL compile error: found no matching overload for '_>_' applied to "
     "'(kubernetes.Quantity, kubernetes.Quantity)' (line 1, column 42); quantities are "
     "compared with methods: device.capacity['gpu.nvidia.com'].memory.compareTo("
     "quantity('40Gi')) > 0"),
    ("device.capacity['gpu.nvidia.com'].memory == 85899345920",
     "CEL compile error: found no matching overload for '_==_' applied to "
     "'(kubernetes.Quantity, int)'"),
    ("device.capacity['gpu.nvidia.com'].memory >= '60Gi'",
     "compareTo(quantity('60Gi')) >= 0"),
    (f"string({A}.driverVersion) == '580.95.5'",
     "driverVersion is a version: string() of it fails at scheduling time ('no such "
     "overload')"),
    ("device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('40 GiB'))",
     "quantity('40 GiB') fails at scheduling time: quantities must match"),
    (f"{A}.driverVersion.isGreaterThan(semver('580.95.05'))",
     "semver('580.95.05') fails at scheduling time: Patch number must not contain leading "
     "zeroes '05'; did you mean semver('580.95.5')?"),
    ("foo(1)", "Invalid value: CEL compile error: undeclared reference to 'foo' "
               "(line 1, column 1)"),
    (f"{A}.productName.matches('[')", "invalid regular expression '['"),
])
def test_selector_problems(expression, message):
    found = problems(claim(request("gpu", expression)))
    assert len(found) == 1, found
    path, text = found[0]
    assert path == "spec.devices.requests[0].exactly.selectors[0].cel.expression"
    assert message in text


def test_other_vendors_domains_are_not_second_guessed():
    assert problems(claim(request("x", "device.attributes['amd.com'].anything == 'x'"))) == []


def test_unsupported_cel_is_a_warning_not_an_error():
    assert validate_object(claim(request("gpu", "cel.bind(a, device.driver, a == 'x')")),
                           driver=DRIVER) == []  # supported now: neither error nor warning
    obj = claim(request("gpu", "sets.contains([device.driver], ['x'])"))
    assert problems(obj) == []
    (warning,) = validate_object(obj, driver=DRIVER)
    assert warning.warning and "not supported by the local CEL evaluator" in warning.message


def bad(mutate) -> list[tuple[str, str]]:
    obj = claim(request("gpu"), request("mig", deviceClassName="mig.nvidia.com"))
    mutate(obj["spec"]["devices"])
    return problems(obj)


@pytest.mark.parametrize(("mutate", "path", "message"), [
    (lambda d: d["requests"][0].update(name="GPU_0"), "spec.devices.requests[0].name",
     "Invalid value: 'GPU_0'"),
    (lambda d: d["requests"][1].update(name="gpu"), "spec.devices.requests[1].name",
     "Duplicate value: 'gpu'"),
    (lambda d: d["requests"].extend(request(f"r{i}") for i in range(31)),
     "spec.devices.requests", "Too many: 33: must have at most 32 items"),
    (lambda d: d["requests"][0].update(firstAvailable=[{"name": "a", "deviceClassName": "x"}]),
     "spec.devices.requests[0]", "exactly one of `exactly` or `firstAvailable`"),
    (lambda d: d["requests"][0].pop("exactly"), "spec.devices.requests[0]",
     "exactly one of `exactly` or `firstAvailable`"),
    (lambda d: d["requests"][0]["exactly"].update(count=0),
     "spec.devices.requests[0].exactly.count", "must be greater than zero"),
    (lambda d: d["requests"][0]["exactly"].update(allocationMode="All", count=2),
     "spec.devices.requests[0].exactly.count", "must not be set when allocationMode is All"),
    (lambda d: d["requests"][0]["exactly"].update(allocationMode="Some"),
     "spec.devices.requests[0].exactly.allocationMode", "Unsupported value: 'Some'"),
    (lambda d: d["requests"][0]["exactly"].pop("deviceClassName"),
     "spec.devices.requests[0].exactly.deviceClassName", "Required value"),
    (lambda d: d["requests"][0]["exactly"].update(
        selectors=[{"cel": {"expression": "true"}}] * 33),
     "spec.devices.requests[0].exactly.selectors", "Too many: 33"),
    (lambda d: d["requests"][0].update(exactly=None, firstAvailable=[
        {"name": "a", "deviceClassName": "gpu.nvidia.com", "adminAccess": True}]),
     "spec.devices.requests[0].firstAvailable[0].adminAccess", "Forbidden"),
    (lambda d: d["requests"][0].update(exactly=None, firstAvailable=[
        {"name": f"s{i}", "deviceClassName": "gpu.nvidia.com"} for i in range(9)]),
     "spec.devices.requests[0].firstAvailable", "Too many: 9: must have at most 8 items"),
    (lambda d: d["requests"][0]["exactly"].update(tolerations=[{"operator": "Exists",
                                                                "value": "x"}]),
     "spec.devices.requests[0].exactly.tolerations[0].value",
     "must be empty when operator is Exists"),
    (lambda d: d["requests"][0]["exactly"].update(tolerations=[{"key": "k",
                                                                "effect": "Sometimes"}]),
     "spec.devices.requests[0].exactly.tolerations[0].effect", "Unsupported value"),
    (lambda d: d.update(constraints=[{"requests": ["gpu", "nope"],
                                      "matchAttribute": "gpu.nvidia.com/parentUUID"}]),
     "spec.devices.constraints[0].requests[1]", "must be the name of a request"),
    (lambda d: d.update(constraints=[{"matchAttribute": "parentUUID"}]),
     "spec.devices.constraints[0].matchAttribute", "must include a domain"),
    (lambda d: d.update(constraints=[{"matchAttribute": "gpu.nvidia.com/parentUUI"}]),
     "spec.devices.constraints[0].matchAttribute", "did you mean 'gpu.nvidia.com/parentUUID'?"),
    (lambda d: d.update(constraints=[{}]), "spec.devices.constraints[0]",
     "exactly one of matchAttribute or distinctAttribute"),
    (lambda d: d.update(config=[{"requests": ["gpu"], "opaque": {"driver": DRIVER}}]),
     "spec.devices.config[0].opaque.parameters", "Required value"),
    (lambda d: d.update(config=[{"requests": ["nope"], "opaque": {
        "driver": DRIVER, "parameters": {}}}]),
     "spec.devices.config[0].requests[0]", "must be the name of a request"),
])
def test_structure(mutate, path, message):
    found = bad(mutate)
    assert any(p == path and message in m for p, m in found), found


def test_subrequests_may_be_named_in_constraints_and_configs():
    obj = claim({"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.nvidia.com"},
        {"name": "small", "deviceClassName": "mig.nvidia.com", "count": 2}]},
        constraints=[{"requests": ["gpu/small"], "matchAttribute": "gpu.nvidia.com/parentUUID"}],
        config=[{"requests": ["gpu/big"], "opaque": {"driver": "other.example.com",
                                                     "parameters": {"a": 1}}}])
    assert problems(obj) == []


def test_opaque_configs_for_this_driver_are_validated():
    pytest.importorskip("gpudra.api.configs")
    obj = claim(request("gpu"), config=[{"opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "Bogus"}}}}])
    ((path, message),) = problems(obj)
    assert path == "spec.devices.config[0].opaque.parameters.sharing.strategy"
    assert "TimeSlicing" in message


def test_device_class_checks():
    good = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "gpu.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression": f"{A}.type == 'gpu'"}}]}}
    assert problems(good) == []
    broken = copy.deepcopy(good)
    broken["metadata"]["name"] = "GPU"
    broken["spec"]["selectors"].append({"cel": {"expression": f"{A}.typ == 'gpu'"}})
    broken["spec"]["config"] = [{"requests": ["x"], "opaque": {"driver": DRIVER,
                                                                "parameters": []}}]
    paths = [p for p, _ in problems(broken)]
    assert paths == ["metadata.name", "spec.selectors[1].cel.expression", "spec.config[0].requests",
                     "spec.config[0].opaque.parameters"]


def test_templates_and_pods():
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "t"},
                "spec": {"spec": {"devices": {"requests": [request("gpu", f"{A}.x == 1")]}}}}
    assert [p for p, _ in problems(template)] == [
        "spec.spec.devices.requests[0].exactly.selectors[0].cel.expression"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"},
                                       {"name": "gpu"}]}}
    assert problems(pod) == [
        ("spec.resourceClaims[1].name", "Duplicate value: 'gpu'"),
        ("spec.resourceClaims[1]", "Invalid value: exactly one of resourceClaimName or "
                                   "resourceClaimTemplateName is required")]
    deployment = {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {
        "spec": {"resourceClaims": [{"name": "Bad_Name", "resourceClaimName": "c"}]}}}}
    assert [p for p, _ in problems(deployment)] == ["spec.template.spec.resourceClaims[0].name"]


def test_lists_are_flattened():
    docs = [None, {"kind": "List", "items": [claim(request("a")), claim(request("b"))]}]
    assert len(list(objects(docs))) == 2


def test_capacity_requests_are_checked_against_the_class_and_the_shared_policies():
    def claim_with(device_class: str, **requests: str) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "c", "namespace": "default"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": device_class,
                    "capacity": {"requests": requests}}}]}}}

    def messages(obj: dict[str, Any]) -> list[str]:
        return [f"{p.path}: {p.message}" for p in validate_object(obj, driver="gpu.nvidia.com")]

    assert messages(claim_with("gpu-share.nvidia.com", memory="20Gi", multiprocessors="33",
                               shares="1")) == []
    path = "spec.devices.requests[0].exactly.capacity.requests"
    (bandwidth,) = messages(claim_with("gpu-share.nvidia.com", bandwidth="1"))
    assert bandwidth.startswith(f"{path}[bandwidth]: Invalid value: 'bandwidth': shared GPUs "
                                "publish no such capacity (they publish memory, "
                                "multiprocessors, shares)")
    (shares,) = messages(claim_with("gpu-share.nvidia.com", shares="17"))
    assert shares == f"{path}[shares]: Invalid value: 17: a shared GPU has 16 shares"
    (half,) = messages(claim_with("gpu-share.nvidia.com", multiprocessors="0.5"))
    assert "whole units of at least 1" in half
    (whole,) = messages(claim_with("gpu.nvidia.com", memory="40Gi"))
    assert "hands out whole devices" in whole and "gpu-share.nvidia.com" in whole
    (unknown,) = messages(claim_with("gpu.nvidia.com", bandwidth="1"))
    assert "publishes no such capacity" in unknown

"""NVIDIA's values files install gpudra's chart, each value keeping its meaning or named as ignored.

Two files in ``data/``: NVIDIA's own default ``values.yaml`` (its source and commit in the
header) and a customised one as an admin with the GPU Operator writes it. Both are rendered by
Helm's engine (helm-python-sdk, with values.schema.json), every object is validated against
Kubernetes' schema, the daemon's flags are parsed by ``gpudra node``'s own parser, and each
NVIDIA key is either followed to where it takes effect or named in the install notes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_chart import (
    APP_VERSION,
    CHART,
    NAMESPACE,
    SCHEMA_VERSION,
    container,
    daemon,
    gpu_daemonset,
    helm,
    notes,
    objects,
    of_kind,
    one,
    render_error,
    validate,
)

DATA = Path(__file__).parent / "data"
DEFAULTS: dict[str, Any] = yaml.safe_load((DATA / "nvidia-values.yaml").read_text())
CUSTOM: dict[str, Any] = yaml.safe_load((DATA / "nvidia-values-custom.yaml").read_text())
FILES = {"nvidia-default": DEFAULTS, "nvidia-custom": CUSTOM}
OUR_IMAGE = "ghcr.io/gpudra/gpudra"

# Every key of NVIDIA's chart that gpudra gives the same meaning; each is followed to its
# effect by a test below. A key (or a key under one of these) not listed here must be named
# as ignored in the install notes.
MAPPED = (
    "nvidiaDriverRoot", "nvidiaCDIHookPath", "nameOverride", "fullnameOverride",
    "namespaceOverride", "allowDefaultNamespace", "resourceApiVersion", "imagePullSecrets",
    "image.pullPolicy", "serviceAccount", "resources.gpus.enabled", "featureGates",
    "logVerbosity", "webhook.enabled",
    "kubeletPlugin.priorityClassName", "kubeletPlugin.updateStrategy",
    "kubeletPlugin.podAnnotations", "kubeletPlugin.podSecurityContext",
    "kubeletPlugin.nodeSelector", "kubeletPlugin.tolerations", "kubeletPlugin.affinity",
    "kubeletPlugin.kubeletRegistrarDirectoryPath", "kubeletPlugin.kubeletPluginsDirectoryPath",
    "kubeletPlugin.containers.gpus.env", "kubeletPlugin.containers.gpus.resources",
    "kubeletPlugin.containers.gpus.securityContext", "kubeletPlugin.containers.init.resources",
    # gpudra's computeDomains.*: the IMEX mode and isolation are what gpudra does
    "resources.computeDomains.enabled", "resources.computeDomains.imex.mode",
    "resources.computeDomains.imex.isolation", "controller.replicas", "controller.nodeSelector",
    "controller.tolerations", "controller.containers.computeDomain.resources",
    # the daemon's HTTP port; NVIDIA's path is gpudra's (/metrics)
    "kubeletPlugin.metrics.gpuHttpEndpoint", "kubeletPlugin.metrics.metricsPath",
)
# Mapped only when they name gpudra's own image; NVIDIA's image is replaced (and named).
IMAGE_KEYS = ("image.repository", "image.tag")


def _leaf_paths(values: Any, prefix: str = "") -> list[str]:
    if isinstance(values, dict) and values:
        return [p for key, value in values.items()
                for p in _leaf_paths(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")]


def _is_mapped(path: str) -> bool:
    return any(path == key or path.startswith(f"{key}.") for key in MAPPED)


def _ignored_section(text: str) -> str:
    head = "WARNING: values of NVIDIA's chart that gpudra ignores"
    assert head in text, text
    return text.split(head, 1)[1].split("\n\n", 1)[0]


def _named(section: str) -> set[str]:
    """The key paths the notes' ignored list names (wrapped, comma-separated)."""
    keys: set[str] = set()
    for line in section.splitlines():
        stripped = line.strip()
        if line.startswith("      ") and stripped:
            keys |= {k.strip() for k in stripped.split(",") if k.strip()}
    return keys


def _args(values: dict[str, Any]) -> argparse.Namespace:
    from gpudra.cli.main import build_parser

    args = [a.replace("$(NODE_NAME)", "node-1").replace("$(POD_UID)", "uid-1")
            for a in container(values)["args"]]
    try:
        return build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"gpudra node refuses the chart's args: {args}")


# --- both files install -----------------------------------------------------------------------

def _nonzero(value: Any) -> bool:
    return str(value if value is not None else 0) not in ("0", "0%")


def _daemonset_rules(obj: dict[str, Any]) -> None:
    """What the API server checks beyond the schema (apps validation of a DaemonSet's
    rolling update): exactly one of maxSurge and maxUnavailable is non-zero."""
    rolling = obj["spec"].get("updateStrategy", {}).get("rollingUpdate") or {}
    assert _nonzero(rolling.get("maxSurge")) != _nonzero(rolling.get("maxUnavailable")), rolling


@pytest.mark.parametrize("name", sorted(FILES))
def test_nvidia_values_render_to_valid_kubernetes(name):
    """No schema failure, and every object passes Kubernetes' strict schema (and the
    DaemonSet the API server's rolling-update rule)."""
    objs = objects(FILES[name])
    assert {"DaemonSet", "ClusterRole", "ClusterRoleBinding", "ServiceAccount",
            "DeviceClass"} <= {o["kind"] for o in objs}
    for obj in objs:
        validate(obj)
    for ds in of_kind(objs, "DaemonSet"):
        _daemonset_rules(ds)


def test_nvidias_max_unavailable_replaces_without_a_surge():
    """NVIDIA's maxUnavailable "100%" beside the chart's maxSurge 1 is a DaemonSet the API
    server refuses: the surge goes, and the notes say what that costs."""
    strategy = gpu_daemonset(objects(DEFAULTS))["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}}
    assert "replaced without a surge" in notes(DEFAULTS)
    default = gpu_daemonset(objects())
    assert default["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1,
                                                                  "maxUnavailable": 0}
    _daemonset_rules(default)
    assert "without a surge" not in notes()
    one_at_a_time = {"kubeletPlugin": {"updateStrategy": {"rollingUpdate": {
        "maxSurge": 0, "maxUnavailable": 1}}}}
    for ds in of_kind(objects(one_at_a_time), "DaemonSet"):
        _daemonset_rules(ds)
    assert "without a surge" not in notes(one_at_a_time)  # nothing was dropped


@pytest.mark.parametrize(("name", "kube"), [("nvidia-default", f"v{SCHEMA_VERSION}"),
                                          # pins resource.k8s.io/v1beta2: a 1.33 cluster's
                                          ("nvidia-custom", "v1.33.0")])
def test_nvidia_values_pass_helm_lint(name, kube):
    report = helm.lint(CHART, FILES[name], strict=True, namespace=NAMESPACE, kube_version=kube)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize("name", sorted(FILES))
def test_the_daemon_accepts_the_rendered_flags_and_gates(name):
    from gpudra.driver.featuregates import parse_feature_gates

    args = _args(FILES[name])
    assert args.command == "node"
    parse_feature_gates(args.feature_gates)  # raises on a gate the daemon would exit on


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_nvidia_key_is_mapped_or_named_as_ignored(name):
    values = FILES[name]
    named = _named(_ignored_section(notes(values)))
    for path in _leaf_paths(values):
        if path in IMAGE_KEYS:
            continue
        if _is_mapped(path):
            assert path not in named, f"{path} is mapped, yet named as ignored"
        else:
            assert path in named, f"{path}: neither mapped nor named as ignored"
    assert {"image.repository", "image.tag"} & set(_leaf_paths(values)) <= named


def test_nvidia_keys_are_not_named_when_absent():
    assert "gpudra ignores" not in notes()
    assert "NVIDIA's name" not in notes()


# --- the default file keeps gpudra's behaviour where NVIDIA's default means the same ---------

def test_nvidia_defaults_keep_the_driver_root_log_level_and_image():
    c = container(DEFAULTS)
    assert "--host-driver-root=/" in c["args"]
    assert "--log-level=info" in c["args"]  # klog verbosity 4: no request detail
    # "": the chart copies the image's nvidia-cdi-hook to the host and names that copy.
    assert "--cdi-hook-path=/var/lib/kubelet/plugins/gpu.nvidia.com/bin/nvidia-cdi-hook" in \
        c["args"]
    assert c["image"].startswith(f"{OUR_IMAGE}:")
    assert c["securityContext"]["privileged"] is True
    assert c["securityContext"]["runAsUser"] == 0  # NVIDIA's {privileged: true} on our image
    section = _ignored_section(notes(DEFAULTS))
    assert "ComputeDomain" in section and "resources.computeDomains.imex.hostSocketPath" in section
    assert "controller.leaderElection.enabled" in section and "webhook.tls.mode" in section


# --- the customised file: each value reaches what it means ------------------------------------

def test_driver_root_and_cdi_hook_reach_the_daemon():
    spec = daemon(CUSTOM, namespace="gpu-operator")
    args = _args(CUSTOM)
    assert str(args.host_driver_root) == "/run/nvidia/driver"
    assert str(args.cdi_hook_path) == "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["driver-root"]["hostPath"]["path"] == "/run/nvidia/driver"
    text = notes(CUSTOM)
    assert "nvidiaCDIHookPath is NVIDIA's name for cdiHookPath" in text
    assert "--set cdiHookPath=/usr/local/nvidia/toolkit/nvidia-cdi-hook" in text


def test_log_verbosity_reaches_the_log_level():
    assert _args(CUSTOM).log_level == "debug"
    assert "logVerbosity 6 (NVIDIA's klog verbosity) is logLevel debug" in notes(CUSTOM)


@pytest.mark.parametrize(("values", "level"), [
    ({"logVerbosity": "0"}, "info"),
    ({"logVerbosity": 5}, "info"),
    ({"logVerbosity": "6"}, "debug"),
    ({"logVerbosity": 7}, "debug"),
    ({"logVerbosity": "7", "logLevel": "warning"}, "warning"),  # gpudra's own value wins
    ({"logLevel": "error"}, "error"),
])
def test_log_verbosity_table(values, level):
    assert f"--log-level={level}" in container(values)["args"]


def test_resource_api_version_reaches_the_device_classes():
    objs = objects(CUSTOM, namespace="gpu-operator")
    assert {o["apiVersion"] for o in of_kind(objs, "DeviceClass")} == {"resource.k8s.io/v1beta2"}


@pytest.mark.parametrize(("asked", "api"), [
    (None, "resource.k8s.io/v1"), ("", "resource.k8s.io/v1"), ("auto", "resource.k8s.io/v1"),
    ("v1beta1", "resource.k8s.io/v1beta1"), ("resource.k8s.io/v1beta1", "resource.k8s.io/v1beta1"),
    ("v1beta2", "resource.k8s.io/v1beta2"), ("resource.k8s.io/v1", "resource.k8s.io/v1"),
])
def test_resource_api_version_forms(asked, api):
    values = {} if asked is None else {"resourceApiVersion": asked}
    classes = of_kind(objects(values), "DeviceClass")
    assert classes and {c["apiVersion"] for c in classes} == {api}
    for cls in classes:
        validate(cls)


def test_bad_resource_api_version_fails_the_schema():
    assert "resourceApiVersion" in render_error({"resourceApiVersion": "resource.k8s.io/v2"})


def test_namespace_service_account_and_pull_settings():
    objs = objects(CUSTOM, namespace="default")  # namespaceOverride makes default harmless
    ds = gpu_daemonset(objs)
    assert ds["metadata"]["namespace"] == "gpu-operator"
    account = one(objs, "ServiceAccount")
    assert account["metadata"]["name"] == "dra-gpu"
    assert account["metadata"]["annotations"] == {"team": "ml-platform"}
    spec = ds["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "dra-gpu"
    assert spec["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert spec["containers"][0]["imagePullPolicy"] == "Always"


def test_nvidias_image_is_replaced_by_gpudras_and_named():
    c = container(CUSTOM)
    assert c["image"] == f"{OUR_IMAGE}:{APP_VERSION}"
    assert "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu" in notes(CUSTOM)
    own = container({"image": {"repository": "registry.example.com/gpudra", "tag": "1.2"}})
    assert own["image"] == "registry.example.com/gpudra:1.2"


def test_scheduling_values_keep_their_meaning():
    spec = daemon(CUSTOM)
    plugin = CUSTOM["kubeletPlugin"]
    assert spec["priorityClassName"] == "gpu-node-critical"
    assert spec["nodeSelector"] == plugin["nodeSelector"]
    assert spec["tolerations"] == plugin["tolerations"]
    assert spec["affinity"] == plugin["affinity"]
    ds = gpu_daemonset(objects(CUSTOM))
    assert ds["spec"]["template"]["metadata"]["annotations"] == plugin["podAnnotations"]


def test_container_settings_reach_the_daemon_and_init_container():
    spec = daemon(CUSTOM)
    gpus = CUSTOM["kubeletPlugin"]["containers"]["gpus"]
    (plugin,) = spec["containers"]
    (init,) = spec["initContainers"]
    assert gpus["env"][0] in plugin["env"]
    assert plugin["resources"] == gpus["resources"]
    assert init["resources"] == CUSTOM["kubeletPlugin"]["containers"]["init"]["resources"]
    # NVIDIA's securityContext over gpudra's default: its SELinux type, and still root.
    for c in (plugin, init):
        assert c["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}
        assert c["securityContext"]["privileged"] is True
        assert c["securityContext"]["runAsUser"] == 0
    mounts = {m["name"]: m for m in plugin["volumeMounts"]}
    assert mounts["plugins"]["mountPropagation"] == "Bidirectional"


def test_an_unprivileged_nvidia_security_context_drops_bidirectional_propagation():
    """Only a privileged container may use Bidirectional propagation (the API refuses it)."""
    values = {"kubeletPlugin": {"containers": {"gpus": {"securityContext": {
        "privileged": False}}}}}
    c = container(values)
    assert c["securityContext"]["privileged"] is False
    assert "mountPropagation" not in {m["name"]: m for m in c["volumeMounts"]}["plugins"]
    validate(gpu_daemonset(objects(values)))


def test_gpudra_values_win_over_nvidias_container_values():
    values = {"kubeletPlugin": {"securityContext": {"privileged": True, "runAsUser": 0},
                                "extraEnv": [{"name": "A", "value": "1"}],
                                "containers": {"gpus": {
                                    "securityContext": {"seLinuxOptions": {"type": "x"}},
                                    "env": [{"name": "B", "value": "2"}]}}}}
    c = container(values)
    assert c["securityContext"] == {"privileged": True, "runAsUser": 0}
    names = [e["name"] for e in c["env"]]
    assert names.index("A") < names.index("B")  # both, gpudra's first


def test_feature_gates_keep_their_meaning():
    from gpudra.driver.featuregates import parse_feature_gates

    gates = parse_feature_gates(_args(CUSTOM).feature_gates)
    assert gates.enabled("DeviceHealthCheck") and gates.enabled("DynamicMIG")
    assert any("DRAListTypeAttributes is ignored" in n for n in gates.notes)


# Every gate of NVIDIA's driver (pkg/featuregates in kubernetes-sigs/dra-driver-nvidia-gpu).
NVIDIA_GATES = ("TimeSlicingSettings", "MPSSupport", "IMEXDaemonsWithDNSNames",
                "PassthroughSupport", "NVMLDeviceHealthCheck", "DynamicMIG",
                "ComputeDomainCliques", "CrashOnNVLinkFabricErrors", "DeviceMetadata",
                "FabricManagerPartitioning", "HostManagedIMEXDaemon", "DRAListTypeAttributes",
                "ConsumableShares")


@pytest.mark.parametrize("gate", NVIDIA_GATES)
def test_every_nvidia_gate_name_installs(gate):
    from gpudra.driver.featuregates import parse_feature_gates

    args = container({"featureGates": {gate: False}})["args"]
    (flag,) = [a for a in args if a.startswith("--feature-gates=")]
    parse_feature_gates(flag.split("=", 1)[1])


def test_webhook_maps_to_the_opaque_config_policy():
    policies = [o["metadata"]["name"] for o in
                of_kind(objects(CUSTOM), "ValidatingAdmissionPolicy")]
    assert "gpudra-opaque-configs" in policies
    text = notes(CUSTOM)
    assert "gpudra checks them with a\nValidatingAdmissionPolicy" in text
    off = {"webhook": {"enabled": True}, "validatingAdmissionPolicy": {"opaqueConfigs": False}}
    assert "WARNING: webhook.enabled=true asks for opaque configs" in notes(off)


def test_nvidia_and_gpudra_names_that_disagree_fail():
    assert "disagree" in render_error({"nvidiaCDIHookPath": "/a/nvidia-cdi-hook",
                                       "cdiHookPath": "/b/nvidia-cdi-hook"})
    agree = container({"nvidiaCDIHookPath": "/a/hook", "cdiHookPath": "/a/hook"})
    assert "--cdi-hook-path=/a/hook" in agree["args"]


def _controller(values: dict[str, Any]) -> dict[str, Any] | None:
    found = [o for o in of_kind(objects(values), "Deployment")
             if o["metadata"]["name"].endswith("compute-domain-controller")]
    return found[0] if found else None


def test_compute_domains_map_to_gpudras():
    """NVIDIA's default turns its ComputeDomain components on: so does it gpudra's."""
    assert _controller({}) is None
    assert _controller(CUSTOM) is None  # resources.computeDomains.enabled: false
    objs = objects(DEFAULTS)
    assert one(objs, "CustomResourceDefinition")["metadata"]["name"] == \
        "computedomains.resource.nvidia.com"
    values = {"resources": {"computeDomains": {"enabled": True}},
              "controller": {"replicas": 3, "nodeSelector": {"pool": "system"},
                             "tolerations": [{"key": "CriticalAddonsOnly",
                                              "operator": "Exists"}],
                             "containers": {"computeDomain": {"resources": {
                                 "requests": {"cpu": "1"}}}}}}
    deployment = _controller(values)
    assert deployment is not None
    spec = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 3
    assert spec["nodeSelector"] == {"pool": "system"}
    assert spec["tolerations"] == values["controller"]["tolerations"]
    assert spec["containers"][0]["resources"] == {"requests": {"cpu": "1"}}
    assert "gpudra ignores" not in notes(values)
    for obj in objects(values):
        validate(obj)
    # gpudra's own values win where they are set.
    ours = {**values, "computeDomains": {"controller": {"replicas": 2}}}
    mine = _controller(ours)
    assert mine is not None and mine["spec"]["replicas"] == 2
    host = {"resources": {"computeDomains": {"enabled": True, "imex": {
        "mode": "hostManaged", "hostSocketPath": "/run/imex.sock"}}}}
    named = _named(_ignored_section(notes(host)))
    assert {"resources.computeDomains.imex.mode",
            "resources.computeDomains.imex.hostSocketPath"} <= named


def _ports(values: dict[str, Any]) -> tuple[str | None, int, int]:
    objs = objects(values)
    (c,) = gpu_daemonset(objs)["spec"]["template"]["spec"]["containers"]
    address = next((a for a in c["args"] if a.startswith("--http-address=")), None)
    (service_port,) = one(objs, "Service")["spec"]["ports"]
    return address, c["ports"][0]["containerPort"], service_port["port"]


def test_the_gpu_plugins_metrics_endpoint_is_the_metrics_port():
    assert _ports({}) == ("--http-address=0.0.0.0:8080", 8080, 8080)
    nvidia = {"kubeletPlugin": {"metrics": {"gpuHttpEndpoint": ":9400",
                                            "metricsPath": "/metrics"}}}
    assert _ports(nvidia) == ("--http-address=0.0.0.0:9400", 9400, 9400)
    assert "port 9400 of each daemon pod" in notes(nvidia)
    assert "gpudra ignores" not in notes(nvidia)
    ours = {**nvidia, "metrics": {"port": 9100}}  # gpudra's own value wins
    assert _ports(ours) == ("--http-address=0.0.0.0:9100", 9100, 9100)
    other_path = {"kubeletPlugin": {"metrics": {"metricsPath": "/m", "enabled": False}}}
    assert {"kubeletPlugin.metrics.metricsPath", "kubeletPlugin.metrics.enabled"} <= \
        _named(_ignored_section(notes(other_path)))

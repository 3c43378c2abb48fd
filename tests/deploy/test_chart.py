"""The Helm chart, rendered by Helm's own Go engine and checked against Kubernetes' schemas.

helm-python-sdk binds Helm's Go library (no helm binary), so these renders run the same
template engine, values coalescing and values.schema.json check as ``helm install``. Every
rendered object is validated with kubernetes-validate against the newest Kubernetes schema it
ships, in strict mode (unknown fields are errors). The ValidatingAdmissionPolicy's CEL is
evaluated with cel-python against the requests it must allow and refuse.

Each values combination renders once per session (renders are cached by values).
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip(
    "helm_python", reason="helm-python-sdk (dev extra) renders the chart with Helm's engine")
kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate (dev extra) holds the Kubernetes schemas")
celpy = pytest.importorskip("celpy", reason="cel-python evaluates the admission policy")
jsonschema = pytest.importorskip("jsonschema", reason="installed with kubernetes-validate")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpudra"
DEVICECLASS_FILES = ROOT / "deploy" / "deviceclasses"
NAMESPACE = "gpudra-system"
RELEASE = "gpudra"
SCHEMA_VERSION = kubernetes_validate.latest_version()
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "DeviceClass",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}

# ServiceMonitor is a Prometheus Operator CRD, for which kubernetes-validate ships no schema:
# it is held to this strict subset of the CRD's schema (the fields the chart writes).
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object", "additionalProperties": False, "required": ["name", "namespace"],
            "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                           "labels": {"type": "object",
                                      "additionalProperties": {"type": "string"}}}},
        "spec": {
            "type": "object", "additionalProperties": False, "required": ["selector", "endpoints"],
            "properties": {
                "selector": {"type": "object", "additionalProperties": False,
                             "properties": {"matchLabels": {"type": "object"}}},
                "namespaceSelector": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"any": {"type": "boolean"},
                                   "matchNames": {"type": "array",
                                                  "items": {"type": "string"}}}},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False,
                    "properties": {
                        "port": {"type": "string"}, "path": {"type": "string"},
                        "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                        "relabelings": {"type": "array", "items": {
                            "type": "object", "additionalProperties": False,
                            "properties": {"sourceLabels": {"type": "array"},
                                           "targetLabel": {"type": "string"}}}}}}},
            }},
    },
}

# PrometheusRule is a CRD too: held to the subset of its schema the chart writes.
PROMETHEUS_RULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": SERVICE_MONITOR_SCHEMA["properties"]["metadata"],
        "spec": {
            "type": "object", "additionalProperties": False, "required": ["groups"],
            "properties": {"groups": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False, "required": ["name", "rules"],
                "properties": {"name": {"type": "string"}, "rules": {"type": "array", "items": {
                    "type": "object", "additionalProperties": False,
                    "required": ["alert", "expr"],
                    "properties": {
                        "alert": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                        "expr": {"type": "string", "minLength": 1},
                        "for": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h|d)$"},
                        "labels": {"type": "object",
                                   "additionalProperties": {"type": "string"}},
                        "annotations": {"type": "object",
                                        "additionalProperties": {"type": "string"}}}}}}}}},
        },
    },
}


# --- rendering ------------------------------------------------------------------------------

@functools.cache
def _render(values_json: str, namespace: str, release: str) -> dict[str, str]:
    with helm.Chart.load(CHART) as chart:
        return chart.render(json.loads(values_json), name=release, namespace=namespace)


def render(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE,
           release: str = RELEASE) -> dict[str, str]:
    """Template path -> rendered text, for ``helm install <release> -n <namespace>``."""
    return _render(json.dumps(values or {}, sort_keys=True), namespace, release)


def objects(values: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    manifests = render(values, **kwargs)
    return [doc for path, text in sorted(manifests.items()) if not path.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]


def notes(values: dict[str, Any] | None = None, **kwargs: Any) -> str:
    return render(values, **kwargs)[f"{CHART.name}/templates/NOTES.txt"]


def render_error(values: dict[str, Any] | None = None, **kwargs: Any) -> str:
    with pytest.raises(helm.HelmError) as failure:
        render(values, **kwargs)
    return str(failure.value)


def of_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objs if obj["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(objs, kind)
    assert len(found) == 1, f"want one {kind}, got {len(found)}"
    return found[0]


def gpu_daemonset(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The GPU node daemon's DaemonSet (with computeDomains.enabled there is a second one,
    compute-domain-node's)."""
    (found,) = [o for o in of_kind(objs, "DaemonSet") if o["spec"]["selector"]["matchLabels"]
                .get("app.kubernetes.io/component") == "kubelet-plugin"]
    return found


def daemon(values: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    """The node daemon's pod spec."""
    spec: dict[str, Any] = gpu_daemonset(objects(values, **kwargs))["spec"]["template"]["spec"]
    return spec


def container(values: dict[str, Any] | None = None) -> dict[str, Any]:
    (only,) = daemon(values)["containers"]
    return only


def validate(obj: dict[str, Any]) -> None:
    if obj["kind"] == "ServiceMonitor":
        jsonschema.validate(obj, SERVICE_MONITOR_SCHEMA)
        return
    if obj["kind"] == "PrometheusRule":
        jsonschema.validate(obj, PROMETHEUS_RULE_SCHEMA)
        return
    kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)


# --- every combination renders to valid objects ---------------------------------------------

SIMULATE = {"simulate": {"profile": "dgx-a100"}}
VAP_OFF = {"validatingAdmissionPolicy": {"enabled": False}}
SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "simulate": SIMULATE,
    "vap-off": VAP_OFF,
    "simulate-vap-off": {**SIMULATE, **VAP_OFF},
    "extended-resource": {"deviceClasses": {"gpu": {"extendedResourceName": "nvidia.com/gpu"}}},
    "custom-driver": {"driverName": "gpu.example.com",
                      "deviceClasses": {"gpu": {"name": "gpu.example.com"},
                                        "mig": {"name": "mig.example.com"},
                                        "share": {"name": "gpu-share.example.com"},
                                        "vfio": {"name": "vfio.gpu.example.com"}}},
    "feature-gates": {"featureGates": {"DynamicMIG": False, "MPSSupport": True}},
    "metrics-service-off": {"metrics": {"service": {"enabled": False}}},
    "service-monitor": {"metrics": {"serviceMonitor": {"enabled": True,
                                                       "labels": {"release": "prom"}}}},
    "observability": {"metrics": {"serviceMonitor": {"enabled": True},
                                  "grafanaDashboard": {"enabled": True,
                                                       "annotations": {"grafana_folder": "GPUs"}},
                                  "prometheusRule": {"enabled": True,
                                                     "labels": {"release": "prom"},
                                                     "claimIdleSeconds": 3600}}},
    "no-deviceclasses": {"deviceClasses": {"share": {"enabled": False}, "gpu": {"enabled": False},
                                           "mig": {"enabled": False},
                                           "vfio": {"enabled": False}}},
    "existing-serviceaccount": {"serviceAccount": {"create": False, "name": "gpu-daemon"}},
    "operator-driver-root": {"driverRoot": "/run/nvidia/driver",
                             "cdiHookPath": "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
                             "kubeletPlugin": {"gpuNodeAffinity": False,
                                               "nodeSelector": {"gpu": "yes"},
                                               "waitForDriver": {"timeoutSeconds": 600}}},
    "gke": {"driverRoot": "/home/kubernetes/bin/nvidia", "devRoot": "/"},
    "no-wait-for-driver": {"kubeletPlugin": {"waitForDriver": {"enabled": False}}},
    "everything": {**SIMULATE, "driverName": "gpu.example.com",
                   "featureGates": {"TimeSlicingSettings": False},
                   "deviceClasses": {"gpu": {"name": "gpu.example.com",
                                             "extendedResourceName": "example.com/gpu"},
                                     "mig": {"name": "mig.example.com",
                                             "extendedResourceName": "example.com/mig"}},
                   "metrics": {"port": 9400, "serviceMonitor": {"enabled": True}},
                   "image": {"tag": "dev"}, "logLevel": "debug", "logFormat": "console"},
    # A values file written for NVIDIA's chart, with the names it uses where ours differ.
    "nvidia-values": {"nvidiaDriverRoot": "/run/nvidia/driver", "gpuResourcesEnabledOverride": True,
                      "resources": {"gpus": {"enabled": True},
                                    "computeDomains": {"enabled": False}},
                      "featureGates": {"NVMLDeviceHealthCheck": True, "TimeSlicingSettings": True,
                                       "IMEXDaemonsWithDNSNames": True,
                                       "ContextualLogging": True, "PassthroughSupport": False}},
    "extras": {"namespaceOverride": "gpu-ops", "allowWithDevicePlugin": True,
               "kubeletPlugin": {"extraArgs": ["--xid-quiet-period=600"],
                                 "extraEnv": [{"name": "TZ", "value": "UTC"}],
                                 "podSecurityContext": {"fsGroup": 0}}},
}


def _expected_kinds(values: dict[str, Any]) -> set[str]:
    kinds = {"DaemonSet", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service"}
    if values.get("serviceAccount", {}).get("create", True):
        kinds.add("ServiceAccount")
    if values.get("validatingAdmissionPolicy", {}).get("enabled", True):
        kinds |= {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    metrics = values.get("metrics", {})
    if metrics.get("serviceMonitor", {}).get("enabled"):
        kinds.add("ServiceMonitor")
    elif not metrics.get("service", {}).get("enabled", True):
        kinds.discard("Service")
    if metrics.get("grafanaDashboard", {}).get("enabled"):
        kinds.add("ConfigMap")
    if metrics.get("prometheusRule", {}).get("enabled"):
        kinds.add("PrometheusRule")
    classes = values.get("deviceClasses", {})
    if any(classes.get(key, {}).get("enabled", True) for key in ("gpu", "mig")):
        kinds.add("DeviceClass")
    return kinds


def test_schemas_are_the_newest_kubernetes_validate_ships():
    from packaging.version import Version

    assert Version(SCHEMA_VERSION) >= Version("1.37"), SCHEMA_VERSION


def test_the_validator_is_strict():
    """A field Kubernetes does not know must fail, or the validation below proves little."""
    bad = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
           "metadata": {"name": "x"}, "spec": {"selector": []}}
    with pytest.raises(kubernetes_validate.ValidationError, match="selector"):
        validate(bad)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_object_is_valid_kubernetes(scenario):
    values = SCENARIOS[scenario]
    objs = objects(values)
    for obj in objs:
        validate(obj)
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], obj["metadata"]["name"]
        else:
            assert obj["metadata"]["namespace"] == (
                values.get("namespaceOverride") or NAMESPACE), obj["kind"]
    assert {obj["kind"] for obj in objs} == _expected_kinds(values)
    names = [(obj["kind"], obj["metadata"]["name"]) for obj in objs]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("scenario", ["default", "simulate", "everything", "observability"])
def test_helm_lint_is_clean(scenario):
    report = helm.lint(CHART, SCENARIOS[scenario], strict=True, namespace=NAMESPACE,
                       kube_version=f"v{SCHEMA_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 2 warning, 3 error
    assert not report["errors"] and not problems, report


def test_chart_metadata():
    with helm.Chart.load(CHART) as chart:
        meta = chart.metadata
    assert meta["name"] == "gpudra"
    assert meta["kubeVersion"] == ">=1.34.0-0"
    assert meta["apiVersion"] == "v2"


# --- the node daemon ------------------------------------------------------------------------

DEFAULT_ARGS = [
    "node",
    "--node-name=$(NODE_NAME)",
    "--pod-uid=$(POD_UID)",
    "--mps-daemons=pod",
    f"--mps-image=ghcr.io/gpudra/gpudra:{APP_VERSION}",
    "--namespace=$(POD_NAMESPACE)",
    "--driver-name=gpu.nvidia.com",
    "--registrar-dir=/var/lib/kubelet/plugins_registry",
    "--plugins-dir=/var/lib/kubelet/plugins",
    "--cdi-root=/var/run/cdi",
    "--driver-root=/driver-root",
    "--host-driver-root=/",
    "--dev-root=/dev-root",
    "--host-dev-root=/",
    # The hook the install-cdi-hook init container copies to the host (no cdiHookPath).
    "--cdi-hook-path=/var/lib/kubelet/plugins/gpu.nvidia.com/bin/nvidia-cdi-hook",
    "--log-format=json",
    "--log-level=info",
    "--http-address=0.0.0.0:8080",
]


def test_daemon_command_and_flags():
    c = container()
    # tini as PID 1 reaps processes re-parented to the daemon (MPS servers)
    assert c["command"] == ["/usr/bin/tini", "--", "gpudra"]
    assert c["args"] == DEFAULT_ARGS
    assert c["image"] == f"ghcr.io/gpudra/gpudra:{APP_VERSION}"
    assert c["imagePullPolicy"] == "IfNotPresent"
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]
           if "valueFrom" in e}
    assert env == {"NODE_NAME": "spec.nodeName", "POD_UID": "metadata.uid",
                   "POD_NAMESPACE": "metadata.namespace"}


def test_simulation_adds_profile_and_state_under_the_plugin_dir():
    """No driver-root flags: the daemon writes a generated driver root of its own when
    simulating, which must not be the (read-only) host driver root."""
    args = container(SIMULATE)["args"]
    real_root = ["--driver-root=/driver-root", "--host-driver-root=/", "--dev-root=/dev-root",
                 "--host-dev-root=/",
                 "--cdi-hook-path=/var/lib/kubelet/plugins/gpu.nvidia.com/bin/nvidia-cdi-hook"]
    assert args == [*(a for a in DEFAULT_ARGS if a not in real_root), "--simulate=dgx-a100",
                    "--sim-state=/var/lib/kubelet/plugins/gpu.nvidia.com/sim"]


def test_values_reach_the_flags():
    args = container(SCENARIOS["everything"])["args"]
    assert "--driver-name=gpu.example.com" in args
    assert "--feature-gates=TimeSlicingSettings=false" in args
    assert "--log-level=debug" in args and "--log-format=console" in args
    assert "--http-address=0.0.0.0:9400" in args
    assert "--sim-state=/var/lib/kubelet/plugins/gpu.example.com/sim" in args
    assert container(SCENARIOS["everything"])["image"] == "ghcr.io/gpudra/gpudra:dev"
    assert "--host-driver-root=/run/nvidia/driver" in container(
        SCENARIOS["operator-driver-root"])["args"]


def test_feature_gates_render_sorted_and_only_when_set():
    assert "--feature-gates=DynamicMIG=false,MPSSupport=true" in container(
        SCENARIOS["feature-gates"])["args"]
    assert not any(a.startswith("--feature-gates") for a in container()["args"])


def _daemon_args(scenario: str) -> argparse.Namespace:
    """The rendered args as ``gpudra node`` parses them (the kubelet expands $(VAR))."""
    from gpudra.cli.main import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert "node" in commands.choices
    args = [a.replace("$(NODE_NAME)", "node-1").replace(
        "$(POD_UID)", "0b7f3c52-5f0e-4c0e-9a55-6c1d3b2a1f00")
        for a in container(SCENARIOS[scenario])["args"]]
    try:
        return parser.parse_args(args)
    except SystemExit:
        pytest.fail(f"gpudra node refuses the chart's args ({scenario}): {args}")


@pytest.mark.parametrize("scenario", ["default", "simulate", "everything", "feature-gates",
                                      "operator-driver-root", "gke", "nvidia-values",
                                      "extras"])
def test_rendered_flags_parse_with_the_daemons_own_parser(scenario):
    """The chart and ``gpudra node`` must agree on every flag name and value."""
    args = _daemon_args(scenario)
    assert args.command == "node" and args.node_name == "node-1" and args.pod_uid
    assert args.http_address.startswith("0.0.0.0:")  # probes come from the kubelet, not lo
    if SCENARIOS[scenario].get("simulate"):
        assert args.driver_root is None and args.host_driver_root is None
        assert args.simulate == "dgx-a100"
        assert Path(args.sim_state) == Path(args.plugins_dir) / args.driver_name / "sim"
    else:
        assert Path(args.driver_root) == Path("/driver-root")
        assert Path(args.dev_root) == Path("/dev-root")
        assert args.simulate is None


def test_host_mounts():
    spec = daemon()
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts["plugins-registry"] == {"name": "plugins-registry",
                                          "mountPath": "/var/lib/kubelet/plugins_registry"}
    assert mounts["plugins"] == {"name": "plugins", "mountPath": "/var/lib/kubelet/plugins",
                                 "mountPropagation": "Bidirectional"}
    assert mounts["cdi"] == {"name": "cdi", "mountPath": "/var/run/cdi"}
    assert mounts["driver-root"] == {"name": "driver-root", "mountPath": "/driver-root",
                                     "readOnly": True, "mountPropagation": "HostToContainer"}
    assert volumes["plugins-registry"]["hostPath"] == {
        "path": "/var/lib/kubelet/plugins_registry", "type": "Directory"}
    assert volumes["plugins"]["hostPath"] == {"path": "/var/lib/kubelet/plugins",
                                              "type": "Directory"}
    assert volumes["cdi"]["hostPath"] == {"path": "/var/run/cdi", "type": "DirectoryOrCreate"}
    assert volumes["driver-root"]["hostPath"] == {"path": "/", "type": "Directory"}
    assert "emptyDir" in volumes["tmp"]
    assert set(mounts) == set(volumes)
    simulated = daemon(SIMULATE)
    assert "driver-root" not in {v["name"] for v in simulated["volumes"]}
    assert "driver-root" not in {m["name"] for m in simulated["containers"][0]["volumeMounts"]}
    operator = daemon(SCENARIOS["operator-driver-root"])
    assert {v["name"]: v for v in operator["volumes"]}["driver-root"]["hostPath"]["path"] == \
        "/run/nvidia/driver"
    # The host's device nodes and /proc, live: the container's own /dev is a snapshot.
    for name, path in (("dev-root-dev", "/dev-root/dev"), ("dev-root-proc", "/dev-root/proc")):
        assert mounts[name] == {"name": name, "mountPath": path, "readOnly": True,
                                "mountPropagation": "HostToContainer"}
    assert volumes["dev-root-dev"]["hostPath"] == {"path": "/dev", "type": "Directory"}
    assert volumes["dev-root-proc"]["hostPath"] == {"path": "/proc", "type": "Directory"}
    assert "dev-root-dev" not in {v["name"] for v in simulated["volumes"]}


def test_init_container_waits_for_the_driver():
    """`gpudra wait-for-driver` with the plugin's view of both roots, before the daemon."""
    spec = daemon()
    init = {c["name"]: c for c in spec["initContainers"]}["wait-for-driver"]
    plugin = spec["containers"][0]
    assert init["image"] == plugin["image"]
    assert init["command"] == ["gpudra"]
    assert init["args"] == ["wait-for-driver", "--driver-root=/driver-root",
                            "--dev-root=/dev-root", "--timeout=0", "--log-format=json"]
    # Privileged like the daemon, and the same mounts of the driver and device roots.
    assert init["securityContext"] == plugin["securityContext"]
    plugin_mounts = {m["name"]: m for m in plugin["volumeMounts"]}
    assert [m["name"] for m in init["volumeMounts"]] == [
        "driver-root", "dev-root-dev", "dev-root-proc"]
    assert all(m == plugin_mounts[m["name"]] for m in init["volumeMounts"])
    operator = daemon(SCENARIOS["operator-driver-root"])
    assert "--timeout=600" in operator["initContainers"][0]["args"]
    assert "initContainers" not in daemon(SIMULATE)
    assert [c["name"] for c in daemon(SCENARIOS["no-wait-for-driver"])["initContainers"]] == [
        "install-cdi-hook"]


def test_init_container_args_parse_with_the_cli():
    from gpudra.cli.main import build_parser

    (init,) = daemon(SCENARIOS["operator-driver-root"])["initContainers"]
    args = build_parser("wait-for-driver").parse_args(init["args"])
    assert (args.driver_root, args.dev_root, args.timeout) == (
        Path("/driver-root"), Path("/dev-root"), "600")


def test_device_root_and_hook_path_reach_the_flags():
    args = container(SCENARIOS["operator-driver-root"])["args"]
    assert "--cdi-hook-path=/usr/local/nvidia/toolkit/nvidia-cdi-hook" in args
    assert "--cdi-hook-path=/var/lib/kubelet/plugins/gpu.nvidia.com/bin/nvidia-cdi-hook" in \
        container()["args"]  # the chart's copy of the image's hook
    gke = daemon(SCENARIOS["gke"])
    assert "--host-driver-root=/home/kubernetes/bin/nvidia" in gke["containers"][0]["args"]
    assert "--host-dev-root=/" in gke["containers"][0]["args"]
    custom = daemon({"devRoot": "/run/nvidia/driver/"})
    assert {v["name"]: v for v in custom["volumes"]}["dev-root-dev"]["hostPath"]["path"] == \
        "/run/nvidia/driver/dev"
    assert "--host-dev-root=/run/nvidia/driver/" in custom["containers"][0]["args"]


def test_rollout_priority_and_probes():
    ds = one(objects(), "DaemonSet")
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    spec = ds["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["serviceAccountName"] == "gpudra"
    assert "hostNetwork" not in spec  # old and new pod must both bind the metrics port
    c = spec["containers"][0]
    assert c["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()


def test_privileged_on_real_gpus():
    c = container()
    assert c["securityContext"] == {"privileged": True, "runAsUser": 0, "runAsGroup": 0,
                                    "runAsNonRoot": False}


def test_locked_down_when_simulating():
    c = container(SIMULATE)
    assert c["securityContext"] == {
        "privileged": False, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]}, "runAsUser": 0, "runAsGroup": 0,
        "runAsNonRoot": False, "seccompProfile": {"type": "RuntimeDefault"}}
    # The apiserver allows Bidirectional propagation only in privileged containers.
    plugins = {m["name"]: m for m in c["volumeMounts"]}["plugins"]
    assert "mountPropagation" not in plugins


def test_security_context_override_replaces_the_default():
    override = {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}
    c = container({**SIMULATE, "kubeletPlugin": {"securityContext": override}})
    assert c["securityContext"] == override
    assert {m["name"]: m for m in c["volumeMounts"]}["plugins"]["mountPropagation"] == \
        "Bidirectional"


GPU_LABELS = ["feature.node.kubernetes.io/pci-10de.present",
              "feature.node.kubernetes.io/pci-0302_10de.present",  # NFD, by PCI class
              "feature.node.kubernetes.io/pci-0300_10de.present",
              "nvidia.com/gpu.present"]
NO_DEVICE_PLUGIN = {"key": "nvidia.com/gpu.deploy.device-plugin", "operator": "NotIn",
                    "values": ["true"]}
GPU_NODE_TERMS = [
    {"matchExpressions": [{"key": key, "operator": "In", "values": ["true"]}, NO_DEVICE_PLUGIN]}
    for key in GPU_LABELS]
"""The default: a node with an NVIDIA GPU (any label), where NVIDIA's device plugin is not."""


def _terms(spec: dict[str, Any]) -> Any:
    return spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]


def test_scheduling_targets_gpu_nodes_by_default():
    spec = daemon()
    assert _terms(spec) == GPU_NODE_TERMS
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists",
                                    "effect": "NoSchedule"}]
    assert "nodeSelector" not in spec


def test_scheduling_overrides():
    assert "affinity" not in daemon(SIMULATE)
    assert _terms(daemon({**SIMULATE, "kubeletPlugin": {"gpuNodeAffinity": True}})) == [
        {"matchExpressions": [term["matchExpressions"][0]]} for term in GPU_NODE_TERMS]
    operator = daemon(SCENARIOS["operator-driver-root"])
    # no GPU-node terms, but still off the device plugin's nodes
    assert _terms(operator) == [{"matchExpressions": [NO_DEVICE_PLUGIN]}]
    assert operator["nodeSelector"] == {"gpu": "yes"}
    custom = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["gpu"]}]}]}}}
    assert daemon({"kubeletPlugin": {"affinity": custom}})["affinity"] == custom
    assert daemon({"kubeletPlugin": {"tolerations": []}}).get("tolerations") is None


def test_device_plugin_guard():
    """A chart cannot see which nodes run NVIDIA's device plugin; the scheduler can."""
    assert _terms(daemon({"allowWithDevicePlugin": True})) == [
        {"matchExpressions": [term["matchExpressions"][0]]} for term in GPU_NODE_TERMS]
    assert "affinity" not in daemon({"allowWithDevicePlugin": True,
                                     "kubeletPlugin": {"gpuNodeAffinity": False}})
    relabelled = _terms(daemon({"devicePluginNodeLabel": "example.com/device-plugin"}))
    assert all(t["matchExpressions"][1] == {**NO_DEVICE_PLUGIN, "key": "example.com/device-plugin"}
               for t in relabelled)
    assert "nvidia.com/gpu.deploy.device-plugin=true" in notes()
    assert "device-plugin" not in notes({"allowWithDevicePlugin": True})


# --- RBAC -----------------------------------------------------------------------------------

def _rules(driver: str) -> list[dict[str, Any]]:
    return [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
         "verbs": ["get", "list"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"],
         "verbs": ["patch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
         "resourceNames": [driver], "verbs": ["associated-node:patch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
         "verbs": ["get", "list", "watch", "create", "update", "delete"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
    ]


def test_cluster_role_is_exactly_what_the_daemon_needs():
    assert one(objects(), "ClusterRole")["rules"] == _rules("gpu.nvidia.com")
    assert one(objects(SCENARIOS["custom-driver"]), "ClusterRole")["rules"] == \
        _rules("gpu.example.com")


def test_binding_names_the_daemons_service_account():
    objs = objects()
    binding = one(objs, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": one(objs, "ClusterRole")["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpudra",
                                    "namespace": NAMESPACE}]
    existing = objects(SCENARIOS["existing-serviceaccount"])
    assert one(existing, "ClusterRoleBinding")["subjects"][0]["name"] == "gpu-daemon"
    assert one(existing, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == \
        "gpu-daemon"


def test_service_account_annotations():
    sa = one(objects({"serviceAccount": {"annotations": {"a": "b"}}}), "ServiceAccount")
    assert sa["metadata"]["annotations"] == {"a": "b"}


# --- the admission policy -------------------------------------------------------------------

def slice_policy(objs: list[dict[str, Any]],
                 kind: str = "ValidatingAdmissionPolicy") -> dict[str, Any]:
    """The policy confining the daemon to its node's slices (the chart has others, generated
    from the config schema and the catalog: tests/scheduling/test_admission_policy.py)."""
    (found,) = [o for o in of_kind(objs, kind) if o["metadata"]["name"].endswith("-resourceslices")]
    return found


def _eval(expression: str, activation: dict[str, Any]) -> Any:
    env = celpy.Environment()
    result = env.program(env.compile(expression)).evaluate(activation)
    assert not isinstance(result, celpy.CELEvalError), f"{expression}: {result}"
    return result


def admit(policy: dict[str, Any], *, operation: str, node: str | None = None,
          username: str = f"system:serviceaccount:{NAMESPACE}:gpudra",
          obj: dict[str, Any] | None = None, old: dict[str, Any] | None = None,
          ) -> tuple[bool, str]:
    """What the API server decides for this request: (allowed, message)."""
    user: dict[str, Any] = {"username": username}
    if node is not None:
        user["extra"] = {NODE_NAME_KEY: [node]}
    activation = {"request": celpy.json_to_cel({"operation": operation, "userInfo": user}),
                  "object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old)}
    spec = policy["spec"]
    if not all(_eval(c["expression"], activation) for c in spec["matchConditions"]):
        return True, "not matched"
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:
        variables[variable["name"]] = _eval(
            variable["expression"], {**activation, "variables": celpy.json_to_cel(variables)})
    activation["variables"] = celpy.json_to_cel(variables)
    for rule in spec["validations"]:
        if not _eval(rule["expression"], activation):
            message = rule.get("message") or _eval(rule["messageExpression"], activation)
            return False, str(message)
    return True, ""


def _slice(node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": "gpu.nvidia.com", "pool": {"name": node or "x"}}
    if node is not None:
        spec["nodeName"] = node
    return {"spec": spec}


@pytest.mark.parametrize(("operation", "node", "new", "old", "allowed"), [
    ("CREATE", "n1", "n1", None, True),
    ("CREATE", "n1", "n2", None, False),
    ("UPDATE", "n1", "n1", "n1", True),
    ("UPDATE", "n1", "n2", "n2", False),
    ("UPDATE", "n1", "n1", "n2", False),  # taking over another node's slice
    ("UPDATE", "n1", "n2", "n1", False),  # handing one's slice to another node
    ("DELETE", "n1", None, "n1", True),
    ("DELETE", "n1", None, "n2", False),
    ("CREATE", None, "n1", None, False),  # a token not bound to a pod on a node
])
def test_policy_confines_the_daemon_to_its_node(operation, node, new, old, allowed):
    policy = slice_policy(objects())
    obj = None if operation == "DELETE" else _slice(new)
    old_obj = None if operation == "CREATE" else _slice(old)
    verdict, message = admit(policy, operation=operation, node=node, obj=obj, old=old_obj)
    assert verdict is allowed, message
    if not allowed and node is not None:
        assert f"node {node}" in message and "n2" in message


def _pool_slice(node: str, pool: str | None, driver: str | None = "gpu.nvidia.com",
                ) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node}
    if pool is not None:
        spec["pool"] = {"name": pool, "generation": 1, "resourceSliceCount": 1}
    if driver is not None:
        spec["driver"] = driver
    return {"spec": spec}


# (operation, new slice, old slice, words the refusal must have); the daemon is on n1 and
# every slice's nodeName is n1: only the pool or the driver is someone else's.
OWN = _pool_slice("n1", "n1")
FOREIGN_POOL = _pool_slice("n1", "n2")
FOREIGN_DRIVER = _pool_slice("n1", "n1", "other.example.com")


@pytest.mark.parametrize(("operation", "new", "old", "refusal"), [
    ("CREATE", OWN, None, None),
    ("UPDATE", OWN, OWN, None),
    ("DELETE", None, OWN, None),
    ("CREATE", FOREIGN_POOL, None, "may not write a ResourceSlice of pool n2"),
    ("CREATE", _pool_slice("n1", None), None, "without spec.pool.name"),
    ("UPDATE", FOREIGN_POOL, OWN, "may not write a ResourceSlice of pool n2"),
    ("UPDATE", OWN, FOREIGN_POOL, "may not change a ResourceSlice of pool n2"),
    ("DELETE", None, FOREIGN_POOL, "may not change a ResourceSlice of pool n2"),
    ("CREATE", FOREIGN_DRIVER, None,
     "may write ResourceSlices of driver gpu.nvidia.com only, not other.example.com"),
    ("CREATE", _pool_slice("n1", "n1", None), None, "not one without spec.driver"),
    ("UPDATE", FOREIGN_DRIVER, OWN, "only, not other.example.com"),
    ("UPDATE", OWN, FOREIGN_DRIVER,
     "may change ResourceSlices of driver gpu.nvidia.com only, not other.example.com"),
    ("DELETE", None, FOREIGN_DRIVER, "only, not other.example.com"),
], ids=["own-create", "own-update", "own-delete", "pool-create", "no-pool", "pool-update-to",
        "pool-update-from", "pool-delete", "driver-create", "no-driver", "driver-update-to",
        "driver-update-from", "driver-delete"])
def test_policy_confines_the_daemon_to_its_pool_and_driver(operation, new, old, refusal):
    # nodeName alone let a node's credentials publish into another node's pool, or
    # devices of another driver (issue 27 item 8).
    allowed, message = admit(slice_policy(objects()), operation=operation, node="n1",
                             obj=new, old=old)
    assert allowed is (refusal is None), message
    if refusal is not None:
        assert message.startswith("the daemon on node n1 ") and refusal in message, message


def test_the_slice_policy_follows_the_driver_name():
    policy = slice_policy(objects({"driverName": "gpu.example.com"}))
    assert admit(policy, operation="CREATE", node="n1",
                 obj=_pool_slice("n1", "n1", "gpu.example.com"))[0] is True
    allowed, message = admit(policy, operation="CREATE", node="n1", obj=OWN)
    assert not allowed and "of driver gpu.example.com only, not gpu.nvidia.com" in message


def test_policy_refuses_slices_without_a_node():
    policy = slice_policy(objects())
    allowed, message = admit(policy, operation="CREATE", node="n1", obj=_slice(None))
    assert not allowed and "without spec.nodeName" in message


@pytest.mark.parametrize("username", [
    "system:node:n1",  # the kubelet wiping a node's slices
    "kubernetes-admin",
    "system:serviceaccount:other-namespace:gpudra",
])
def test_policy_leaves_other_users_alone(username):
    policy = slice_policy(objects())
    assert admit(policy, operation="DELETE", username=username, old=_slice("n2"))[0]


def test_policy_follows_namespace_and_service_account():
    objs = objects(SCENARIOS["existing-serviceaccount"], namespace="gpu-ops")
    policy = slice_policy(objs)
    assert admit(policy, operation="CREATE", node="n1", obj=_slice("n2"),
                 username="system:serviceaccount:gpu-ops:gpu-daemon")[0] is False
    assert admit(policy, operation="CREATE", node="n1", obj=_slice("n2"))[0] is True


def test_policy_matches_slice_writes_and_is_bound():
    objs = objects()
    policy = slice_policy(objs)
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [{
        "apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
        "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["resourceslices"]}]
    binding = slice_policy(objs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"],
                               "validationActions": ["Deny"]}


# --- DeviceClasses --------------------------------------------------------------------------

def _without_labels(obj: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "labels"}}


def test_device_classes_equal_the_plain_yaml():
    rendered = sorted((_without_labels(o) for o in of_kind(objects(), "DeviceClass")),
                      key=lambda o: o["metadata"]["name"])
    shipped = [yaml.safe_load(path.read_text())
               for path in sorted(DEVICECLASS_FILES.glob("*.yaml"))]
    assert [o["metadata"]["name"] for o in shipped] == [
        "gpu-share.nvidia.com", "gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"]
    assert rendered == shipped


def test_device_classes_follow_the_driver_name():
    classes = {o["metadata"]["name"]: o["spec"] for o in
               of_kind(objects(SCENARIOS["custom-driver"]), "DeviceClass")}
    assert classes == {
        "gpu.example.com": {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.example.com' && "
            "device.attributes['gpu.example.com'].type == 'gpu'"}}]},
        "mig.example.com": {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.example.com' && "
            "device.attributes['gpu.example.com'].type == 'mig'"}}]},
        "gpu-share.example.com": {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.example.com' && "
            "device.attributes['gpu.example.com'].type == 'gpu-share'"}}]},
        "vfio.gpu.example.com": {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.example.com' && "
            "device.attributes['gpu.example.com'].type == 'vfio'"}}]},
    }


def test_extended_resource_name():
    classes = {o["metadata"]["name"]: o["spec"] for o in
               of_kind(objects(SCENARIOS["extended-resource"]), "DeviceClass")}
    assert classes["gpu.nvidia.com"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in classes["mig.nvidia.com"]
    assert "nvidia.com/gpu: 1" in notes(SCENARIOS["extended-resource"])


def test_device_class_toggles():
    only_gpu = objects({"deviceClasses": {"mig": {"enabled": False},
                                          "share": {"enabled": False},
                                          "vfio": {"enabled": False}}})
    assert [o["metadata"]["name"] for o in of_kind(only_gpu, "DeviceClass")] == ["gpu.nvidia.com"]


@pytest.mark.parametrize(("values", "complaint"), [
    ({"deviceClasses": {"gpu": {"extendedResourceName": "gpu"}}}, "want <domain>/<name>"),
    ({"deviceClasses": {"gpu": {"extendedResourceName": "kubernetes.io/gpu"}}}, "reserved"),
    ({"deviceClasses": {"gpu": {"extendedResourceName": "nvidia.com/gpu"},
                        "mig": {"extendedResourceName": "nvidia.com/gpu"}}}, "already used"),
])
def test_bad_extended_resource_names_are_refused(values, complaint):
    error = render_error(values)
    assert complaint in error and "extendedResourceName" in error


# --- metrics --------------------------------------------------------------------------------

def test_metrics_service_selects_the_daemon_pods():
    objs = objects()
    service = one(objs, "Service")
    pod_labels = one(objs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8080,
                                         "targetPort": "metrics", "protocol": "TCP"}]
    assert not of_kind(objects(SCENARIOS["metrics-service-off"]), "Service")


def test_service_monitor_scrapes_the_metrics_service():
    objs = objects(SCENARIOS["service-monitor"])
    monitor, service = one(objs, "ServiceMonitor"), one(objs, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    # A ServiceMonitor needs the Service even when the Service alone was switched off.
    both = {"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}}
    assert one(objects(both), "Service")


# --- namespace and values checks ------------------------------------------------------------

def test_custom_namespace_reaches_every_namespaced_object():
    objs = objects(namespace="gpu-ops")
    for obj in objs:
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == "gpu-ops", obj["kind"]
    assert one(objs, "ClusterRoleBinding")["subjects"][0]["namespace"] == "gpu-ops"
    assert "system:serviceaccount:gpu-ops:gpudra" in \
        slice_policy(objs)["spec"]["matchConditions"][0]["expression"]


def test_default_namespace_is_refused_unless_allowed():
    error = render_error(namespace="default")
    assert '"default" namespace' in error and "allowDefaultNamespace" in error
    objs = objects({"allowDefaultNamespace": True}, namespace="default")
    assert one(objs, "DaemonSet")["metadata"]["namespace"] == "default"


@pytest.mark.parametrize(("values", "complaint"), [
    ({"driverName": "GPU_Driver"}, "driverName"),
    ({"driverName": "a" * 64}, "driverName"),
    ({"serviceAccount": {"create": False}}, "serviceAccount.name"),
    ({"kubeletPlugin": {"gpuNodeAffinity": "sometimes"}}, "gpuNodeAffinity"),
    ({"featureGates": {"DynamicMIG": "yes"}}, "featureGates/DynamicMIG"),
    ({"logFormat": "xml"}, "logFormat"),
    ({"simulate": {"profil": "dgx-a100"}}, "profil"),
    ({"driverNmae": "gpu.example.com"}, "driverNmae"),
    ({"metrics": {"port": 0}}, "metrics/port"),
    # Caught by values.schema.json at install, not by a daemon that crash-loops at start:
    ({"featureGates": {"DynamicMig": True}}, "DynamicMig"),
    ({"featureGates": {"DeviceMetadata": True}}, "featureGates/DeviceMetadata"),
    ({"simulate": {"profile": "dgx-a101"}}, "simulate/profile"),
    ({"resources": {"gpus": {"enabled": False}}}, "resources.gpus.enabled=false"),
    ({"nvidiaDriverRoot": "/run/nvidia/driver", "driverRoot": "/opt/nvidia"}, "disagree"),
    ({"namespaceOverride": "GPU"}, "namespaceOverride"),
])
def test_bad_values_fail_with_the_value_named(values, complaint):
    assert complaint in render_error(values)


# --- NOTES.txt ------------------------------------------------------------------------------

def _smoke_test(text: str) -> list[dict[str, Any]]:
    match = re.search(r"^kubectl apply -f - <<'EOF'\n(.*?)^EOF$", text, re.S | re.M)
    assert match, text
    return [doc for doc in yaml.safe_load_all(match.group(1)) if doc]


def test_notes_tell_the_admin_how_to_check():
    text = notes()
    assert f"kubectl get pods -n {NAMESPACE} -l app.kubernetes.io/instance={RELEASE}," in text
    assert "kubectl get resourceslices --field-selector spec.driver=gpu.nvidia.com" in text
    assert "kubectl get deviceclasses" in text
    assert "examples/" in text
    assert "pci-10de.present" in text  # why there may be no pods
    custom = notes(SCENARIOS["custom-driver"], namespace="gpu-ops")
    assert "--field-selector spec.driver=gpu.example.com" in custom
    assert "kubectl get pods -n gpu-ops" in custom


def test_notes_smoke_test_is_valid_and_asks_for_the_gpu_class():
    docs = _smoke_test(notes())
    for doc in docs:
        validate(doc)
    template, pod = docs
    assert template["kind"] == "ResourceClaimTemplate" and pod["kind"] == "Pod"
    request = template["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == \
        template["metadata"]["name"]
    mig_only = _smoke_test(notes({"deviceClasses": {"gpu": {"enabled": False}}}))
    assert mig_only[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"][
        "deviceClassName"] == "mig.nvidia.com"
    assert "kubectl apply" not in notes(SCENARIOS["no-deviceclasses"])


def test_notes_in_simulation():
    text = notes(SIMULATE)
    assert "simulated GPU nodes (profile dgx-a100)" in text
    assert "pci-10de.present" not in text


# --- docs stay in step with the code --------------------------------------------------------

OPAQUE_VALUES = {"resources", "updateStrategy", "tolerations"}


def _value_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    paths = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in OPAQUE_VALUES:
            paths += _value_paths(value, f"{path}.")
        else:
            paths.append(path)
    return paths


def test_readme_lists_every_value():
    readme = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [p for p in _value_paths(values) if f"`{p}`" not in readme]
    assert not missing


def test_values_schema_knows_exactly_the_daemons_gates_and_profiles():
    """One list each, in the code: the schema refuses at install what the daemon would
    refuse at start, and nothing it accepts."""
    from gpudra.driver import sim
    from gpudra.driver.featuregates import KNOWN, OFF_ONLY

    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]
    gates = schema["featureGates"]["properties"]
    assert set(gates) == KNOWN
    assert {name for name, rule in gates.items() if rule == {**rule, "enum": [False]}} == \
        set(OFF_ONLY)
    assert sorted(schema["simulate"]["properties"]["profile"]["enum"]) == ["", *sorted(
        sim.node_profiles())]


def test_nvidia_names_work_and_are_deprecated():
    values = SCENARIOS["nvidia-values"]
    c = container(values)
    assert "--host-driver-root=/run/nvidia/driver" in c["args"]
    assert {v["name"]: v for v in daemon(values)["volumes"]}["driver-root"]["hostPath"][
        "path"] == "/run/nvidia/driver"
    assert "nvidiaDriverRoot is NVIDIA's name for driverRoot" in notes(values)
    assert "NVIDIA's name" not in notes()
    from gpudra.driver.featuregates import parse_feature_gates

    (flag,) = [a for a in c["args"] if a.startswith("--feature-gates=")]
    gates = parse_feature_gates(flag.split("=", 1)[1])
    assert gates.enabled("DeviceHealthCheck") and gates.enabled("TimeSlicingSettings")
    assert any("NVMLDeviceHealthCheck is NVIDIA's name" in n for n in gates.notes)
    both = container({"nvidiaDriverRoot": "/x", "driverRoot": "/x"})  # agreeing is fine
    assert "--host-driver-root=/x" in both["args"]


def test_extra_args_env_pod_security_context_and_namespace_override():
    values = SCENARIOS["extras"]
    spec = daemon(values)
    c = spec["containers"][0]
    assert c["args"][-1] == "--xid-quiet-period=600"
    assert c["env"][-1] == {"name": "TZ", "value": "UTC"}
    assert spec["securityContext"] == {"fsGroup": 0}
    assert "securityContext" not in daemon()
    objs = objects(values)  # the release namespace is gpudra-system, the override wins
    for obj in objs:
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == "gpu-ops", obj["kind"]
    assert one(objs, "ClusterRoleBinding")["subjects"][0]["namespace"] == "gpu-ops"
    assert "system:serviceaccount:gpu-ops:gpudra" in \
        slice_policy(objs)["spec"]["matchConditions"][0]["expression"]
    assert "kubectl get pods -n gpu-ops" in notes(values)


def test_docs_name_every_feature_gate_and_simulated_profile():
    from gpudra.driver import sim
    from gpudra.driver.featuregates import DEFAULTS

    for path in (CHART / "README.md", CHART / "values.yaml"):
        text = path.read_text()
        assert [g for g in DEFAULTS if g not in text] == [], path.name
        assert [p for p in sim.node_profiles() if p not in text] == [], path.name


# --- RBAC against the code's API calls ---------------------------------------------------------

# RawApi method -> Kubernetes verb; ``apply`` is a PATCH.
_VERBS = {"get": "get", "list": "list", "watch": "watch", "create": "create",
          "replace": "update", "delete": "delete", "apply": "patch"}
# The daemon's code: what runs under the chart's ServiceAccount (the CLI tools run as the user).
_DAEMON_CODE = ("kube", "controller", "kubeletplugin", "driver")


def _api_calls() -> set[tuple[str, str, str]]:
    """(apiGroup, resource[/subresource], verb) of every RawApi call in the daemon's code."""
    from gpudra.kube import raw_api

    resources = {name: value for name, value in vars(raw_api).items()
                 if isinstance(value, raw_api.Resource)}
    found: set[tuple[str, str, str]] = set()
    for folder in _DAEMON_CODE:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in _VERBS and node.args
                        and isinstance(node.args[0], ast.Name)
                        and node.args[0].id in resources):
                    continue
                resource = resources[node.args[0].id]
                group = resource.group_version.removeprefix("/apis/").rpartition("/")[0]
                plural = resource.plural
                for keyword in node.keywords:
                    if keyword.arg == "subresource" and isinstance(keyword.value, ast.Constant):
                        plural += f"/{keyword.value.value}"
                found.add((group if resource.group_version.startswith("/apis/") else "",
                           plural, _VERBS[node.func.attr]))
    return found


def _granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def test_cluster_role_grants_exactly_the_calls_the_code_makes():
    calls = _api_calls()
    assert ("resource.k8s.io", "resourceclaims/status", "patch") in calls  # the scan works
    granted = _granted(one(objects(), "ClusterRole")["rules"])
    # Writing status.devices is also authorised on the synthetic resourceclaims/driver
    # subresource (1.36+), with the verb of the status write: not an API call of its own.
    synthetic = {("resource.k8s.io", "resourceclaims/driver", f"associated-node:{verb}")
                 for group, resource, verb in calls if resource == "resourceclaims/status"}
    assert granted == calls | synthetic


# --- dashboards and alerts --------------------------------------------------------------------

def _defined_metrics() -> set[str]:
    """Every series name the daemon's code exposes (prometheus_client's suffixes included)."""
    names: set[str] = set()
    pattern = re.compile(r'\b(Counter|Gauge|Histogram)\(\s*"(gpudra_[a-z0-9_]+)"')
    for folder in _DAEMON_CODE:
        for path in (ROOT / folder).rglob("*.py"):
            for kind, name in pattern.findall(path.read_text()):
                names |= {f"{name}_total"} if kind == "Counter" else (
                    {name} if kind == "Gauge" else {f"{name}_bucket", f"{name}_sum",
                                                    f"{name}_count"})
    return names


def _queried(expr: str) -> set[str]:
    return set(re.findall(r"\bgpudra_[a-z0-9_]+", expr))


def _balanced(expr: str) -> bool:
    depth = 0
    for char in expr:
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def test_dashboard_is_opt_in_and_carries_the_sidecar_label():
    assert of_kind(objects(), "ConfigMap") == []
    cm = one(objects(SCENARIOS["observability"]), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "GPUs"}
    (key,) = cm["data"]
    assert key.endswith(".json")
    assert json.loads(cm["data"][key]) == json.loads((CHART / "files" / "dashboard.json")
                                                     .read_text())


def test_dashboard_queries_only_metrics_the_daemon_exposes():
    dashboard = json.loads((CHART / "files" / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"]
              if isinstance(v.get("query"), dict)]
    assert exprs
    known = _defined_metrics()
    queried = set().union(*map(_queried, exprs))
    assert queried <= known, queried - known
    assert {"gpudra_claim_sm_utilization_percent", "gpudra_claim_memory_used_bytes",
            "gpudra_claim_idle_seconds", "gpudra_xid_events_total"} <= queried
    assert all(_balanced(e) for e in exprs)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert {p["title"] for p in dashboard["panels"] if p["type"] == "row"} == {
        "Per node", "Per namespace", "Idle claims"}


def test_prometheus_rule_is_opt_in_with_the_two_alerts():
    assert of_kind(objects(), "PrometheusRule") == []
    rule = one(objects(SCENARIOS["observability"]), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prom"
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) == {"GPUClaimIdle", "GPUXidErrors"}
    assert alerts["GPUClaimIdle"]["expr"].endswith(">= 3600")
    assert "[10m]" in alerts["GPUXidErrors"]["expr"]
    known = _defined_metrics()
    for alert in alerts.values():
        assert _queried(alert["expr"]) and _queried(alert["expr"]) <= known, alert["expr"]
        assert _balanced(alert["expr"])
        assert "{{ $labels." in alert["annotations"]["summary"]  # Prometheus templating kept


def test_rule_values_are_checked_by_the_schema():
    assert "xidWindow" in render_error({"metrics": {"prometheusRule": {"xidWindow": "ten"}}})


def test_the_slices_the_daemon_publishes_pass_the_slice_policy(capsys, tmp_path):
    # What the daemon publishes for a simulated DGX H100 (`gpudra inventory -o json`
    # prints exactly those slices, every slice of its one pool) is admitted on create,
    # update and delete: the confinement refuses nothing of ours.
    from gpudra.cli.main import main

    assert main(["inventory", "--simulate", "dgx-h100", "--sim-state", str(tmp_path),
                 "--node-name", "n1", "-o", "json"]) == 0
    slices = json.loads(capsys.readouterr().out)["items"]
    policy = slice_policy(objects())
    assert len(slices) > 1
    for obj in slices:
        for operation, new, old in (("CREATE", obj, None), ("UPDATE", obj, obj),
                                    ("DELETE", None, obj)):
            assert admit(policy, operation=operation, node="n1", obj=new, old=old) == (True, "")
    assert admit(policy, operation="CREATE", node="n2", obj=slices[0])[0] is False

"""The chart's generated admission policies agree with the decoder and the catalog.

The policies are rendered by Helm's own engine from the committed templates, and their CEL
runs in the project's Kubernetes CEL environment (``scheduling.admission_eval``):

- opaque configs: for every good and bad config of ``tests/api/test_configs.py`` the policy
  finds exactly the problems the pydantic decoder finds, with the path and message
  ``gpudra validate`` prints, in claims, templates and DeviceClasses;
- selector names: the names the policy warns about are the ones the CEL compiler sees read
  and the catalog does not list, with the hint ``near`` gives.
"""

from __future__ import annotations

import copy
import functools
import string
from pathlib import Path
from typing import Any

import pytest

from gpudra.api.configs import QUANTITY_PATTERN, validate_opaque
from gpudra.scheduling import admission_policy, admission_selectors
from gpudra.scheduling.admission_eval import Outcome, Request, evaluate
from gpudra.scheduling.admission_selectors import near, nearest
from gpudra.scheduling.catalog import ATTRIBUTES, CAPACITIES, suggest
from gpudra.scheduling.cel import compile_selector
from gpudra.scheduling.cel.quantity import is_quantity
from gpudra.scheduling.validate import validate_object
from tests.api.test_configs import INVALID, MORE_INVALID, VALID, gpu, mig

chart = pytest.importorskip("tests.deploy.test_chart", reason="renders the chart with Helm")

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "gpu.nvidia.com"
A = f"device.attributes['{DRIVER}']"
C = f"device.capacity['{DRIVER}']"


@functools.cache
def _policies(values_key: str = "") -> dict[str, dict[str, Any]]:
    values = {"driverName": values_key} if values_key else {}
    return {o["metadata"]["name"].removeprefix("gpudra-"): o for o in chart.objects(values)
            if o["kind"] == "ValidatingAdmissionPolicy"}


def policy(name: str, driver: str = "") -> dict[str, Any]:
    return _policies(driver)[name]


def claim(*parameters: Any, driver: str = DRIVER) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default"},
            "spec": {"devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
                "config": [{"opaque": {"driver": driver, "parameters": p}} for p in parameters]}}}


def template(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": obj["metadata"], "spec": {"spec": obj["spec"]}}


def device_class(*parameters: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "shared-gpu"},
            "spec": {"config": [{"opaque": {"driver": DRIVER, "parameters": p}}
                                for p in parameters]}}


RESOURCES = {"ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates",
             "DeviceClass": "deviceclasses"}


def admit(name: str, obj: dict[str, Any], *, driver: str = "",
          operation: str = "CREATE") -> Outcome:
    outcome = evaluate(policy(name, driver), Request(
        obj, operation=operation, resource=RESOURCES[obj["kind"]]))
    assert outcome.errors == (), outcome.errors  # an error would let the object through
    return outcome


def policy_problems(obj: dict[str, Any]) -> list[str]:
    outcome = admit("opaque-configs", obj)
    found = [str(p) for per_config in outcome.variables["problems"] for p in per_config]
    assert outcome.allowed == (not found)
    if found:
        assert set(outcome.failures[0].split("; ")) >= set(found)
    return found


def decoder_problems(parameters: dict[str, Any], where: str) -> list[str]:
    """The decoder's problems, placed where ``gpudra validate`` places them."""
    out = []
    for problem in validate_opaque(parameters):
        path, _, message = problem.partition(": ")
        out.append(f"{where}.parameters{'' if path == 'parameters' else '.' + path}: {message}")
    return out


def validate_problems(obj: dict[str, Any]) -> list[str]:
    return [f"{p.path}: {p.message}" for p in validate_object(obj, driver=DRIVER)
            if ".opaque.parameters" in p.path]


# --- opaque configs: the policy says what the decoder says ----------------------------------

CONFIGS = [(case, parameters) for case, parameters, _ in INVALID + MORE_INVALID
           if isinstance(parameters, dict)] + VALID


@pytest.mark.parametrize(("case", "parameters"), CONFIGS, ids=[c[0] for c in CONFIGS])
def test_policy_and_decoder_agree(case, parameters):
    obj = claim(parameters)
    expected = decoder_problems(parameters, "spec.devices.config[0].opaque")
    assert sorted(policy_problems(obj)) == sorted(expected)
    assert sorted(validate_problems(obj)) == sorted(expected)  # what `gpudra validate` prints


def test_every_table_case_is_covered():
    """The bad configs of the decoder's tables are all here (JSON text aside, which the
    apiserver itself refuses), and both verdicts occur."""
    assert len([c for c in CONFIGS if validate_opaque(c[1])]) >= 27 + 25
    assert len([c for c in CONFIGS if not validate_opaque(c[1])]) == len(VALID)


@pytest.mark.parametrize(("case", "parameters"), CONFIGS[::3], ids=[c[0] for c in CONFIGS[::3]])
def test_templates_and_device_classes_too(case, parameters):
    for obj, where in ((template(claim(parameters)), "spec.spec.devices.config[0].opaque"),
                       (device_class(parameters), "spec.config[0].opaque")):
        expected = decoder_problems(parameters, where)
        assert sorted(policy_problems(obj)) == sorted(expected), obj["kind"]
        assert sorted(validate_problems(obj)) == sorted(expected), obj["kind"]


def test_the_message_names_every_bad_config_by_index():
    bad_mig = mig(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {}})
    obj = claim(gpu(sharing={"strategy": "TimeSlicing",
                             "timeSlicingConfig": {"interval": "VeryLong"}}),
                gpu(), bad_mig)
    obj["spec"]["devices"]["config"].insert(1, {"opaque": {
        "driver": "other.example.com", "parameters": {"whatever": True}}})
    outcome = admit("opaque-configs", obj)
    assert not outcome.allowed
    assert outcome.failures == (
        "spec.devices.config[0].opaque.parameters.sharing.timeSlicingConfig.interval: Input "
        "should be 'Default', 'Short', 'Medium' or 'Long'; "
        "spec.devices.config[3].opaque.parameters.sharing.timeSlicingConfig: unknown field",)


def test_claims_without_configs_for_this_driver_pass():
    assert admit("opaque-configs", claim()).allowed
    assert admit("opaque-configs", claim({"anything": 1}, driver="other.example.com")).allowed
    bare = claim()
    del bare["spec"]["devices"]
    assert admit("opaque-configs", bare).allowed
    assert admit("opaque-configs", {"kind": "DeviceClass", "spec": {"selectors": []}}).allowed


def test_the_policy_follows_the_driver_name():
    bad = gpu(computMode="Default")
    assert admit("opaque-configs", claim(bad), driver="gpu.example.com").allowed
    outcome = admit("opaque-configs", claim(bad, driver="gpu.example.com"),
                    driver="gpu.example.com")
    assert outcome.failures == ("spec.devices.config[0].opaque.parameters.computMode: "
                                "unknown field",)


def test_thirty_two_configs_are_all_checked():
    """The apiserver allows 32 configs; the policy walks them by index."""
    obj = claim(*[gpu()] * 31, gpu(computeMode="Never"))
    (problem,) = policy_problems(obj)
    assert problem.startswith("spec.devices.config[31].opaque.parameters.computeMode: ")


def test_config_policy_shape():
    spec = policy("opaque-configs")["spec"]
    assert spec["failurePolicy"] == "Ignore"  # prepare refuses the config anyway
    rules = spec["matchConstraints"]["resourceRules"]
    assert {(r["operations"][-1], *r["resources"]) for r in rules} == {
        ("CREATE", "resourceclaims", "resourceclaimtemplates"), ("UPDATE", "deviceclasses")}
    bindings = {o["spec"]["policyName"]: o["spec"]["validationActions"]
                for o in chart.objects() if o["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert bindings["gpudra-opaque-configs"] == ["Deny"]
    assert bindings["gpudra-selector-names"] == ["Warn"]
    # a claim update (say, a finalizer) is never matched: claims are immutable
    assert not evaluate(policy("opaque-configs"), Request(
        claim(gpu(x=1)), operation="UPDATE", resource="resourceclaims")).matched


QUANTITY_SAMPLES = ["1", "1Gi", "1.5Gi", ".5Gi", "1.", "1e3", "1E3", "1E", "-1", "+1Mi", "1e-3",
                    "", " 1Gi", "1Gi ", "1 Gi", "1gi", "1Kb", "1KiB", "0x10", "1e", "1.2.3", ".",
                    "e3", "٣", "1Ki5", "1m", "1u", "1n", "1k", "1K", "++1", "1.5e+3"]


@pytest.mark.parametrize("text", QUANTITY_SAMPLES)
def test_quantity_grammar_is_kubernetes_own(text):
    """The decoder's quantity grammar is what CEL's isQuantity() accepts, so the policy
    and the decoder call the same strings quantities."""
    import re

    assert bool(re.match(QUANTITY_PATTERN, text)) is bool(is_quantity(text))


# --- selector names ---------------------------------------------------------------------------

SELECTORS = [
    f"{A}.productNmae == 'NVIDIA A100'",
    f"{C}.memroy.compareTo(quantity('80Gi')) >= 0",
    f"{A}.productName.lowerAscii().contains('h100') && {C}.memory.isGreaterThan(quantity('1'))",
    f"has({A}.prfile) && {A}.?numanode.orValue(0) == 1",
    f'device.attributes["{DRIVER}"]["parentUUID"] == "x" && device.attributes["{DRIVER}"]'
    f'["parentUuid"] == "y"',
    f"{A} .index == 0 && {A}.minor == 1 && {A}.pcieBusID == 'x'",
    f"{C}.memorySlice3 == quantity('1') && {C}.memorySlices == quantity('1')",
    f"{C}.copyEngine.isGreaterThan(quantity('0')) && "
    f"{C}.multiprocessors.isGreaterThan(quantity('0'))",
    "device.attributes['resource.kubernetes.io'].pcieRoot == 'x' && "
    "device.attributes['other.example.com'].productNmae == 'y'",
    f"{A}.cudaComputeCapability.compareTo(semver('9.0.0')) >= 0 && {A}.architecure == 'Hopper'",
    f"{A}.typ == 'gpu' && {A}.drivrVersion.major() > 500 && {A}.NVLINKDOMAIN == 'x'",
    f"{A}.totallyUnrelated == 1",
]


def _expected_findings(expression: str, path: str) -> set[tuple[str, str, str]]:
    """From the CEL compiler's own analysis: (kind, path, name) of each unknown name."""
    found = set()
    for ref in compile_selector(expression).analysis.references:
        if ref.domain != DRIVER:
            continue
        known = ref.name in ATTRIBUTES if ref.kind == "attribute" else (
            ref.name in CAPACITIES or (ref.name.startswith("memorySlice")
                                       and ref.name[11:].isdigit()))
        if not known:
            found.add((ref.kind, path, ref.name))
    return found


def _findings(outcome: Outcome) -> set[tuple[str, str, str]]:
    text = str(outcome.variables["findings"])
    return {tuple(line.split("|")) for line in text.split("\n") if line}  # type: ignore[misc]


def selector_claim(*expressions: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
            "spec": {"devices": {"requests": [
                {"name": "one", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [
                    {"cel": {"expression": e}} for e in expressions]}},
                {"name": "two", "firstAvailable": [
                    {"name": "big", "deviceClassName": "gpu.nvidia.com"},
                    {"name": "small", "deviceClassName": "mig.nvidia.com", "selectors": [
                        {"cel": {"expression": e}} for e in reversed(expressions)]}]}]}}}


@pytest.mark.parametrize("expression", SELECTORS)
def test_warned_names_are_the_unknown_names_the_compiler_sees(expression):
    outcome = admit("selector-names", selector_claim(expression))
    first = "spec.devices.requests[0].exactly.selectors[0].cel.expression"
    second = "spec.devices.requests[1].firstAvailable[1].selectors[0].cel.expression"
    expected = _expected_findings(expression, first) | _expected_findings(expression, second)
    assert _findings(outcome) == expected
    assert outcome.allowed == (not expected)
    for kind, path, name in expected:
        matching = [w for w in map(str, outcome.variables["warnings"])
                    if w.startswith(f"{path}: {DRIVER}/{name}: ")]
        assert matching, (kind, name)
        hint = nearest(name, ATTRIBUTES if kind == "attribute" else CAPACITIES)
        if hint and name not in ("index", "minor", "pcieBusID"):
            assert matching[0].endswith(f"(did you mean '{hint}'?)")


def test_the_issue_examples_name_the_intended_names():
    outcome = admit("selector-names", selector_claim(
        f"{A}.productNmae == 'x' && {C}.memroy.isGreaterThan(quantity('1Gi'))"))
    path = "spec.devices.requests[0].exactly.selectors[0].cel.expression"
    warnings = list(map(str, outcome.variables["warnings"]))
    assert f"{path}: gpu.nvidia.com/productNmae: no such attribute: this driver never " \
           "publishes it (did you mean 'productName'?)" in warnings
    assert f"{path}: gpu.nvidia.com/memroy: no such capacity: this driver never publishes it " \
           "(did you mean 'memory'?)" in warnings
    # the same names `gpudra validate` suggests
    assert suggest("productNmae", ATTRIBUTES) == "productName"
    assert suggest("memroy", CAPACITIES) == "memory"
    assert not outcome.allowed and outcome.failures[0] == "; ".join(warnings)


def test_removed_attributes_say_what_to_use_instead():
    outcome = admit("selector-names", selector_claim(f"{A}.index == 0"))
    assert any("NVIDIA's driver removed 'index'" in str(w) for w in outcome.variables["warnings"])


def test_constraints_and_device_classes_and_templates():
    obj = selector_claim(f"{A}.type == 'gpu'")
    obj["spec"]["devices"]["constraints"] = [
        {"requests": ["one"], "matchAttribute": f"{DRIVER}/parentUUId"},
        {"distinctAttribute": f"{DRIVER}/uuid"},
        {"matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    assert _findings(admit("selector-names", obj)) == {
        ("attribute", "spec.devices.constraints[0].matchAttribute", "parentUUId")}
    assert _findings(admit("selector-names", template(obj))) == {
        ("attribute", "spec.spec.devices.constraints[0].matchAttribute", "parentUUId")}
    cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "x"},
           "spec": {"selectors": [{"cel": {"expression": f"{A}.type == 'gpu'"}},
                                  {"cel": {"expression": f"{A}.typ == 'gpu'"}}]}}
    outcome = admit("selector-names", cls, operation="UPDATE")
    assert [str(w) for w in outcome.variables["warnings"]] == [
        "spec.selectors[1].cel.expression: gpu.nvidia.com/typ: no such attribute: this driver "
        "never publishes it (did you mean 'type'?)"]


def test_good_objects_get_no_warning():
    for obj in (selector_claim(f"{A}.productName == 'x'", f"{C}.memory.isGreaterThan("
                                                        "quantity('1'))"),
                claim(gpu()), {"kind": "DeviceClass", "spec": {}}):
        assert admit("selector-names", obj).allowed


def test_selector_policy_follows_the_driver_name():
    obj = selector_claim(f"{A}.productNmae == 'x'")
    assert admit("selector-names", obj, driver="gpu.example.com").allowed
    obj = selector_claim("device.attributes['gpu.example.com'].productNmae == 'x'")
    assert not admit("selector-names", obj, driver="gpu.example.com").allowed


def _typos(name: str) -> list[str]:
    letters = "az" + name[:2]
    out = [name[:i] + name[i + 1:] for i in range(len(name))]  # dropped
    out += [name[:i] + c + name[i:] for i in range(len(name) + 1) for c in letters[:2]]  # added
    out += [name[:i] + name[i + 1] + name[i] + name[i + 2:] for i in range(len(name) - 1)]
    out += [name[:i] + "q" + name[i + 1:] for i in range(len(name))]  # changed
    return [*out, name.upper(), name + "xy", name[::-1]]


def test_near_in_cel_is_near_in_python():
    """One of each kind of typo per published name, and some names near nothing."""
    candidates = [typo for i, n in enumerate(ATTRIBUTES) for typo in _typos(n)[i::21]]
    candidates += ["x", string.ascii_letters[:32]]
    expression = " && ".join(f"{A}.{c} == 1" for c in candidates if c.isidentifier())
    obj = selector_claim(expression)
    del obj["spec"]["devices"]["requests"][1]  # one path is enough, and CEL here is slow
    outcome = admit("selector-names", obj)
    hints = {}
    for warning in map(str, outcome.variables["warnings"]):
        name = warning.split(f"{DRIVER}/", 1)[1].split(":", 1)[0]
        hints[name] = warning.rsplit("(did you mean '", 1)[1][:-3] if "did you mean" in \
            warning else None
    for name, hint in hints.items():
        if name in ("index", "minor", "pcieBusID"):
            continue
        assert hint == nearest(name, ATTRIBUTES), name
    assert hints, "no warnings at all"


def test_near():
    assert near("productNmae", "productName") and near("memroy", "memory")
    assert near("memor", "memory") and near("memoryy", "memory") and near("MEMORY", "memory")
    assert near("nemory", "memory")
    assert not near("memorie", "memory") and not near("mmoery", "memory")


# --- the generated files and the chart values ------------------------------------------------

def test_committed_templates_are_generated_output():
    assert admission_policy.main(["--check", "--root", str(ROOT)]) == 0, (
        "run: python -m gpudra.scheduling.admission_policy")


def test_generator_check_notices_a_stale_template(tmp_path):
    for relative, text in admission_policy.render().items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    assert admission_policy.main(["--check", "--root", str(tmp_path)]) == 0
    first = next(iter(admission_policy.render()))
    (tmp_path / first).write_text("stale")
    assert admission_policy.main(["--check", "--root", str(tmp_path)]) == 1


def test_catalog_is_the_one_source_of_names():
    assert tuple(ATTRIBUTES) == admission_selectors.ATTRIBUTE_NAMES
    assert CAPACITIES == admission_selectors.CAPACITY_NAMES
    text = admission_policy.selectors_policy()
    assert all(f"'{name}'" in text for name in (*ATTRIBUTES, *CAPACITIES))


@pytest.mark.parametrize(("values", "names"), [
    ({}, {"gpudra-opaque-configs", "gpudra-selector-names", "gpudra-resourceslices"}),
    ({"validatingAdmissionPolicy": {"opaqueConfigs": False}},
     {"gpudra-selector-names", "gpudra-resourceslices"}),
    ({"validatingAdmissionPolicy": {"selectorWarnings": False}},
     {"gpudra-opaque-configs", "gpudra-resourceslices"}),
    ({"validatingAdmissionPolicy": {"enabled": False}}, set()),
])
def test_switches(values, names):
    objs = chart.objects(copy.deepcopy(values))
    assert {o["metadata"]["name"] for o in objs if o["kind"] == "ValidatingAdmissionPolicy"} \
        == names
    assert {o["spec"]["policyName"] for o in objs
            if o["kind"] == "ValidatingAdmissionPolicyBinding"} == names


# --- the slice policy, through our own evaluator (issue 27 item 8) --------------------------

SLICE_USER = f"system:serviceaccount:{chart.NAMESPACE}:gpudra"


def _slice(node: str, pool: str, driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-slice"},
            "spec": {"nodeName": node, "driver": driver,
                     "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1}}}


@pytest.mark.parametrize(("operation", "obj", "old", "allowed"), [
    ("CREATE", _slice("n1", "n1"), None, True),
    ("UPDATE", _slice("n1", "n1"), _slice("n1", "n1"), True),
    ("DELETE", None, _slice("n1", "n1"), True),
    ("CREATE", _slice("n1", "n2"), None, False),
    ("UPDATE", _slice("n1", "n1"), _slice("n1", "n2"), False),
    ("DELETE", None, _slice("n1", "n2"), False),
    ("CREATE", _slice("n1", "n1", "other.example.com"), None, False),
    ("UPDATE", _slice("n1", "n1"), _slice("n1", "n1", "other.example.com"), False),
    ("CREATE", _slice("n2", "n2"), None, False),
])
def test_the_slice_policy_confines_node_pool_and_driver(operation, obj, old, allowed):
    # The chart's rendered policy, evaluated as the apiserver would (lazy variables,
    # failurePolicy Fail: an expression error would deny): the same verdicts as celpy's.
    [policy] = [o for o in chart.objects() if o["kind"] == "ValidatingAdmissionPolicy"
                and o["metadata"]["name"].endswith("-resourceslices")]
    outcome = evaluate(policy, Request(
        obj=obj, old=old, operation=operation, username=SLICE_USER,
        extra={"authentication.kubernetes.io/node-name": ["n1"]}, resource="resourceslices"))
    assert outcome.matched and outcome.errors == ()
    assert outcome.allowed is allowed, outcome.failures
    if not allowed:
        assert outcome.failures[0].startswith("the daemon on node n1 ")

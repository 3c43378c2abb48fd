"""Local ResourceSlice validation: one failing case per apiserver rule, pool checks, messages."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpudra.api.field_errors import FieldError, format_invalid
from gpudra.controller.pool_validation import validate_pool
from gpudra.controller.slice_validation import SliceValidationError, ensure_valid, validate_slice

DRIVER = "gpu.nvidia.com"
NAME = "node-1-gpu.nvidia.com-gpu-0"
DROP = object()
LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)


# --- builders -------------------------------------------------------------------------------


def _apply(target: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    for key, value in changes.items():
        if value is DROP:
            target.pop(key, None)
        else:
            target[key] = value
    return target


def dev(name: Any = "gpu-0", **changes: Any) -> dict[str, Any]:
    device = {
        "attributes": {"type": {"string": "gpu"}, "driverVersion": {"version": "580.95.5"}},
        "capacity": {"memory": {"value": "80Gi"}},
    }
    return _apply(device, {"name": name, **changes})


def attrs(**attributes: Any) -> dict[str, Any]:
    return dev(attributes=attributes)


def res_slice(*devices: dict[str, Any], metadata: Any = None, **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": NAME} if metadata is None else metadata,
        "spec": {
            "driver": DRIVER,
            "nodeName": "node-1",
            "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
            "devices": list(devices) if devices else [dev()],
        },
    }
    _apply(obj["spec"], spec)
    return obj


def cset(name: str = "gpu-0-counter-set", **counters: str) -> dict[str, Any]:
    counters = counters or {"memory": "40Gi", "memory-slice-0": "1"}
    return {"name": name, "counters": {k: {"value": v} for k, v in counters.items()}}


def counters_slice(*sets: dict[str, Any]) -> dict[str, Any]:
    return res_slice(devices=DROP, sharedCounters=list(sets) or [cset()])


def uses(counter_set: str = "gpu-0-counter-set", **counters: str) -> dict[str, Any]:
    counters = counters or {"memory": "5Gi"}
    return {"counterSet": counter_set, "counters": {k: {"value": v} for k, v in counters.items()}}


def taint(**changes: Any) -> dict[str, Any]:
    return _apply({"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}, changes)


def plain_devices(count: int, **changes: Any) -> list[dict[str, Any]]:
    return [dev(f"gpu-{i}", **changes) for i in range(count)]


# --- the table ------------------------------------------------------------------------------

INV, R, TM, D, U, TL, F = (
    "Invalid value", "Required value", "Too many", "Duplicate value", "Unsupported value",
    "Too long", "Forbidden",
)
A0 = "spec.devices[0].attributes"
C0 = "spec.devices[0].capacity"
T0 = "spec.devices[0].taints"
K0 = "spec.devices[0].consumesCounters"
S = "spec.sharedCounters"
LONG_KEY = "d" * 70 + "/" + "x" * 40

VALID = {
    "plain": res_slice(),
    "generate-name": res_slice(metadata={"generateName": "node-1-gpu.nvidia.com-"}),
    "upper-case-driver": res_slice(driver="GPU.nvidia.com"),
    "pool-with-slashes": res_slice(pool={"name": "a/b.c", "generation": 0,
                                         "resourceSliceCount": 3}),
    "all-nodes": res_slice(nodeName=DROP, allNodes=True),
    "node-selector": res_slice(nodeName=DROP, nodeSelector={"nodeSelectorTerms": [{}]}),
    "per-device-nodes": res_slice(dev(nodeName="node-1"), nodeName=DROP,
                                  perDeviceNodeSelection=True),
    "qualified-keys": res_slice(dev(attributes={
        "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"}, "_x9": {"int": -1}})),
    "all-attribute-types": res_slice(dev(attributes={
        "s": {"string": "x" * 64}, "i": {"int": 2**63 - 1}, "b": {"bool": False},
        "v": {"version": "1.2.3-rc.1+build.5"}, "is": {"ints": [1, 2]},
        "ss": {"strings": ["a"]}, "bs": {"bools": [True]}, "vs": {"versions": ["0.0.0"]}})),
    "128-plain-devices": res_slice(*plain_devices(128)),
    "64-tainted-devices": res_slice(*plain_devices(64, taints=[taint()])),
    "32-attributes-and-capacities": res_slice(dev(
        attributes={f"a{i}": {"int": i} for i in range(16)},
        capacity={f"c{i}": {"value": str(i)} for i in range(16)})),
    "48-attribute-values": res_slice(dev(attributes={"l": {"ints": list(range(48))}})),
    "quantity-forms": res_slice(dev(capacity={"a": {"value": "1500m"}, "b": {"value": "1e3"},
                                              "c": {"value": 7}})),
    "request-policy-range": res_slice(dev(
        allowMultipleAllocations=True,
        capacity={"memory": {"value": "80Gi", "requestPolicy": {
            "default": "9Gi", "validRange": {"min": "1Gi", "step": "1Gi", "max": "79Gi"}}},
                  "shares": {"value": "16", "requestPolicy": {
                      "default": "1", "validValues": ["1", "2", "4", "8", "16"]}}})),
    "request-policy-with-multi-allocation": res_slice(dev(
        allowMultipleAllocations=True,
        capacity={"memory": {"value": "80Gi", "requestPolicy": {"default": "1Gi"}}})),
    "counters": counters_slice(*[cset(f"gpu-{i}-counter-set") for i in range(8)]),
    "32-counters": counters_slice(cset(**{f"c{i}": "1" for i in range(32)})),
    "consumes-counters": res_slice(dev(consumesCounters=[uses(), uses("other")])),
    "taints": res_slice(dev(taints=[taint(), taint(value=DROP, effect="None"),
                                    taint(key="maintenance", effect="NoSchedule",
                                          timeAdded="2026-07-01T10:00:00Z")])),
    "empty": res_slice(devices=DROP),
}

INVALID: dict[str, tuple[dict[str, Any], list[tuple[str, str]]]] = {
    # metadata
    "name-missing": (res_slice(metadata={}), [("metadata.name", R)]),
    "name-not-subdomain": (res_slice(metadata={"name": "Node_1"}), [("metadata.name", INV)]),
    "name-too-long": (res_slice(metadata={"name": "a" * 254}), [("metadata.name", INV)]),
    "generate-name-bad": (res_slice(metadata={"generateName": "Node_"}),
                          [("metadata.generateName", INV)]),
    # driver
    "driver-missing": (res_slice(driver=DROP), [("spec.driver", R)]),
    "driver-too-long": (res_slice(driver="a" * 64), [("spec.driver", TL)]),
    "driver-not-subdomain": (res_slice(driver="gpu_nvidia.com"), [("spec.driver", INV)]),
    # pool
    "pool-name-missing": (res_slice(pool={"generation": 1, "resourceSliceCount": 1}),
                          [("spec.pool.name", R)]),
    "pool-name-bad-part": (res_slice(pool={"name": "a//b", "resourceSliceCount": 1}),
                           [("spec.pool.name", INV)]),
    "pool-name-too-long": (res_slice(pool={"name": "a" * 254, "resourceSliceCount": 1}),
                           [("spec.pool.name", TL), ("spec.pool.name", INV)]),
    "pool-count-zero": (res_slice(pool={"name": "n", "resourceSliceCount": 0}),
                        [("spec.pool.resourceSliceCount", INV)]),
    "pool-generation-negative": (res_slice(pool={"name": "n", "generation": -1,
                                                 "resourceSliceCount": 1}),
                                 [("spec.pool.generation", INV)]),
    "pool-generation-not-int": (res_slice(pool={"name": "n", "generation": "1",
                                                "resourceSliceCount": 1}),
                                [("spec.pool.generation", INV)]),
    # node selection: exactly one
    "no-node-selection": (res_slice(nodeName=DROP), [("spec", R)]),
    "two-node-selections": (res_slice(allNodes=True), [("spec", INV)]),
    "node-name-empty": (res_slice(nodeName=""), [("spec.nodeName", INV), ("spec", R)]),
    "node-name-bad": (res_slice(nodeName="Node_1"), [("spec.nodeName", INV)]),
    "all-nodes-false": (res_slice(allNodes=False), [("spec.allNodes", INV)]),
    "selector-two-terms": (res_slice(nodeName=DROP, nodeSelector={"nodeSelectorTerms": [{}, {}]}),
                           [("spec.nodeSelector.nodeSelectorTerms", INV)]),
    "per-device-missing": (res_slice(nodeName=DROP, perDeviceNodeSelection=True),
                           [("spec.devices[0]", R)]),
    "per-device-without-flag": (res_slice(dev(allNodes=True)), [("spec.devices[0]", INV)]),
    # devices vs counters, device count
    "devices-and-counters": (res_slice(sharedCounters=[cset()]), [("spec", INV)]),
    "129-devices": (res_slice(*plain_devices(129)), [("spec.devices", TM)]),
    "65-tainted": (res_slice(*plain_devices(64), dev("x", taints=[taint()])),
                   [("spec.devices", TM)]),
    "65-consuming": (res_slice(*plain_devices(64), dev("x", consumesCounters=[uses()])),
                     [("spec.devices", TM)]),
    "65-list-attributes": (res_slice(*plain_devices(64), dev("x", attributes={"l": {"ints": [1]}})),
                           [("spec.devices", TM)]),
    # device names
    "device-name-upper": (res_slice(dev("GPU-0")), [("spec.devices[0].name", INV)]),
    "device-name-dots": (res_slice(dev("gpu.0")), [("spec.devices[0].name", INV)]),
    "device-name-too-long": (res_slice(dev("g" * 64)), [("spec.devices[0].name", INV)]),
    "device-name-missing": (res_slice(dev(name=DROP)), [("spec.devices[0].name", R)]),
    "device-name-duplicate": (res_slice(dev(), dev()), [("spec.devices[1]", D)]),
    "device-not-object": (res_slice("gpu-0"), [("spec.devices[0]", INV)]),  # type: ignore[arg-type]
    # attribute keys (errors on the map, as in Go)
    "key-not-identifier": (res_slice(attrs(**{"foo-bar": {"int": 1}})), [(A0, INV)]),
    "key-id-too-long": (res_slice(attrs(**{"a" * 33: {"int": 1}})), [(A0, TL)]),
    "key-two-slashes": (res_slice(attrs(**{"a/b/c": {"int": 1}})), [(A0, INV)]),
    "key-empty-domain": (res_slice(attrs(**{"/foo": {"int": 1}})), [(A0, INV)]),
    "key-empty-name": (res_slice(attrs(**{"example.com/": {"int": 1}})), [(A0, INV)]),
    "key-bad-domain": (res_slice(attrs(**{"ex_ample.com/foo": {"int": 1}})), [(A0, INV)]),
    "key-domain-too-long": (res_slice(attrs(**{"d" * 64 + "/foo": {"int": 1}})), [(A0, TL)]),
    "key-truncated-in-path": (
        res_slice(attrs(**{LONG_KEY: {}})),
        [(A0, TL), (A0, TL), (f"{A0}[{LONG_KEY[:47]}...{LONG_KEY[-46:]}]", INV)],
    ),
    # attribute values
    "attribute-two-values": (res_slice(attrs(x={"int": 1, "bool": True})), [(f"{A0}[x]", INV)]),
    "attribute-no-value": (res_slice(attrs(x={})), [(f"{A0}[x]", INV)]),
    "attribute-unknown-type": (res_slice(attrs(x={"float": 1.5})), [(f"{A0}[x]", INV)]),
    "string-too-long": (res_slice(attrs(x={"string": "s" * 65})), [(f"{A0}[x].string", TL)]),
    "string-too-many-bytes": (res_slice(attrs(x={"string": "é" * 33})),
                              [(f"{A0}[x].string", TL)]),
    "version-leading-zero": (res_slice(attrs(x={"version": "1.02.3"})),
                             [(f"{A0}[x].version", INV)]),
    "version-v-prefix": (res_slice(attrs(x={"version": "v1.2.3"})), [(f"{A0}[x].version", INV)]),
    "version-too-long": (res_slice(attrs(x={"version": "1.2.3-" + "a" * 59})),
                         [(f"{A0}[x].version", TL)]),
    "int-as-string": (res_slice(attrs(x={"int": "5"})), [(f"{A0}[x].int", INV)]),
    "int-over-int64": (res_slice(attrs(x={"int": 2**63})), [(f"{A0}[x].int", INV)]),
    "bool-as-int": (res_slice(attrs(x={"bool": 1})), [(f"{A0}[x].bool", INV)]),
    "list-empty": (res_slice(attrs(x={"ints": []})), [(f"{A0}[x].ints", INV)]),
    "list-item-too-long": (res_slice(attrs(x={"strings": ["ok", "s" * 65]})),
                           [(f"{A0}[x].strings[1]", TL)]),
    "list-item-bad-version": (res_slice(attrs(x={"versions": ["1.0"]})),
                              [(f"{A0}[x].versions[0]", INV)]),
    "33-attributes-and-capacities": (
        res_slice(dev(attributes={f"a{i}": {"int": i} for i in range(17)},
                      capacity={f"c{i}": {"value": "1"} for i in range(16)})),
        [("spec.devices[0]", INV)],
    ),
    "49-attribute-values": (res_slice(attrs(l={"ints": list(range(48))}, x={"int": 1})),
                            [("spec.devices[0]", INV)]),
    # capacity
    "capacity-key-bad": (res_slice(dev(capacity={"mem-ory": {"value": "1"}})), [(C0, INV)]),
    "capacity-not-quantity": (res_slice(dev(capacity={"memory": {"value": "lots"}})),
                              [(f"{C0}[memory].value", INV)]),
    "capacity-value-missing": (res_slice(dev(capacity={"memory": {}})),
                               [(f"{C0}[memory].value", R)]),
    "request-policy-forbidden": (
        res_slice(dev(capacity={"memory": {"value": "1Gi", "requestPolicy": {"default": "1"}}})),
        [(f"{C0}[memory].requestPolicy", F)],
    ),
    # request policies (KEP-5075): one kind, within the capacity, a default it allows
    **{f"request-policy-{name}": (
        res_slice(dev(allowMultipleAllocations=True,
                      capacity={"memory": {"value": "10Gi", "requestPolicy": policy}})),
        [(f"{C0}[memory].requestPolicy{where}", kind)])
       for name, policy, where, kind in (
        ("range-min-missing", {"validRange": {"step": "1Gi"}}, ".validRange.min", R),
        ("range-min-over-value", {"validRange": {"min": "11Gi"}}, ".validRange.min", INV),
        ("default-under-min", {"default": "1Gi", "validRange": {"min": "2Gi"}}, ".default",
         INV),
        ("max-over-value", {"validRange": {"min": "1Gi", "max": "20Gi"}}, ".validRange.max",
         INV),
        ("step-zero", {"validRange": {"min": "1Gi", "step": "0"}}, ".validRange.step", INV),
        ("step-past-value", {"validRange": {"min": "1Gi", "step": "10Gi"}},
         ".validRange.step", INV),
        ("default-off-step", {"default": "1536Mi", "validRange": {"min": "1Gi", "step": "1Gi"}},
         ".default", INV),
        ("max-off-step", {"validRange": {"min": "1Gi", "step": "2Gi", "max": "4Gi"}},
         ".validRange.max", INV),
        ("values-unsorted", {"validValues": ["2Gi", "1Gi"]}, ".validValues[1]", INV),
        ("values-over-value", {"validValues": ["1Gi", "20Gi"]}, ".validValues[1]", INV),
        ("default-not-a-value", {"default": "3Gi", "validValues": ["1Gi", "2Gi"]}, ".default",
         INV),
        ("range-and-values", {"validValues": ["1Gi"], "validRange": {"min": "1Gi"}}, "", F),
       )},
    # taints
    "17-taints": (res_slice(dev(taints=[taint()] * 17)), [(T0, TM)]),
    "taint-key-empty": (res_slice(dev(taints=[taint(key="")])),
                        [(f"{T0}[0].key", INV), (f"{T0}[0].key", INV)]),
    "taint-key-bad": (res_slice(dev(taints=[taint(key="example.com/bad key")])),
                      [(f"{T0}[0].key", INV)]),
    "taint-key-bad-prefix": (res_slice(dev(taints=[taint(key="Example.com/xid")])),
                             [(f"{T0}[0].key", INV)]),
    "taint-value-bad": (res_slice(dev(taints=[taint(value="bad value")])),
                        [(f"{T0}[0].value", INV)]),
    "taint-effect-unknown": (res_slice(dev(taints=[taint(effect="Sometimes")])),
                             [(f"{T0}[0].effect", U)]),
    "taint-effect-missing": (res_slice(dev(taints=[taint(effect=DROP)])),
                             [(f"{T0}[0].effect", R)]),
    # shared counters
    "9-counter-sets": (counters_slice(*[cset(f"s{i}") for i in range(9)]), [(S, TM)]),
    "33-counters": (counters_slice(cset(**{f"c{i}": "1" for i in range(33)})),
                    [(f"{S}[0].counters", TM)]),
    "counter-set-name-bad": (counters_slice(cset("Gpu-0")), [(f"{S}[0].name", INV)]),
    "counter-set-name-missing": (counters_slice({"counters": {"c": {"value": "1"}}}),
                                 [(f"{S}[0].name", R)]),
    "counter-name-bad": (counters_slice(cset(memory_slice="1")), [(f"{S}[0].counters", INV)]),
    "counters-empty": (counters_slice({"name": "s", "counters": {}}),
                       [(f"{S}[0].counters", R)]),
    "counter-set-duplicate": (counters_slice(cset("s"), cset("s")), [(f"{S}[1]", D)]),
    "counter-not-quantity": (counters_slice(cset(memory="x")),
                             [(f"{S}[0].counters[memory].value", INV)]),
    # consumesCounters
    "3-consumptions": (res_slice(dev(consumesCounters=[uses("a"), uses("b"), uses("c")])),
                       [(K0, TM)]),
    "33-consumed-counters": (res_slice(dev(consumesCounters=[
        uses(**{f"c{i}": "1" for i in range(33)})])), [(f"{K0}[0].counters", TM)]),
    "consumption-set-missing": (res_slice(dev(consumesCounters=[uses("")])),
                                [(f"{K0}[0].counterSet", R)]),
    "consumption-set-bad": (res_slice(dev(consumesCounters=[uses("A")])),
                            [(f"{K0}[0].counterSet", INV)]),
    "consumption-duplicate": (res_slice(dev(consumesCounters=[uses("a"), uses("a")])),
                              [(f"{K0}[1]", D)]),
    "consumption-counter-bad": (res_slice(dev(consumesCounters=[uses(Memory="1")])),
                                [(f"{K0}[0].counters", INV)]),
    "consumption-no-counters": (res_slice(dev(consumesCounters=[{"counterSet": "a"}])),
                                [(f"{K0}[0].counters", R)]),
    # JSON shape
    "spec-not-object": ({"metadata": {"name": NAME}, "spec": []}, [("spec", INV)]),
}


@pytest.mark.parametrize("obj", list(VALID.values()), ids=list(VALID))
def test_valid_slices_have_no_errors(obj):
    assert validate_slice(obj) == []


@pytest.mark.parametrize(("obj", "expected"), list(INVALID.values()), ids=list(INVALID))
def test_each_rule_reports_its_field_and_type(obj, expected):
    errors = validate_slice(obj)
    assert [(e.field, e.type) for e in errors] == expected, [str(e) for e in errors]


def test_validation_does_not_modify_its_input():
    obj = res_slice(dev(taints=[taint(effect="Sometimes")]))
    before = copy.deepcopy(obj)
    validate_slice(obj)
    assert obj == before


# --- messages -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (res_slice(dev("GPU-0")), f'spec.devices[0].name: Invalid value: "GPU-0": {LABEL_MSG}'),
        (res_slice(dev("gpu.0")), 'spec.devices[0].name: Invalid value: "gpu.0": '
                                  "must not contain dots"),
        (res_slice(*plain_devices(129)),
         "spec.devices: Too many: 129: must have at most 128 items"),
        (res_slice(dev(), dev()), 'spec.devices[1]: Duplicate value: "gpu-0"'),
        (res_slice(driver=DROP), "spec.driver: Required value"),
        (res_slice(nodeName=DROP),
         "spec: Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
         "`perDeviceNodeSelection` is required"),
        (res_slice(allNodes=True),
         'spec: Invalid value: "{`nodeName`, `allNodes`}": exactly one of `nodeName`, '
         "`nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple "
         "fields are set"),
        (res_slice(sharedCounters=[cset()]),
         'spec: Invalid value: "": only one of `sharedCounters` or `devices` is allowed'),
        (res_slice(attrs(x={"string": "s" * 65})),
         "spec.devices[0].attributes[x].string: Too long: may not be more than 64 bytes"),
        (res_slice(attrs(x={"version": "1.02.3"})),
         'spec.devices[0].attributes[x].version: Invalid value: "1.02.3": '
         "must be a string compatible with semver.org spec 2.0.0"),
        (res_slice(attrs(x={})),
         'spec.devices[0].attributes[x]: Invalid value: "": exactly one value must be specified'),
        (res_slice(attrs(**{"foo-bar": {"int": 1}})),
         'spec.devices[0].attributes: Invalid value: "foo-bar": a valid C identifier must start '
         "with alphabetic character or '_', followed by a string of alphanumeric characters or "
         "'_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex used for validation is "
         "'[A-Za-z_][A-Za-z0-9_]*')"),
        (res_slice(attrs(**{"a/b/c": {"int": 1}})),
         'spec.devices[0].attributes: Invalid value: "a/b/c": '
         "must not contain more than one slash"),
        (res_slice(dev(attributes={f"a{i}": {"int": i} for i in range(33)}, capacity=DROP)),
         "spec.devices[0]: Invalid value: 33: "
         "the total number of attributes and capacities must not exceed 32"),
        (res_slice(dev(capacity={"memory": {"value": "1", "requestPolicy": {}}})),
         "spec.devices[0].capacity[memory].requestPolicy: Forbidden: "
         "allowMultipleAllocations must be true"),
        (res_slice(dev(taints=[taint(effect="Sometimes")])),
         'spec.devices[0].taints[0].effect: Unsupported value: "Sometimes": '
         'supported values: "NoExecute", "NoSchedule", "None"'),
        (res_slice(dev(taints=[taint(value="bad value")])),
         'spec.devices[0].taints[0].value: Invalid value: "bad value": a valid label must be an '
         "empty string or consist of alphanumeric characters, '-', '_' or '.', and must start "
         "and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', "
         "regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"),
        (res_slice(pool={"name": "n", "resourceSliceCount": 0}),
         "spec.pool.resourceSliceCount: Invalid value: 0: must be greater than zero"),
        (res_slice(dev(allNodes=True)),
         "spec.devices[0]: Invalid value: null: `nodeName`, `nodeSelector` and `allNodes` can "
         "only be set if `perDeviceNodeSelection` is set to true in the ResourceSlice spec"),
        (res_slice(metadata={}), "metadata.name: Required value: name or generateName is required"),
    ],
)
def test_messages_match_the_apiserver(obj, message):
    assert [str(e) for e in validate_slice(obj)] == [message]


def test_brief_example_renders_exactly():
    error = FieldError("spec.devices[3].name", "Invalid value", "X", LABEL_MSG)
    assert str(error) == f'spec.devices[3].name: Invalid value: "X": {LABEL_MSG}'


def test_values_are_quoted_like_go():
    assert str(FieldError("f", "Invalid value", 'a"b\\c\n\x01é')) == (
        'f: Invalid value: "a\\"b\\\\c\\n\\x01é"')
    assert str(FieldError("f", "Invalid value", True, "d")) == "f: Invalid value: true: d"
    assert str(FieldError("f", "Invalid value", None, "d")) == "f: Invalid value: null: d"
    assert str(FieldError("f", "Too long", "hidden", "d")) == "f: Too long: d"


def test_format_invalid_with_one_error():
    errors = validate_slice(res_slice(dev("GPU-0")))
    assert format_invalid(NAME, errors) == (
        'ResourceSlice.resource.k8s.io "node-1-gpu.nvidia.com-gpu-0" is invalid: '
        f'spec.devices[0].name: Invalid value: "GPU-0": {LABEL_MSG}'
    )


def test_format_invalid_with_several_errors():
    obj = res_slice(dev(taints=[taint(effect="Sometimes")]),
                    pool={"name": "node-1", "resourceSliceCount": 0})
    assert format_invalid(NAME, validate_slice(obj)) == (
        'ResourceSlice.resource.k8s.io "node-1-gpu.nvidia.com-gpu-0" is invalid: ['
        "spec.pool.resourceSliceCount: Invalid value: 0: must be greater than zero, "
        'spec.devices[0].taints[0].effect: Unsupported value: "Sometimes": '
        'supported values: "NoExecute", "NoSchedule", "None"]'
    )


def test_format_invalid_collapses_identical_messages_and_handles_none():
    error = FieldError("spec.driver", "Required value")
    assert format_invalid("x", [error, error]) == (
        'ResourceSlice.resource.k8s.io "x" is invalid: spec.driver: Required value')
    assert format_invalid("x", []) == 'ResourceSlice.resource.k8s.io "x" is invalid'


# --- pool -----------------------------------------------------------------------------------


def pool_of(*slices: dict[str, Any], generation: int = 1) -> list[dict[str, Any]]:
    for i, obj in enumerate(slices):
        obj["metadata"]["name"] = f"node-1-gpu.nvidia.com-{i}"
        obj["spec"]["pool"] = {"name": "node-1", "generation": generation,
                               "resourceSliceCount": len(slices)}
    return list(slices)


def partitioned_pool() -> list[dict[str, Any]]:
    return pool_of(
        counters_slice(cset(memory="40Gi", **{"memory-slice-0": "1"})),
        res_slice(dev("gpu-0", consumesCounters=[uses(memory="40960Mi",
                                                      **{"memory-slice-0": "1"})]),
                  dev("gpu-0-mig-1g5gb-0", consumesCounters=[uses(memory="5Gi")])),
        res_slice(dev("gpu-1")),
    )


def with_change(change: Any) -> list[dict[str, Any]]:
    slices = partitioned_pool()
    change(slices)
    return slices


POOL_CASES = {
    "generation-mismatch": (
        lambda s: s[2]["spec"]["pool"].update(generation=2),
        [("items[2].spec.pool.generation", INV)]),
    "count-mismatch": (
        lambda s: [obj["spec"]["pool"].update(resourceSliceCount=2) for obj in s],
        [(f"items[{i}].spec.pool.resourceSliceCount", INV) for i in range(3)]),
    "pool-name-mismatch": (
        lambda s: s[1]["spec"]["pool"].update(name="node-2"), [("items[1].spec.pool.name", INV)]),
    "driver-mismatch": (
        lambda s: s[2]["spec"].update(driver="other.example.com"), [("items[2].spec.driver", INV)]),
    "duplicate-device": (
        lambda s: s[2]["spec"]["devices"][0].update(name="gpu-0"),
        [("items[2].spec.devices[0]", D)]),
    "duplicate-counter-set": (
        lambda s: s.insert(1, counters_slice(cset())) or pool_of(*s),
        [("items[1].spec.sharedCounters[0]", D)]),
    "unknown-counter-set": (
        lambda s: s[1]["spec"]["devices"][1]["consumesCounters"][0].update(counterSet="nope"),
        [("items[1].spec.devices[1].consumesCounters[0].counterSet", INV)]),
    "unknown-counter": (
        lambda s: s[1]["spec"]["devices"][1]["consumesCounters"][0]["counters"].update(
            nope={"value": "1"}),
        [("items[1].spec.devices[1].consumesCounters[0].counters[nope]", INV)]),
    "consumption-exceeds-counter": (
        lambda s: s[1]["spec"]["devices"][1]["consumesCounters"][0]["counters"].update(
            memory={"value": "41Gi"}),
        [("items[1].spec.devices[1].consumesCounters[0].counters[memory].value", INV)]),
}


def test_a_consistent_pool_is_valid():
    slices = partitioned_pool()
    assert validate_pool(slices) == []
    ensure_valid(slices)
    assert validate_pool([]) == []


@pytest.mark.parametrize(("change", "expected"), list(POOL_CASES.values()), ids=list(POOL_CASES))
def test_pool_rules(change, expected):
    errors = validate_pool(with_change(change))
    assert [(e.field, e.type) for e in errors] == expected, [str(e) for e in errors]


def test_pool_messages():
    slices = with_change(POOL_CASES["consumption-exceeds-counter"][0])
    slices[2]["spec"]["devices"][0]["name"] = "gpu-0"
    assert [str(e) for e in validate_pool(slices)] == [
        'items[2].spec.devices[0]: Duplicate value: "gpu-0": '
        "already defined at items[1].spec.devices[0]",
        'items[1].spec.devices[1].consumesCounters[0].counters[memory].value: Invalid value: '
        '"41Gi": must not exceed the counter\'s value in counter set "gpu-0-counter-set" '
        "(42949672960)",
    ]


# --- ensure_valid ---------------------------------------------------------------------------


def test_ensure_valid_raises_with_every_problem():
    slices = partitioned_pool()
    slices[2]["spec"]["devices"][0]["name"] = "GPU-1"
    slices[1]["spec"]["pool"]["generation"] = 0
    with pytest.raises(SliceValidationError) as caught:
        ensure_valid(slices)

    assert str(caught.value) == "\n".join([
        'ResourceSlice.resource.k8s.io "node-1-gpu.nvidia.com-2" is invalid: '
        f'spec.devices[0].name: Invalid value: "GPU-1": {LABEL_MSG}',
        'ResourceSlice pool "node-1" is invalid: '
        "items[1].spec.pool.generation: Invalid value: 0: must equal the generation of "
        "items[0] (1)",
    ])
    assert [(e.field, e.type) for e in caught.value.errors] == [
        ("items[2].spec.devices[0].name", INV),
        ("items[1].spec.pool.generation", INV),
    ]

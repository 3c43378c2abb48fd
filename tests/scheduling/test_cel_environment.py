"""The DRA CEL environment behaves like the one kube-scheduler evaluates selectors in.

Every row pins one behaviour of the Kubernetes environment (dra-interfaces.md §6 and the
observations on a real 1.36 scheduler in §6.1): ``True``/``False`` is the selector's
answer, ``Err("text")`` a runtime error whose message contains ``text``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpudra.scheduling.cel import CelEvalError, compile_selector, device_view

DRIVER = "gpu.nvidia.com"
A = "device.attributes['gpu.nvidia.com']"
C = "device.capacity['gpu.nvidia.com']"

DEVICE = {
    "name": "gpu-0",
    "attributes": {
        "type": {"string": "gpu"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "driverVersion": {"version": "580.95.5"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "numaNode": {"int": 1},
        "migCapable": {"bool": True},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:10"},
        "example.com/zone": {"string": "a"},
        "ids": {"ints": [1, 2, 3]},
    },
    "capacity": {
        "memory": {"value": "81559Mi"},
        "multiprocessors": {"value": "132"},
        "example.com/bandwidth": {"value": "1500m"},
    },
}


@dataclass(frozen=True)
class Err:
    text: str


def answer(expression: str, device: dict = DEVICE, driver: str = DRIVER) -> bool | Err:
    try:
        return compile_selector(expression).matches(device_view(driver, device))
    except CelEvalError as exc:
        return Err(str(exc))


CASES = [
    # --- the device variable and domain mapping ---
    ("device.driver == 'gpu.nvidia.com'", True),
    (f"{A}.type == 'gpu'", True),
    ("device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:10'", True),
    ("device.attributes['example.com'].zone == 'a'", True),
    (f"{C}.multiprocessors == quantity('132')", True),
    ("device.capacity['example.com'].bandwidth == quantity('1.5')", True),
    ("device.allowMultipleAllocations == false", True),
    (f"{A}.ids == [1, 2, 3]", True),
    # unknown domain: an empty map, so the error is on the attribute, not the domain
    ("device.attributes['amd.com'].size() == 0", True),
    ("device.attributes['amd.com'].model == 'x'", Err("no such key: model")),
    ("'gpu.nvidia.com' in device.attributes", True),
    ("'amd.com' in device.attributes", False),
    # missing attribute: a runtime error, not false
    (f"{A}.productNmae == 'x'", Err("no such key: productNmae")),
    (f"has({A}.productName)", True),
    (f"has({A}.productNmae)", False),
    (f"{A}.?numaNode.orValue(-1) == 1", True),
    (f"{A}.?nosuch.orValue(-1) == -1", True),
    (f"{A}.?nosuch.hasValue()", False),
    # && and || absorb an error when the other side decides
    (f"device.driver == 'other' && {A}.nosuch == 1", False),
    (f"{A}.nosuch == 1 && device.driver == 'other'", False),
    (f"{A}.nosuch == 1 || true", True),
    (f"true || {A}.nosuch == 1", True),
    (f"{A}.nosuch == 1 && true", Err("no such key")),
    # versions are Semver objects
    (f"{A}.driverVersion == '580.95.5'", Err("no such overload")),
    (f"'580.95.5' == {A}.driverVersion", False),
    (f"{A}.driverVersion == semver('580.95.5')", True),
    (f"{A}.driverVersion.isGreaterThan(semver('550.0.0'))", True),
    (f"{A}.driverVersion.compareTo(semver('580.95.5')) == 0", True),
    (f"{A}.driverVersion.major() >= 580", True),
    # (statically refused: no '<' takes a Semver; test_cel_types has that side)
    (f"dyn({A}.driverVersion) < dyn(semver('600.0.0'))", Err("no such overload")),
    # heterogeneous equality, but no mixed ordering
    (f"{A}.numaNode == '1'", False),
    (f"{A}.numaNode != '1'", True),
    (f"{A}.numaNode > '0'", Err("no such overload")),
    (f"{A}.numaNode == 1.0", True),
    (f"{A}.numaNode < 1.5", True),
    # (dyn() keeps the type check from refusing what the runtime would answer)
    ("dyn(true) == 1", False),
    ("[1, 'a'] == [1, 'a']", True),
    ("{'a': 1} == dyn({'a': 1.0})", True),
    ("dyn(1) + 1u == 2u", Err("no such overload")),
    ("1 / 0 == 1", Err("division by zero")),
    # quantities compare by value, through methods
    (f"{C}.memory == quantity('81559Mi')", True),
    ("quantity('1Gi') == quantity('1024Mi')", True),
    (f"dyn({C}.memory) == 85520809984", Err("no such overload")),
    (f"dyn({C}.memory) > dyn(quantity('1Gi'))", Err("no such overload")),
    (f"{C}.memory.compareTo(quantity('80Gi')) < 0", True),
    (f"{C}.memory.isGreaterThan(quantity('40Gi'))", True),
    (f"{C}.memory.isLessThan(quantity('40Gi'))", False),
    (f"{C}.memory.isGreaterThan(quantity('80 GiB'))", Err("quantities must match")),
    # strings
    (f"{A}.productName.lowerAscii().matches('^nvidia h100')", True),
    (f"{A}.productName.upperAscii().contains('HBM3')", True),
    (f"{A}.productName.startsWith('NVIDIA') && {A}.productName.endsWith('HBM3')", True),
    (f"{A}.productName.split(' ')[1] == 'H100'", True),
    (f"{A}.productName.replace(' ', '-') == 'NVIDIA-H100-80GB-HBM3'", True),
    ("'  x '.trim() == 'x'", True),
    (f"{A}.productName.size() == 21", True),
    (f"size({A}.productName) == 21", True),
    (f"{A}.productName.matches('a100')", False),
    # macros
    (f"{A}.exists(k, k == 'uuid')", False),
    (f"{A}.ids.all(i, i > 0)", True),
    (f"{A}.ids.exists_one(i, i == 2)", True),
    (f"{A}.ids.map(i, i * 2) == [2, 4, 6]", True),
    (f"{A}.ids.filter(i, i > 1).size() == 2", True),
    # the result must be a bool
    (f"{A}.numaNode", Err("could not be converted to bool")),
    (f"{A}.migCapable", True),
]


@pytest.mark.parametrize(("expression", "expected"), CASES, ids=[c[0] for c in CASES])
def test_behaves_like_kubernetes(expression, expected):
    got = answer(expression)
    if isinstance(expected, Err):
        assert isinstance(got, Err), f"expected an error, got {got!r}"
        assert expected.text in got.text
    else:
        assert got is expected


def test_unqualified_names_belong_to_the_devices_driver():
    device = {"name": "d", "attributes": {"model": {"string": "x"}}}
    assert answer("device.attributes['other.example.com'].model == 'x'", device,
                  driver="other.example.com") is True
    assert answer("device.attributes['other.example.com'].size() == 0", device) is True


def test_semver_attribute_that_is_not_semver_is_a_runtime_error():
    device = {"name": "d", "attributes": {"driverVersion": {"version": "580.95.05"}}}
    got = answer(f"{A}.driverVersion.major() == 580", device)
    assert isinstance(got, Err) and "not semver" in got.text


def test_evaluations_are_cached_by_the_values_the_expression_reads():
    selector = compile_selector(f"{A}.productName == 'NVIDIA H100 80GB HBM3' && "
                                f"{C}.memory.isGreaterThan(quantity('1Gi'))")
    before = selector.evaluations
    for i in range(50):
        device = {**DEVICE, "name": f"gpu-{i}",
                  "attributes": {**DEVICE["attributes"], "uuid": {"string": f"GPU-{i}"}}}
        assert selector.matches(device_view(DRIVER, device))
    assert selector.evaluations - before <= 1
    other = {**DEVICE, "capacity": {"memory": {"value": "512Mi"}}}
    assert not selector.matches(device_view(DRIVER, other))
    assert selector.evaluations - before <= 2


def test_whole_map_expressions_are_cached_per_device_content():
    selector = compile_selector(f"{A}.exists(k, k == 'uuid')")
    with_uuid = {**DEVICE, "attributes": {**DEVICE["attributes"], "uuid": {"string": "u"}}}
    assert selector.matches(device_view(DRIVER, with_uuid))
    assert not selector.matches(device_view(DRIVER, DEVICE))


def test_errors_are_cached_too():
    selector = compile_selector(f"{A}.nosuchAttribute == 1")
    for _ in range(3):
        with pytest.raises(CelEvalError, match="no such key: nosuchAttribute"):
            selector.matches(device_view(DRIVER, DEVICE))
    assert isinstance(selector.result(device_view(DRIVER, DEVICE)), CelEvalError)


def test_compiled_selectors_are_shared():
    assert compile_selector("device.driver == 'a'") is compile_selector("device.driver == 'a'")

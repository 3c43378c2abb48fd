"""CEL as the 1.36 API server and scheduler do it: static types, ``cel.bind``, ``string()``.

One table per behaviour: the expression, and what happens to it: ``Refused("text")`` when
the API server refuses the claim at create (the type check), otherwise the selector's
answer for the H100 of ``test_cel_environment`` (``True``/``False``, or ``Err("text")`` for
a runtime error that makes the scheduler abort the allocation).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpudra.scheduling.cel import CelCompileError, CelEvalError, compile_selector, device_view
from tests.scheduling.test_cel_environment import DEVICE, DRIVER, Err

A = "device.attributes['gpu.nvidia.com']"
C = "device.capacity['gpu.nvidia.com']"


@dataclass(frozen=True)
class Refused:
    text: str


def verdict(expression: str) -> bool | Err | Refused:
    try:
        selector = compile_selector(expression)
    except CelCompileError as exc:
        assert not exc.unsupported, exc
        return Refused(str(exc))
    try:
        return selector.matches(device_view(DRIVER, DEVICE))
    except CelEvalError as exc:
        return Err(str(exc))


def check(expression: str, expected: bool | Err | Refused) -> None:
    got = verdict(expression)
    if isinstance(expected, bool):
        assert got is expected
    else:
        assert type(got) is type(expected), f"expected {expected!r}, got {got!r}"
        assert expected.text in got.text, got.text


NO_MATCH = "found no matching overload for "

STATIC_TYPES = [
    # capacities are Quantities: mixing them with strings or numbers is refused at create
    (f"{C}.memory >= '60Gi'", Refused(NO_MATCH + "'_>=_' applied to "
                                      "'(kubernetes.Quantity, string)' (line 1, column 42)")),
    (f"{C}.memory == 85520809984", Refused("'(kubernetes.Quantity, int)'")),
    (f"{C}.memory > quantity('1Gi')", Refused("'(kubernetes.Quantity, kubernetes.Quantity)'")),
    (f"{C}.memory.isGreaterThan('80Gi')",
     Refused(NO_MATCH + "'isGreaterThan' applied to 'kubernetes.Quantity.(string)'")),
    (f"{C}.memory.asInteger() > '1'", Refused("'_>_' applied to '(int, string)'")),
    (f"{C}.memory.productName == 'x'",
     Refused("type 'kubernetes.Quantity' does not support field selection")),
    (f"string({C}.memory) == '81559Mi'", Refused("'string' applied to '(kubernetes.Quantity)'")),
    ("quantity('1') == semver('1.0.0')", Refused("'(kubernetes.Quantity, kubernetes.Semver)'")),
    # the selector must be a bool (or of unknown type)
    (f"{C}.memory", Refused("must evaluate to bool or the unknown type, not "
                            "kubernetes.Quantity")),
    (f"{C}.memory.compareTo(quantity('80Gi'))", Refused("not int")),
    ("device.driver.size()", Refused("not int")),
    ("device.driver", Refused("not string")),
    # Semver values: no operators but == and !=
    (f"{A}.driverVersion < semver('600.0.0')", Refused("'_<_' applied to "
                                                       "'(dyn, kubernetes.Semver)'")),
    ("semver('1.0.0').major() == '1'", Refused("'_==_' applied to '(int, string)'")),
    ("isSemver(1)", Refused("'isSemver' applied to '(int)'")),
    # declared fields and functions
    ("device.driver == 1", Refused("'_==_' applied to '(string, int)'")),
    ("device.allowMultipleAllocations == 'true'", Refused("'(bool, string)'")),
    ("device.driver.startsWith(1)", Refused("'startsWith' applied to 'string.(int)'")),
    (f"{A}.productName.contains(1)", Refused("'contains' applied to 'dyn.(int)'")),
    ("device.attributes[1].x == 1",
     Refused("'_[_]' applied to '(map(string, map(string, dyn)), int)'")),
    ("1 == 1.0", Refused("'_==_' applied to '(int, double)'")),
    ("true ? 1 : 'a'", Refused("'_?_:_' applied to '(bool, int, string)'")),
    ("[1, 2].all(x, x)", Refused("'_&&_' applied to '(bool, int)'")),
    ("device.driver.exists(c, c == 'a')",
     Refused("expression of type 'string' cannot be range of a comprehension")),
    # attribute values are dyn: these type-check, and the device decides
    (f"{A}.productName == 'NVIDIA H100 80GB HBM3'", True),
    (f"{A}.productName.contains('H100') && {A}.numaNode + 1 == 2", True),
    (f"{A}.migCapable", True),
    (f"{A}.numaNode", Err("could not be converted to bool")),
    (f"{A}.driverVersion == '580.95.5'", Err("no such overload")),
    (f"{A}.numaNode > '0'", Err("no such overload")),
    (f"{A}.?numaNode.orValue(-1) == 1", True),
    (f"{A}.driverVersion.isGreaterThan(semver('550.0.0'))", True),
    (f"{C}.memory.compareTo(quantity('80Gi')) >= 0", False),
    (f"{C}.memory.isGreaterThan(quantity('79Gi'))", True),
    ("[1, 'a'].size() == 2", True),
    ("device.attributes['amd.com'].size() == 0", True),
]


@pytest.mark.parametrize(("expression", "expected"), STATIC_TYPES,
                         ids=[c[0] for c in STATIC_TYPES])
def test_static_types_as_the_apiserver_checks_them(expression, expected):
    check(expression, expected)


BIND = [
    (f"cel.bind(a, {A}, a.type == 'gpu' && a.numaNode == 1)", True),
    (f"cel.bind(m, {C}.memory, m.isGreaterThan(quantity('40Gi')) && "
     "m.isLessThan(quantity('100Gi')))", True),
    (f"cel.bind(a, {A}, [0, 1].exists(i, i == a.numaNode))", True),
    ("cel.bind(x, 1, cel.bind(y, x + 1, y == 2))", True),
    ("cel.bind(device, 1, device == 1)", True),
    # the value is bound lazily: an error in it only counts when the body reads it
    (f"cel.bind(x, {A}.nosuch, true)", True),
    (f"cel.bind(x, {A}.nosuch, x == 1)", Err("no such key: nosuch")),
    # the bound value keeps its static type
    (f"cel.bind(m, {C}, m.memory > 1)", Refused("'(kubernetes.Quantity, int)'")),
    ("cel.bind(d, device, d.model == 'x')", Refused("undefined field 'model'")),
    ("cel.bind(1, 2, true)", Refused("cel.bind() needs a variable name")),
]


@pytest.mark.parametrize(("expression", "expected"), BIND, ids=[c[0] for c in BIND])
def test_cel_bind_allocates_as_on_a_real_scheduler(expression, expected):
    check(expression, expected)


STRING = [
    (f"string({A}.driverVersion) == '580.95.5'", Err("no such overload")),
    (f"string({A}.driverVersion.major()) == '580'", True),
    (f"string({A}.productName) == 'NVIDIA H100 80GB HBM3'", True),
    (f"string({A}.numaNode) == '1'", True),
    (f"string({A}.migCapable) == 'true'", True),
    ("string(1.5) == '1.5' && string(b'ab') == 'ab'", True),
    ("string(semver('1.0.0')) == '1.0.0'", Refused("'string' applied to '(kubernetes.Semver)'")),
]


@pytest.mark.parametrize(("expression", "expected"), STRING, ids=[c[0] for c in STRING])
def test_string_of_a_version_is_a_runtime_error(expression, expected):
    check(expression, expected)


def test_a_type_error_says_how_to_write_it():
    with pytest.raises(CelCompileError) as caught:
        compile_selector(f"{C}.memory >= '60Gi'")
    assert caught.value.hint == ("quantities are compared with methods: "
                                 f"{C}.memory.compareTo(quantity('60Gi')) >= 0")
    with pytest.raises(CelCompileError) as caught:
        compile_selector(f"'60Gi' < {C}.memory")
    assert caught.value.hint is not None
    assert caught.value.hint.endswith(f"{C}.memory.compareTo(quantity('60Gi')) > 0")

"""What is rejected before any device is looked at, and what an expression is known to read."""

from __future__ import annotations

import pytest

from gpudra.api.api_limits import CEL_SELECTOR_EXPRESSION_MAX_LENGTH
from gpudra.scheduling.cel import CelCompileError, compile_selector
from gpudra.scheduling.cel.checks import Footprint

A = "device.attributes['gpu.nvidia.com']"


@pytest.mark.parametrize(("expression", "message", "column"), [
    ("device.driver == ", "Syntax error: unexpected end of input", None),
    ("device.driver == 'a' &&& true", "Syntax error", 24),
    ("device.driver = 'a'", "Syntax error", 15),
    ("foo(device.driver)", "undeclared reference to 'foo'", 1),
    ("device.driver.lowerCase() == 'a'", "undeclared reference to 'lowerCase'", 15),
    ("gpu.driver == 'a'", "undeclared reference to 'gpu'", 1),
    ("device.model == 'a'", "undefined field 'model'", 8),
    (f"{A}.productName.matches('(')", "invalid regular expression '('", None),
    (f"{A}.productName.matches('(?=H)')", "invalid regular expression", None),
    ("device['attributes'].size() > 0", "found no matching overload for '_[_]' applied to "
     "'(kubernetes.DRADevice, string)'", None),
    ("cel.foo(1)", "undeclared reference to 'cel.foo'", 5),
    ("cel.bind(x, 1)", "cel.bind() needs a variable name, a value and an expression", 5),
    ("1 + 2", "must evaluate to bool", 1),
    ("'gpu'", "must evaluate to bool", 1),
    (f"{A}.productName.lowerAscii()", "must evaluate to bool", 1),
    ("quantity('1')", "must evaluate to bool", 1),
    ("   ", "expression is empty", None),
])
def test_rejected_like_the_apiserver(expression, message, column):
    with pytest.raises(CelCompileError) as caught:
        compile_selector(expression)
    assert message in str(caught.value)
    assert not caught.value.unsupported
    if column is not None:
        assert caught.value.column == column
        assert caught.value.line == 1


def test_expression_length_limit():
    padding = " " * (CEL_SELECTOR_EXPRESSION_MAX_LENGTH - len("true"))
    compile_selector(padding + "true")
    with pytest.raises(CelCompileError, match="too long"):
        compile_selector(padding + " true")


@pytest.mark.parametrize("expression", [
    "sets.contains([1], [1])",
    f"{A}.productName.format([1]) == 'a'",
    "[1, 2].isSorted()",
    "ip('10.0.0.1').family() == 4",
])
def test_valid_kubernetes_cel_this_evaluator_lacks_is_flagged_unsupported(expression):
    with pytest.raises(CelCompileError) as caught:
        compile_selector(expression)
    assert caught.value.unsupported
    assert "not supported by the local CEL evaluator" in str(caught.value)


@pytest.mark.parametrize("expression", [
    # bad literals are only found at scheduling time, as in Kubernetes
    "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('80 GiB'))",
    f"{A}.driverVersion.isGreaterThan(semver('580.95.05'))",
    # macro variables are in scope
    f"{A}.exists(k, k.startsWith('cuda'))",
    "[1, 2].all(x, x > 0) && [1].exists(device, device == 1)",
    f"type({A}.numaNode) == int",
    f"{A}.?numaNode.orValue(0) == 0",
    # ext.Bindings: Kubernetes adds it for DRA selectors, and the local evaluator runs it
    "cel.bind(x, device.driver, x == 'a')",
])
def test_accepted(expression):
    compile_selector(expression)


@pytest.mark.parametrize(("expression", "footprint"), [
    ("device.driver == 'gpu.nvidia.com'", Footprint(driver=True)),
    (f"{A}.type == 'gpu'", Footprint(attributes=(("gpu.nvidia.com", "type"),))),
    ("device.attributes['gpu.nvidia.com'].profile == '1g.10gb' && "
     "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('1Gi'))",
     Footprint(attributes=(("gpu.nvidia.com", "profile"),),
               capacities=(("gpu.nvidia.com", "memory"),))),
    (f"has({A}.numaNode) && {A}.?numaNode.orValue(0) > 0 && {A}['numaNode'] >= 0",
     Footprint(attributes=(("gpu.nvidia.com", "numaNode"),))),
    ("(device.attributes)['resource.kubernetes.io'].pcieRoot == 'x'",
     Footprint(attributes=(("resource.kubernetes.io", "pcieRoot"),))),
    ("device.allowMultipleAllocations", Footprint(allow_multiple=True)),
    ("'gpu.nvidia.com' in device.attributes", Footprint(whole=True)),
    (f"{A}.exists(k, k == 'uuid')", Footprint(whole=True)),
    (f"size({A}) > 3", Footprint(whole=True)),
    # (indexing ``device`` itself does not type-check: it is an object, not a map)
    ("dyn(device)['attributes']['gpu.nvidia.com'].type == 'gpu'", Footprint(whole=True)),
    ("dyn(device).driver == 'x'", Footprint(whole=True)),
    ("[device.attributes['gpu.nvidia.com']].exists(a, a.type == 'gpu')", Footprint(whole=True)),
])
def test_footprint(expression, footprint):
    assert compile_selector(expression).footprint == footprint


def test_references_and_comparisons_for_validate():
    analysis = compile_selector(
        f"{A}.driverVersion == '580.95.5' && has({A}.numaNode) && "
        "quantity('80 GiB') == quantity('1')").analysis
    names = [(r.name, r.guarded) for r in analysis.references]
    assert names == [("driverVersion", False), ("numaNode", True)]
    (comparison,) = analysis.comparisons
    assert (comparison.reference.name, comparison.op, comparison.literal_type,
            comparison.literal) == ("driverVersion", "==", "string", "580.95.5")
    assert [(c.function, c.argument) for c in analysis.literal_calls] == [
        ("quantity", "80 GiB"), ("quantity", "1")]
    assert analysis.references[0].column == len(A) + 2

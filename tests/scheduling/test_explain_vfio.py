"""``explain`` and the vfio devices: a GPU passed through to a VM is named as such when that
is why a claim for the GPU (or a part of it) does not fit, and the other way round."""

from __future__ import annotations

from typing import Any

import pytest

from gpudra.driver.inventory import NodeInventory
from gpudra.scheduling.allocator import Allocator
from gpudra.scheduling.explain import explain
from gpudra.scheduling.explain_subjects import subjects
from tests.driver.test_vfio_model import _classes, _detach, claim, h100, slices

__all__ = ["_detach", "h100"]  # fixtures


def _reasons(h100: NodeInventory, taken: dict[str, Any], wanted: dict[str, Any],
             *, mig: bool) -> list[str]:
    allocator = Allocator(slices(h100, mig=mig), _classes(), [taken])
    (subject,), _ = subjects([wanted])
    explanation = explain(subject, allocator, ["n"])
    (summary,) = explanation.requests
    assert summary.matching == 0
    return list(summary.reasons)


@pytest.mark.parametrize("mig", [False, True], ids=["full-gpus", "dynamic-mig"])
def test_a_gpu_taken_as_vfio_is_named(h100, mig):
    uuid = next(g.probe.uuid for g in h100.gpus if g.probe.minor == 0)
    reasons = _reasons(h100, claim("vm", "vfio.gpu.nvidia.com", allocated=["gpu-vfio-0"]),
                       claim("pod", "gpu.nvidia.com", uuid=uuid), mig=mig)
    assert any(r.startswith("held by allocated vfio device gpu-vfio-0 (the GPU is taken as "
                            "vfio: passed through to a VM) (the same GPU: counter set ")
               for r in reasons), reasons


def test_a_vfio_claim_names_the_gpu_that_holds_it(h100):
    uuid = next(g.probe.uuid for g in h100.gpus if g.probe.minor == 0)
    reasons = _reasons(h100, claim("pod", "gpu.nvidia.com", allocated=["gpu-0"]),
                       claim("vm", "vfio.gpu.nvidia.com", uuid=uuid), mig=False)
    assert any(r.startswith("held by allocated GPU gpu-0 (the same GPU") for r in reasons), \
        reasons

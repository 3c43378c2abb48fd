"""The chart's opt-ins of issue 30 item 5: MIG mode switches on A100/A30 GPUs and the
recovery taint's effect reach the node daemon's flags; the defaults add no flag; bad values
fail the install with the schema's error."""

from __future__ import annotations

from tests.deploy.test_chart import container, render_error


def args(values: dict | None = None) -> list[str]:
    return [a for a in container(values)["args"]
            if a.startswith(("--allow-mig-mode-change", "--recovery-taint-effect"))]


def test_defaults_render_no_opt_in():
    assert args() == []


def test_opt_ins_reach_the_flags():
    assert args({"dynamicMig": {"allowModeChange": "0,GPU-1b2c"},
                 "recoveryTaintEffect": "NoExecute"}) == [
        "--allow-mig-mode-change=0,GPU-1b2c", "--recovery-taint-effect=NoExecute"]


def test_bad_values_fail_the_install():
    assert "allowModeChange" in render_error({"dynamicMig": {"allowModeChange": "some"}})
    assert "recoveryTaintEffect" in render_error({"recoveryTaintEffect": "Evict"})

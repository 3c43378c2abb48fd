"""``gpudra top`` rendering from a daemon's metrics text (the live daemon: tests/integration)."""

from __future__ import annotations

import pytest

from gpudra.cli.top_cmd import (
    Snapshot,
    claim_status_rows,
    human_duration,
    join,
    parse_rows,
    render,
)

LABELS = 'namespace="ml",claim="{claim}",pod="{pod}",device="{device}",gpu_uuid="GPU-1",' \
         'mig_profile="{profile}",share_id=""'


def metrics(*rows: tuple[str, str, str, str, float | None, int, float]) -> str:
    lines = []
    for claim, pod, device, profile, sm, memory, idle in rows:
        labels = LABELS.format(claim=claim, pod=pod, device=device, profile=profile)
        if sm is not None:
            lines.append(f"gpudra_claim_sm_utilization_percent{{{labels}}} {sm}")
        lines.append(f"gpudra_claim_memory_used_bytes{{{labels}}} {memory}")
        lines.append(f"gpudra_claim_memory_total_bytes{{{labels}}} {80 * 2**30}")
        lines.append(f'gpudra_claim_idle_seconds{{namespace="ml",claim="{claim}",pod="{pod}"}} '
                     f"{idle}")
    return "\n".join(lines) + "\n"


TEXT = metrics(("train", "t-0", "gpu-0", "", 85, 40 * 2**30, 0),
               ("notebook", "j-0", "gpu-3", "", 1, 2**30, 8040),
               ("small", "", "gpu-1-mig-1g5gb-19-3", "1g.5gb", None, 3 * 2**30, 0))


@pytest.mark.parametrize(("sort", "order"), [
    ("util", ["train", "notebook", "small"]),
    ("idle", ["notebook", "small", "train"]),
    ("memory", ["train", "small", "notebook"]),
])
def test_rows_sort_highest_first(sort, order):
    lines = render(Snapshot(parse_rows("e", TEXT), asked=1), "table", sort).splitlines()
    assert [line.split()[1] for line in lines[1:]] == order


def test_a_mig_device_without_an_sm_figure_says_so():
    text = render(Snapshot(parse_rows("e", TEXT), asked=1), "table", "util")
    [row] = [line for line in text.splitlines() if "small" in line]
    assert row.split() == ["ml", "small", "-", "gpu-1-mig-1g5gb-19-3", "(1g.5gb)", "n/a",
                           "3.0/80.0Gi", "-", "-"]


def test_no_claims_and_an_unreachable_daemon():
    empty = Snapshot([], {"http://b:8080": "timed out"}, asked=2)
    assert render(empty, "table", "util") == (
        "No prepared claims.\nhttp://b:8080: unreachable (timed out)\n")
    alone = Snapshot([], {"http://b:8080": "timed out"}, asked=1)
    assert render(alone, "table", "util") == "http://b:8080: unreachable (timed out)\n"


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "-"), (0.4, "-"), (45, "45s"), (60, "1m"), (3599, "59m"), (3600, "1h"), (8040, "2h14m"),
    (86400 * 2 + 3600 * 4, "2d4h"), (86400, "1d"),
])
def test_idle_time_reads_like_kubectl_age(seconds, text):
    assert human_duration(seconds) == text


def test_cluster_rows_take_the_figures_of_the_matching_daemon_rows():
    claims = [{"metadata": {"namespace": "ml", "name": "train"},
               "status": {"devices": [
                   {"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0",
                    "conditions": [{"type": "Idle", "status": "False",
                                    "lastTransitionTime": "2020-01-01T00:00:00Z"}]},
                   {"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-9"}]}}]
    rows = join(claim_status_rows(claims, "gpu.nvidia.com", now=0.0),
                parse_rows("http://a:8080", TEXT))
    assert [(r.device, r.node, r.sm_percent, r.endpoint) for r in rows] == [
        ("gpu-0", "node-a", 85, "http://a:8080"), ("gpu-9", "node-a", None, "")]
    assert rows[0].idle_seconds == 0  # Idle False: active

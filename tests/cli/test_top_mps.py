"""``gpudra top``'s MPS column: where a share's MPS control daemon runs, from the daemon's
metrics (per node) or the claims' status (cluster-wide)."""

from __future__ import annotations

from gpudra.cli.top_cmd import Snapshot, claim_status_rows, join, parse_rows, render

POD = "gpudra-system/gpudra-mps-733990ad7285ecc5ff2a"


def share_metrics(where: str) -> str:
    labels = ('namespace="ml",claim="{claim}",pod="p",device="gpu-0-shared",'
              'gpu_uuid="GPU-1",mig_profile="",share_id="{share}"')
    lines = []
    for claim, share in (("a", "5a5a"), ("b", "5b5b")):
        lines.append(f"gpudra_claim_memory_used_bytes{{{labels.format(claim=claim, share=share)}}}"
                     f" {2**30}")
    lines.append(f'gpudra_claim_memory_used_bytes{{namespace="ml",claim="whole",pod="q",'
                 f'device="gpu-1",gpu_uuid="GPU-2",mig_profile="",share_id=""}} {2**30}')
    lines.append(f'gpudra_mps_control_daemons{{daemon="shared-GPU-1",gpu_uuid="GPU-1",'
                 f'where="{where}"}} 1')
    return "\n".join(lines) + "\n"


def test_shares_name_their_gpus_daemon_pod_and_whole_gpus_none():
    rows = parse_rows("http://a:8080", share_metrics(f"pod {POD}"))
    by_claim = {r.claim: r for r in rows}
    assert by_claim["a"].mps == by_claim["b"].mps == f"pod {POD}"
    assert by_claim["whole"].mps == ""
    table = render(Snapshot(rows=rows, asked=1), "table", "util")
    header, *lines = table.splitlines()
    assert header.split()[-1] == "MPS"
    cells = {line.split()[1]: line.split()[-1] for line in lines}
    assert cells == {"a": "gpudra-mps-733990ad7285ecc5ff2a",
                     "b": "gpudra-mps-733990ad7285ecc5ff2a", "whole": "-"}
    assert POD in render(Snapshot(rows=rows, asked=1), "wide", "util")
    assert f'"mpsControlDaemon": "pod {POD}"' in render(Snapshot(rows=rows, asked=1), "json",
                                                         "util")


def test_a_daemon_in_the_plugin_container_reads_plugin():
    rows = parse_rows("http://a:8080", share_metrics("plugin container"))
    text = render(Snapshot(rows=rows, asked=1), "table", "util")
    assert {line.split()[-1] for line in text.splitlines()[1:]} == {"plugin", "-"}


def test_no_mps_column_without_mps():
    rows = parse_rows("http://a:8080", share_metrics("x").split("gpudra_mps")[0])
    assert "MPS" not in render(Snapshot(rows=rows, asked=1), "table", "util").split()


def test_cluster_rows_read_the_claims_status_data():
    claims = [{"metadata": {"namespace": "ml", "name": "a"}, "status": {"devices": [
        {"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0-shared",
         "shareID": "5a5a", "data": {"mpsControlDaemon": {"runsIn": "pod", "pod": POD}}},
        {"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1",
         "data": {"mpsControlDaemon": {"runsIn": "pluginContainer"}}},
        {"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-2"}]}}]
    rows = join(claim_status_rows(claims, "gpu.nvidia.com", now=0.0), [])
    assert [r.mps for r in rows] == [f"pod {POD}", "plugin container", ""]

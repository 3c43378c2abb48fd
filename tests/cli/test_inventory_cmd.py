"""``gpudra inventory``: filters by GPU and type, and the summary line on big nodes."""

from __future__ import annotations

import pytest

from gpudra.cli.main import main
from gpudra.driver import sim


@pytest.fixture(autouse=True)
def _detach():
    yield
    sim.uninstall()


def inventory(capsys, *flags: str) -> tuple[int, list[str], str]:
    code = main(["inventory", "--dynamic-mig-gpus", "all", *flags])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def devices(lines: list[str]) -> list[str]:
    """The DEVICE column of the table's rows."""
    rows = lines[1:lines.index("")]
    return [row.split()[0] for row in rows if not row.startswith("+ ")]


def test_a_big_node_lists_its_gpus_and_sums_up_the_mig_devices_made_on_demand(capsys):
    code, lines, _ = inventory(capsys, "--simulate", "dgx-h100")
    assert code == 0
    assert devices(lines) == [f"gpu-{i}" for i in range(8)]
    assert lines[9] == ("+ 200 MIG devices made on demand (25 per GPU, profiles 1g.10gb … "
                        "7g.80gb): --type mig or --all lists them")
    assert lines[-1] == "208 devices on 8 GPUs, 8 shared counter sets"


def test_all_lists_every_device(capsys):
    _, lines, _ = inventory(capsys, "--simulate", "dgx-h100", "--all")
    assert len(devices(lines)) == 208
    assert not any(line.startswith("+ ") for line in lines)


def test_a_small_node_is_listed_whole(capsys):
    _, lines, _ = inventory(capsys, "--simulate", "l4-x4")
    assert devices(lines) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert lines[-1] == "4 devices on 4 GPUs, 0 shared counter sets"


def test_existing_mig_devices_are_always_listed(capsys):
    # two GPUs pre-partitioned by an admin (their MIG devices have UUIDs), six made on demand
    # (made on demand on A100s with MIG mode off: only where switching it is allowed)
    _, lines, _ = inventory(capsys, "--simulate", "dgx-a100-static-mig",
                            "--allow-mig-mode-change", "all")
    names = devices(lines)
    assert [n for n in names if "-mig-" not in n] == [f"gpu-{i}" for i in range(2, 8)]
    assert {n.split("-mig-")[0] for n in names if "-mig-" in n} == {"gpu-0", "gpu-1"}
    assert lines[-3].startswith("+ 150 MIG devices made on demand (25 per GPU,")
    _, lines, _ = inventory(capsys, "--simulate", "dgx-a100-static-mig")
    assert [n for n in devices(lines) if "-mig-" not in n] == [f"gpu-{i}" for i in range(2, 8)]
    assert not any(line.startswith("+ ") for line in lines)  # the admin's MIG devices only
    _, lines, _ = inventory(capsys, "--simulate", "dgx-a100-static-mig", "--feature-gates",
                            "DynamicMIG=false")
    assert not any(line.startswith("+ ") for line in lines)


def test_filter_by_gpu_number_and_type(capsys):
    _, lines, _ = inventory(capsys, "--simulate", "dgx-h100", "--gpu", "3", "--type", "mig")
    names = devices(lines)
    assert len(names) == 25
    assert all(name.startswith("gpu-3-mig-") for name in names)
    assert lines[-1] == "25 of 208 devices on 8 GPUs, 8 shared counter sets"
    _, lines, _ = inventory(capsys, "--simulate", "dgx-h100", "--type", "gpu", "--gpu", "1",
                            "--gpu", "6")
    assert devices(lines) == ["gpu-1", "gpu-6"]


def test_filter_by_gpu_uuid(capsys):
    _, lines, _ = inventory(capsys, "--simulate", "l4-x4")
    uuid = lines[3].split()[-1]
    _, lines, _ = inventory(capsys, "--simulate", "l4-x4", "--gpu", uuid.lower())
    assert devices(lines) == ["gpu-2"]


def test_unknown_gpu_is_a_usage_error_listing_the_gpus(capsys):
    code, lines, err = inventory(capsys, "--simulate", "l4-x4", "--gpu", "7")
    assert code == 2
    assert lines == []
    assert err == ("gpudra inventory: --gpu 7: no such GPU on this node (GPUs: gpu-0, gpu-1, "
                   "gpu-2, gpu-3)\n")


def test_filters_do_not_apply_to_resource_slices(capsys):
    code, lines, err = inventory(capsys, "--simulate", "l4-x4", "--type", "gpu", "-o", "yaml")
    assert code == 2
    assert "error:" in lines[0]
    assert err == ""

"""Host binaries run the way NVIDIA's driver runs them: chrooted into a driver root that has
its own C library, directly (with only NVIDIA library directories) into one that has not."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpudra.driver.commands import CommandError, HostCommandRunner
from gpudra.driver.driver_root import C_LIBRARY
from gpudra.driver.sim.driver_root import populate_driver_root

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(b) for b in ("chroot", "unshare", "ldd")),
    reason="chroot and mount namespaces need root and chroot(8)/unshare(1)")

REPORT = ('#!/bin/sh\necho "ld=$LD_LIBRARY_PATH"\n[ -e /marker ] && echo "inside the root"\n'
          'echo "pipe=$CUDA_MPS_PIPE_DIRECTORY"\n'
          '[ -n "$CUDA_MPS_PIPE_DIRECTORY" ] && echo hello > "$CUDA_MPS_PIPE_DIRECTORY/from-mps"\n'
          'exit 0\n')


def install_shell(root: Path) -> None:
    """Copy /bin/sh with its loader and C library into ``root``: a whole OS tree in small."""
    out = subprocess.run(["ldd", "/bin/sh"], capture_output=True, text=True, check=True).stdout
    files = ["/bin/sh"] + [w for line in out.splitlines() for w in line.split()
                           if w.startswith("/")]
    for name in files:
        target = root / name.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        shutil.copy(os.path.realpath(name), target)
    (root / "tmp").mkdir(exist_ok=True)
    (root / "marker").touch()


def test_a_root_with_its_own_c_library_is_chrooted_not_put_on_the_library_path(tmp_path):
    """Its libc.so.6 under our loader is what breaks when the two glibc builds differ."""
    root = populate_driver_root(tmp_path, [0], layout="operator")
    assert (root / "usr/lib/x86_64-linux-gnu" / C_LIBRARY).exists()
    argv, env = HostCommandRunner(root).command(["nvidia-smi", "-L"])
    assert argv == ["chroot", str(root), "/usr/bin/nvidia-smi", "-L"]
    assert "LD_LIBRARY_PATH" not in env


def test_a_root_of_nvidia_files_only_runs_directly_on_our_c_library(tmp_path):
    root = populate_driver_root(tmp_path, [0], layout="gke")
    (root / "bin/nvidia-smi").write_text(REPORT)
    out = HostCommandRunner(root).run(["nvidia-smi"])
    library_path = out.splitlines()[0].removeprefix("ld=").split(":")
    assert library_path == [f"{root}/lib64"]
    assert not any((Path(d) / C_LIBRARY).exists() for d in library_path)


def test_the_host_root_runs_binaries_as_they_are(tmp_path):
    argv, env = HostCommandRunner(Path("/")).command(["sh", "-c", "true"])
    assert argv[0] in ("/usr/bin/sh", "/bin/sh") and "LD_LIBRARY_PATH" not in env


def test_a_missing_binary_names_the_root(tmp_path):
    root = populate_driver_root(tmp_path, [0], layout="gke")
    with pytest.raises(CommandError, match=f"nvidia-debugdump not found under the driver "
                                           f"root {root}"):
        (root / "bin/nvidia-debugdump").unlink()
        HostCommandRunner(root).run(["nvidia-debugdump"])


@needs_root
def test_chrooted_command_runs_inside_the_root(tmp_path):
    root = populate_driver_root(tmp_path / "root", [0], layout="operator")
    install_shell(root)
    (root / "usr/bin/nvidia-smi").write_text(REPORT)
    out = HostCommandRunner(root).run(["nvidia-smi"]).splitlines()
    assert out[:2] == ["ld=", "inside the root"]


@needs_root
def test_directories_outside_the_root_are_bound_at_their_own_path(tmp_path):
    """An MPS pipe directory under the plugin dir reaches a chrooted control daemon at the
    path its environment names; the (read-only) root itself is left as it was."""
    root = populate_driver_root(tmp_path / "root", [0], layout="operator")
    install_shell(root)
    (root / "usr/bin/nvidia-smi").write_text(REPORT)
    pipe = tmp_path / "plugins/gpu.nvidia.com/mps/claim/pipe"
    pipe.mkdir(parents=True)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    out = HostCommandRunner(root).run(["nvidia-smi"], env={"CUDA_MPS_PIPE_DIRECTORY": str(pipe)})
    assert out.splitlines()[1:3] == ["inside the root", f"pipe={pipe}"]
    assert (pipe / "from-mps").read_text() == "hello\n"
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before

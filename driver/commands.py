"""The one seam for driver operations NVML cannot express (``nvidia-smi``, MPS control).

Production runs the driver root's binaries; the simulator implements the same commands
(``gpudra.driver.sim.commands``) so the code calling them is the same in every test.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from gpudra.driver.driver_root import DriverRoot
from gpudra.driver.files import CHILD_UMASK

# A root's own PATH inside a chroot; also where chroot(8) and unshare(1) are found.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# In a private mount namespace (nothing leaks to the host): make each "top" directory of the
# root writable by an overlay whose upper layer is a scratch tmpfs (a read-only root stays
# untouched), create each bind's mount point at its own path and bind it, then chroot.
_BIND_AND_CHROOT = """set -e
root=$1; scratch=$2; n=$3; shift 3
mount -t tmpfs -o mode=0700,size=1m gpudra "$scratch"
i=0
while [ "$i" -lt "$n" ]; do
  mkdir "$scratch/u$i" "$scratch/w$i"
  mount -t overlay gpudra -o "lowerdir=$root$1,upperdir=$scratch/u$i,workdir=$scratch/w$i" "$root$1"
  shift; i=$((i+1))
done
n=$1; shift
i=0
while [ "$i" -lt "$n" ]; do
  mkdir -p "$root$1"; mount --bind "$1" "$root$1"; shift; i=$((i+1))
done
exec chroot "$root" "$@"
"""


class CommandError(RuntimeError):
    """A driver command failed; the message has the command and its output."""


class CommandRunner(Protocol):
    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            stdin: str | None = None) -> str:
        """Run a driver command to completion; returns stdout, raises CommandError."""


class HostCommandRunner:
    """Runs binaries from the NVIDIA driver root the way NVIDIA's driver does.

    * Root ``/``: as they are.
    * A root with its own C library (the host's ``/`` under a mount, a driver container's
      tree): chrooted into it, so loader, C library and NVIDIA libraries all come from that
      tree. Putting its library directory on our ``LD_LIBRARY_PATH`` instead would load its
      ``libc.so.6`` under our loader, which breaks when the two glibc builds differ.
      Directories named in the environment that the root does not show at the same path
      (MPS pipe and log directories) are bound into it there, for that command only.
    * A root of NVIDIA files only (GKE's ``lib64``/``bin``): directly, with the root's
      library directories on ``LD_LIBRARY_PATH``; they hold no C library to mix in.
    """

    def __init__(self, driver_root: Path, *, timeout: float = 30.0) -> None:
        self.driver_root = driver_root
        self.timeout = timeout

    def command(self, argv: Sequence[str],
                env: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
        """The argv and environment ``argv`` runs with (what :meth:`run` executes)."""
        root = DriverRoot(self.driver_root)
        binary = root.find_binary(argv[0])
        if binary is None:
            raise CommandError(f"{argv[0]} not found under the driver root {self.driver_root}")
        full_env = {"PATH": SYSTEM_PATH, **(env or {})}
        if self.driver_root == Path("/"):
            return [binary, *argv[1:]], full_env
        if not root.has_c_library():
            libs = [str(d) for d in root.library_dirs()]
            if libs:
                full_env["LD_LIBRARY_PATH"] = ":".join(libs)
            return [str(root.scan_root / binary.lstrip("/")), *argv[1:]], full_env
        inside = [binary, *argv[1:]]
        binds = sorted({v for v in full_env.values() if self._outside_root(v)})
        if not binds:
            return ["chroot", str(self.driver_root), *inside], full_env
        missing = [b for b in binds if not (self.driver_root / b.lstrip("/")).is_dir()]
        tops = sorted({self._deepest_existing(b) for b in missing} - {"/"}, key=len)
        scratch = Path(tempfile.gettempdir()) / "gpudra-chroot"
        scratch.mkdir(mode=0o700, exist_ok=True)
        return (["unshare", "--mount", "--propagation", "private", "sh", "-c", _BIND_AND_CHROOT,
                 "gpudra-chroot", str(self.driver_root), str(scratch), str(len(tops)), *tops,
                 str(len(binds)), *binds, *inside], full_env)

    def _outside_root(self, value: str) -> bool:
        """An existing directory the chrooted command would not see at the same path."""
        if not value.startswith("/") or not Path(value).is_dir():
            return False
        inside = self.driver_root / value.lstrip("/")
        try:
            return not inside.samefile(value)
        except OSError:
            return True

    def _deepest_existing(self, path: str) -> str:
        """The deepest ancestor of ``path`` the root has, where its mount point is made."""
        parts = Path(path).parts[1:]
        while parts and not (self.driver_root.joinpath(*parts)).is_dir():
            parts = parts[:-1]
        return "/" + "/".join(parts)

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            stdin: str | None = None) -> str:
        command, full_env = self.command(argv, env)
        try:
            done = subprocess.run(command, input=stdin, capture_output=True, text=True,
                                  env=full_env, timeout=self.timeout, check=False,
                                  umask=CHILD_UMASK)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CommandError(f"{' '.join(argv)}: {exc}") from exc
        if done.returncode != 0:
            output = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise CommandError(f"{' '.join(argv)} exited {done.returncode}: {' | '.join(output)}")
        return done.stdout


def set_time_slice(runner: CommandRunner, uuid: str, value: int) -> None:
    """``nvidia-smi compute-policy --set-timeslice`` (0 Default, 1 Short, 2 Medium, 3 Long)."""
    runner.run(["nvidia-smi", "compute-policy", "-i", uuid, "--set-timeslice", str(value)])

"""CUDA MPS control daemons, one per claim or one per shared GPU: start, adopt after a
restart, stop, and what containers need.

A daemon is named by a key: a claim's uid, or ``shared-<GPU uuid>`` for the daemon all
shares of a GPU use (:mod:`gpudra.driver.shares`); everything below works the same for both.

Each claim owns ``<base>/<claim uid>/`` under the plugin's data dir (host paths, bind-mounted
into the claim's containers through CDI): ``pipe/`` (the control socket clients connect to),
``log/``, and ``shm/``, mounted at the containers' ``/dev/shm`` (a tmpfs on a real node, a
directory when simulating). ``nvidia-cuda-mps-control -d`` detaches the daemon from the node
daemon (:mod:`gpudra.driver.mps_process`), so a restart of the node daemon does not take MPS
away from running pods; the new instance adopts it through ``control.pid``, which is kept
outside the pipe directory workloads can write to. Commands go through the
:mod:`gpudra.driver.commands` seam.

That is the in-container mode. With ``pods`` (:mod:`gpudra.driver.mps_pods`, the chart's
default) each daemon runs in a Pod of its own instead, which a restart, upgrade or OOM kill
of the plugin pod does not touch; directories, limits and clients' view are the same, and
commands still reach the daemon through its pipe directory.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from prometheus_client import Gauge

from gpudra.api.configs import MpsConfig
from gpudra.driver import files, mps_process, shares
from gpudra.driver.cdi import ContainerEdits, Mount
from gpudra.driver.checkpoint_model import ClaimRecord
from gpudra.driver.commands import CommandError, CommandRunner
from gpudra.driver.mps_pods import MpsPods
from gpudra.driver.paths import child_path, remove_tree

log = structlog.get_logger(__name__)

CONTROL = mps_process.CONTROL
CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
CONTAINER_LOG_DIR = "/var/log/nvidia-mps"
CONTAINER_SHM_DIR = "/dev/shm"
NATIVE_PID_FILE = "nvidia-cuda-mps-control.pid"
"""Written into the pipe directory by the control daemon itself."""
CONTROL_SOCKET = "control"
"""The control daemon's socket in the pipe directory, which clients connect to."""
IN_CONTAINER = "plugin container"
"""Where an in-container daemon runs, as :meth:`MpsManager.where` names it."""

MPS_DAEMONS = Gauge(
    "gpudra_mps_control_daemons",
    "MPS control daemons this node daemon runs or adopted: 1 each, labelled with its key "
    "(shared-<GPU UUID>, or a claim's uid), its GPUs and where it runs (its pod, or the "
    "plugin container)", ["daemon", "gpu_uuid", "where"])


@dataclass(frozen=True)
class MpsDaemon:
    directory: Path

    @property
    def pipe_dir(self) -> Path:
        return self.directory / "pipe"

    @property
    def log_dir(self) -> Path:
        return self.directory / "log"

    @property
    def shm_dir(self) -> Path:
        return self.directory / "shm"

    @property
    def pid_file(self) -> Path:
        """Ours, written once the daemon is up; workloads cannot reach it."""
        return self.directory / "control.pid"

    def env(self, uuids: Sequence[str] = ()) -> dict[str, str]:
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
               "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
               mps_process.OWNER_ENV: mps_process.owner_mark(self.directory)}
        if uuids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
        return env

    def container_edits(self) -> ContainerEdits:
        # The workload's /dev/shm is the claim's own, not the node's: MPS clients and
        # server share memory there, and claims must not see each other's.
        return ContainerEdits(
            env=(f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}",
                 f"CUDA_MPS_LOG_DIRECTORY={CONTAINER_LOG_DIR}"),
            mounts=(
                Mount(host_path=str(self.pipe_dir), container_path=CONTAINER_PIPE_DIR,
                      options=("rbind", "rw")),
                Mount(host_path=str(self.log_dir), container_path=CONTAINER_LOG_DIR,
                      options=("rbind", "ro")),
                Mount(host_path=str(self.shm_dir), container_path=CONTAINER_SHM_DIR,
                      options=("rbind", "rw", "nosuid", "nodev")),
            ),
        )


@dataclass(frozen=True)
class MpsClaim:
    """A prepared claim's daemon as the checkpoint describes it: enough to start it again."""

    ref: str
    uuids: tuple[str, ...]
    commands: tuple[str, ...] | None
    """``None``: not recorded (a record of an older version); restarted without config."""


@dataclass
class MpsReconcileReport:
    """Start-up reconciliation of MPS daemons against the prepared claims (by claim uid)."""

    adopted: dict[str, int] = field(default_factory=dict)
    restarted: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


class MpsManager:
    """Per-claim control daemons under ``base_dir``.

    ``tmpfs_shm`` mounts a tmpfs on each claim's ``shm/`` (a real node, as root; its size is
    the kernel's default, half the RAM, as NVIDIA's driver does); off, it stays a directory.
    ``pods``: run each daemon in a Pod of its own (see the module docstring); ``None``: in
    this container, detached.
    """

    def __init__(self, runner: CommandRunner, base_dir: Path, *, tmpfs_shm: bool = False,
                 timeout: float = 5.0, pods: MpsPods | None = None) -> None:
        self.runner = runner
        self.pods = pods
        self._labels: dict[str, tuple[str, str, str]] = {}
        # Absolute: the claim directory is part of a daemon's identity (its environment),
        # which must compare equal across restarts of the node daemon.
        self.base_dir = base_dir.absolute()
        self.tmpfs_shm = tmpfs_shm
        self.timeout = timeout

    def daemon_for(self, claim_uid: str) -> MpsDaemon:
        """The daemon's directory: one plain component under ``base_dir``, checked (a key
        from a checkpoint this version did not write could name any path)."""
        return MpsDaemon(child_path(self.base_dir, claim_uid, "MPS daemon key"))

    def running_pid(self, claim_uid: str) -> int | None:
        """The pid of the claim's live control daemon, checked in /proc; else ``None``.

        Ours first; then the daemon's own (a crash right after start, or a daemon started
        by a version that wrote none), which the same check makes safe to believe.
        """
        daemon = self.daemon_for(claim_uid)
        if self.pods is not None:
            return self.pods.serving_pid(claim_uid, daemon.directory)
        return self._local_pid(daemon)

    def where(self, claim_uid: str) -> str:
        """Where the daemon runs, as logs, metrics and status name it: ``pod <ns>/<name>``,
        or :data:`IN_CONTAINER`."""
        return IN_CONTAINER if self.pods is None else f"pod {self.pods.where(claim_uid)}"

    def status(self, claim_uid: str) -> dict[str, str]:
        """A claim device's ``status.devices[].data.mpsControlDaemon``: where its daemon
        runs (from the configuration: no API call)."""
        if self.pods is None:
            return {"runsIn": "pluginContainer"}
        return {"runsIn": "pod", "pod": self.pods.where(claim_uid)}

    def _shown(self, claim_uid: str, uuids: Sequence[str], up: bool) -> None:
        """The :data:`MPS_DAEMONS` series of a daemon: set while it runs, gone after."""
        labels = (claim_uid, ",".join(uuids), self.where(claim_uid))
        if up:
            MPS_DAEMONS.labels(*labels).set(1)
            self._labels[claim_uid] = labels
        else:
            old = self._labels.pop(claim_uid, None)
            if old is not None:
                MPS_DAEMONS.remove(*old)

    @staticmethod
    def _local_pid(daemon: MpsDaemon) -> int | None:
        """A daemon started in this container (also, in pod mode, one an earlier version
        left there: quit before a pod takes over its pipe directory)."""
        for path in (daemon.pid_file, daemon.pipe_dir / NATIVE_PID_FILE):
            pid = mps_process.read_pid(path)
            if pid is not None and mps_process.is_control_daemon(pid, daemon.directory):
                return pid
        return None

    def start(self, claim_uid: str, uuids: Sequence[str], commands: Sequence[str]) -> MpsDaemon:
        """Start the claim's daemon and send it ``commands``; on failure it is not left
        running (the directories are the caller's undo: :meth:`stop`)."""
        daemon = self.daemon_for(claim_uid)
        self._quit_running(daemon, claim_uid)
        files.make_dirs(daemon.directory, files.DIR_MODE)
        # The pipe and log dirs are bind-mounted into the claim's containers, whose user
        # need not be root: searchable by all (as a default umask left them), writable only
        # by root. shm/ is private until its tmpfs (mode 1777) is mounted over it.
        for folder, mode in ((daemon.pipe_dir, 0o755), (daemon.log_dir, 0o755),
                             (daemon.shm_dir, files.PRIVATE_DIR_MODE)):
            files.make_dirs(folder, mode)
        if self.pods is None:
            # Empty, not re-created: running containers bind-mount these very directories,
            # so a restarted daemon's socket must appear in the same inode.
            _clear(daemon.pipe_dir)
        daemon.pid_file.unlink(missing_ok=True)
        if self.tmpfs_shm and not daemon.shm_dir.is_mount():
            _run(["mount", "-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs",
                  str(daemon.shm_dir)])
        if self.pods is not None:
            try:
                # A pod that serves already (created before a crash) is waited for, not
                # replaced; a new one starts on an emptied pipe directory.
                self.pods.ensure(claim_uid, daemon.directory, list(uuids),
                                 clear=lambda: _clear(daemon.pipe_dir))
                # The pipe must answer, not only exist: the limits go through it, or, with
                # none to send, a query that changes nothing.
                self.send(claim_uid, commands or ["get_server_list"])
            except (CommandError, OSError):
                self._remove_pod(claim_uid, daemon)
                raise
            self._shown(claim_uid, uuids, up=True)
            return daemon
        try:
            self.runner.run([CONTROL, "-d"], env=daemon.env(uuids))
            pid = self._wait_started(daemon)
            mps_process.write_pid(daemon.pid_file, pid)
            self.send(claim_uid, commands)
        except (CommandError, OSError):
            self._quit_running(daemon, claim_uid)
            raise
        self._shown(claim_uid, uuids, up=True)
        return daemon

    def send(self, claim_uid: str, commands: Sequence[str]) -> None:
        """Send control commands to a running daemon (limits at start, a shared GPU's new
        limits) in ONE client call: the control shell reads its stdin line by line, and each
        call is a process start (a chroot too, with a driver container's root)."""
        if commands:
            self.runner.run([CONTROL], env=self.daemon_for(claim_uid).env(),
                            stdin="".join(c + "\n" for c in commands))

    def _wait_started(self, daemon: MpsDaemon) -> int:
        """The new daemon's pid, once it names itself in its pid file and its control
        socket exists (``-d`` may return before either: it only forks)."""
        native = daemon.pipe_dir / NATIVE_PID_FILE
        control = daemon.pipe_dir / CONTROL_SOCKET
        found: list[int] = []

        def up() -> bool:
            pid = mps_process.read_pid(native)
            if pid is None or not control.exists() \
                    or not mps_process.is_control_daemon(pid, daemon.directory):
                return False
            found.append(pid)
            return True

        if not mps_process.wait_for(up, self.timeout):
            raise CommandError(
                f"{CONTROL} -d: no control daemon for {daemon.pipe_dir} after "
                f"{self.timeout:g}s ({native} names pid {mps_process.read_pid(native)}, "
                f"{control} {'exists' if control.exists() else 'missing'})")
        return found[-1]

    def stop(self, claim_uid: str) -> None:
        """Quit the claim's daemon if it runs and remove its directories; idempotent."""
        daemon = self.daemon_for(claim_uid)
        self._quit_running(daemon, claim_uid)
        if self.pods is not None:
            self._remove_pod(claim_uid, daemon)
        self._shown(claim_uid, (), up=False)
        if daemon.shm_dir.is_mount():
            # Lazy: a container being torn down may still hold it; it goes when they do.
            _run(["umount", "--lazy", str(daemon.shm_dir)])
        remove_tree(self.base_dir, daemon.directory)

    def _remove_pod(self, claim_uid: str, daemon: MpsDaemon) -> None:
        assert self.pods is not None
        self.pods.remove(claim_uid, lambda: self.runner.run(
            [CONTROL], env=daemon.env(), stdin="quit\n"))

    def _quit_running(self, daemon: MpsDaemon, claim_uid: str) -> None:
        """``quit`` through the control pipe, then signals, each with a deadline: a daemon
        of this container (in pod mode, one an earlier version started here)."""
        pid = self._local_pid(daemon)
        if pid is None:
            return  # never signal a pid we cannot prove is this claim's daemon
        try:
            self.runner.run([CONTROL], env=daemon.env(), stdin="quit\n")
        except CommandError as exc:
            log.warning("MPS control daemon did not take quit; signalling it",
                        claim=claim_uid, pid=pid, error=str(exc))
        if mps_process.wait_exit(pid, self.timeout):
            return
        if not mps_process.terminate(pid, daemon.directory, self.timeout):
            raise CommandError(f"MPS control daemon {pid} of claim {claim_uid} did not exit "
                               "after quit, SIGTERM and SIGKILL")

    def claim_uids(self) -> list[str]:
        """Claims that have a daemon directory (running or not), or a pod."""
        found: set[str] = set()
        if self.pods is not None:
            try:
                found = set(self.pods.keys())
            except CommandError as exc:  # the API server: pods of no directory wait
                log.error("cannot list this node's MPS control daemon pods; those of GPUs "
                          "without shares are deleted at a later start", error=str(exc))
        if self.base_dir.is_dir():
            found |= {p.name for p in self.base_dir.iterdir() if p.is_dir()}
        return sorted(found)

    def reconcile(self, wanted: Mapping[str, MpsClaim]) -> MpsReconcileReport:
        """After a restart: stop daemons of claims that are not prepared, adopt the live
        daemons of prepared claims, and start again those that died.

        A dead daemon is restarted, not just reported: its claim's pods keep running and
        their next CUDA process (a restarted container, a new worker) needs MPS, and would
        fail until the claim is unprepared, which may be never. On a real node this is the
        common case after the plugin container restarts, since the runtime kills what the
        container started. One claim's failure is logged and does not stop start-up.
        """
        report = MpsReconcileReport()
        for uid in self.claim_uids():
            if uid in wanted:
                continue
            try:
                self.stop(uid)
            except (CommandError, OSError) as exc:
                log.error("cannot stop the MPS control daemon of a claim that is not prepared",
                          claim=uid, error=str(exc))
                report.failed.append(uid)
            else:
                log.info("stopped MPS control daemon of a claim that is not prepared", claim=uid)
                report.stopped.append(uid)
        for uid, claim in sorted(wanted.items()):
            try:
                pid = self.running_pid(uid)
            except CommandError as exc:  # its pod cannot be read: neither adopted nor made
                log.error("cannot tell whether a prepared claim's MPS control daemon runs",
                          claim=claim.ref, where=self.where(uid), error=str(exc))
                report.failed.append(uid)
                continue
            if pid is not None:
                log.info("re-adopted MPS control daemon", claim=claim.ref, pid=pid,
                         where=self.where(uid))
                self._shown(uid, claim.uuids, up=True)
                report.adopted[uid] = pid
                continue
            if claim.commands is None:
                log.warning("restarting an MPS control daemon whose config was not recorded; "
                            "it runs with MPS defaults", claim=claim.ref)
            try:
                self.start(uid, claim.uuids, claim.commands or ())
            except (CommandError, OSError) as exc:
                log.error("MPS control daemon of a prepared claim is dead and cannot be "
                          "restarted; its containers cannot use MPS", claim=claim.ref,
                          error=str(exc))
                report.failed.append(uid)
            else:
                log.warning("MPS control daemon of a prepared claim was dead; restarted it",
                            claim=claim.ref, pid=self.running_pid(uid))
                report.restarted.append(uid)
        return report


def _clear(folder: Path) -> None:
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _run(argv: list[str]) -> None:
    """A host mount command (not a driver binary, so not the commands seam)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CommandError(f"{' '.join(argv)}: {exc}") from exc
    if done.returncode != 0:
        raise CommandError(f"{' '.join(argv)} exited {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()}")


def commands_for(config: MpsConfig | None, uuids: Sequence[str]) -> list[str]:
    """Control commands that apply a config (pure)."""
    if config is None:
        return []
    commands = []
    if config.default_active_thread_percentage is not None:
        commands.append(
            f"set_default_active_thread_percentage {config.default_active_thread_percentage}")
    limits: Mapping[str, int] = config.pinned_limits_mib(list(uuids))
    for uuid in sorted(limits):
        commands.append(f"set_default_device_pinned_mem_limit {uuid} {limits[uuid]}M")
    return commands


def daemon_key_of(record: ClaimRecord, share_id: str | None, uuid: str | None) -> str | None:
    """The key of the MPS daemon a prepared device's containers use, if any: its shared
    GPU's (an MPS share), or its claim's (an MPS config on whole devices)."""
    if share_id:
        raw = record.restore.shares.get(share_id)
        if raw is None:
            return None
        entry = shares.ShareEntry.from_json(share_id, raw)
        return shares.daemon_key(entry.gpu) if entry.strategy == "MPS" else None
    mps = record.restore.mps
    if mps is not None and uuid in mps.uuids:
        return record.uid
    return None


StatusSource = Callable[[ClaimRecord, str | None, str | None], dict[str, str] | None]


def status_source(mps: MpsManager | None) -> StatusSource | None:
    """For claim device status: (record, share ID, device UUID) → where the device's MPS
    daemon runs (:meth:`MpsManager.status`), or ``None`` when it uses none."""
    if mps is None:
        return None

    def status(record: ClaimRecord, share_id: str | None,
               uuid: str | None) -> dict[str, str] | None:
        key = daemon_key_of(record, share_id, uuid)
        return None if key is None else mps.status(key)
    return status

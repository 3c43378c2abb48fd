"""One container's process for :mod:`gpudra.testing.pod_runner`, as a container runtime's
shim (containerd-shim) keeps it: the runner can go away (a kubelet restart) and a new one
still learns the pid and, later, the exit code.

    python -IS pod_shim.py <record> <log> <argv...>

Detaches first (fork, the launcher exits at once): the shim belongs to no runner, as a
real shim is re-parented away from the kubelet. Then it runs ``argv`` (environment
inherited, stdout and stderr appended to ``<log>``), writes
``{"pid": N}`` to ``<record>.pid`` at once and ``{"exitCode": N}`` to ``<record>.exit`` when
it ends (128 + signal when a signal ended it, as a container runtime reports). It ignores
SIGTERM and SIGINT itself: the runner signals the container's process, never the shim,
and a signal sent to the whole session must not take the record keeper with it.

stdlib only, run as a script (``-IS``): it starts for every container.
"""

# ruff: noqa: PTH105, PTH123 - os.replace and open(): pathlib's imports would slow every start

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys


def _write(path: str, data: dict[str, int]) -> None:
    """Atomically: the runner polls for these files and must never read half of one. A
    runner that closed may have removed its directory: then nobody needs the record."""
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as file:
            json.dump(data, file)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def main(record: str, log: str, argv: list[str]) -> int:
    if os.fork() > 0:
        os._exit(0)  # the launcher: the runner reaps it at once
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with open(log, "ab") as out:
        try:
            # The child gets default signal handling back (ignored dispositions inherit).
            child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                     restore_signals=True,
                                     preexec_fn=_default_signals)  # noqa: PLW1509
        except OSError as exc:
            out.write(f"pod_shim: cannot start {argv[0]}: {exc}\n".encode())
            _write(record + ".exit", {"exitCode": 127})
            return 0
    _write(record + ".pid", {"pid": child.pid})
    # Until the child is reaped here its pid cannot be reused, and .exit is written only
    # after: a runner that reads no .exit may signal the pid in .pid.
    code = child.wait()
    _write(record + ".exit", {"exitCode": 128 - code if code < 0 else code})
    return 0


def _default_signals() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))

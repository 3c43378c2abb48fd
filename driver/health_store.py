"""GPUs waiting for recovery, kept across daemon restarts (not across reboots).

A GPU that needs a reset must stay tainted when the daemon restarts (an upgrade, a crash):
nothing was reset meanwhile, and on a driver without the recovery action field nothing else
would remember. One small JSON file in the plugin's data dir, replaced atomically, stamped
with the node's boot id: after a reboot every GPU was reset, so a file of another boot is
ignored. Unreadable content is a warning and an empty start (health is observed again), never
a start-up error. An admin who reset a GPU on such a driver while the daemon was down can
delete the file before starting it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import structlog

from gpudra.driver import files
from gpudra.driver.health import RecoveryRecord

log = structlog.get_logger(__name__)

VERSION: Final = 1
RECOVERY_FILE: Final = "gpu-recovery.json"
"""Its name in the plugin's data dir."""


class RecoveryStore:
    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = path
        self.boot_id = boot_id

    def load(self) -> dict[str, RecoveryRecord]:
        """The records of this boot; empty when there are none (or they cannot be read)."""
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("cannot read the GPUs waiting for recovery; starting empty",
                        path=str(self.path), error=str(exc))
            return {}
        if not isinstance(data, dict) or data.get("bootID") != self.boot_id:
            return {}  # another boot: the reboot reset every GPU
        try:
            return {str(gpu): _record(entry) for gpu, entry in data["gpus"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("the GPUs waiting for recovery are malformed; starting empty",
                        path=str(self.path), error=str(exc))
            return {}

    def save(self, records: Mapping[str, RecoveryRecord]) -> None:
        """Replace the file (removed when nothing waits); a failure is a warning."""
        try:
            if not records:
                self.path.unlink(missing_ok=True)
                return
            body = {"version": VERSION, "bootID": self.boot_id,
                    "gpus": {gpu: _entry(r) for gpu, r in sorted(records.items())}}
            files.make_dirs(self.path.parent)
            files.atomic_write(self.path, json.dumps(body, indent=1).encode(),
                               tmp=self.path.with_name(f".{self.path.name}.tmp"))
        except OSError as exc:
            log.warning("cannot record the GPUs waiting for recovery", path=str(self.path),
                        error=str(exc))


def _entry(record: RecoveryRecord) -> dict[str, Any]:
    return {"action": record.action, "since": record.since, "cause": record.cause,
            "fromDriver": record.from_driver}


def _record(entry: Mapping[str, Any]) -> RecoveryRecord:
    action, since = entry["action"], entry["since"]
    if not isinstance(action, int) or isinstance(action, bool) or action <= 0:
        raise ValueError(f"action {action!r} is not a recovery action")
    if not isinstance(since, int | float) or isinstance(since, bool):
        raise ValueError(f"since {since!r} is not a time")
    return RecoveryRecord(action, float(since), str(entry["cause"])[:200],
                          bool(entry["fromDriver"]))

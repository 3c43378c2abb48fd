"""The previous build's checkpoint store, run from its archive (fixtures/checkpoint_prev.tar.gz).

    python -m tests.driver.prev_checkpoint WORK_DIR CHECKPOINT_DIR ACTION...

Actions, in order, each printing one JSON line: ``load`` (the checkpoint that build reads,
as ``{"version": <on disk>, "data": <its version 2 data>}``), ``put:<uid>`` and
``remove:<uid>`` (a claim-only commit: that build appends it to its journal), ``compact``
(its clean stop). Errors print ``{"error": "<class>: <message>"}`` and end the run.

The archive's modules are loaded under their own names, so that build's store runs
whole; the modules it imports that are not in the archive (metrics, MIG names, claim refs)
are this tree's. A separate process: a test's own imports are this build's.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

ARCHIVE = Path(__file__).parent / "fixtures" / "checkpoint_prev.tar.gz"
MODULES = ("files", "flock", "checkpoint_model", "checkpoint_codec", "checkpoint_journal",
           "checkpoint_lock", "checkpoint_store")
BOOT_ID = "boot-1"


def load_previous_build(work: Path) -> dict[str, Any]:
    """The archive's modules, imported as ``gpudra.driver.<name>``; by short name."""
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(work, filter="data")
    loaded = {}
    for name in MODULES:
        full = f"gpudra.driver.{name}"
        spec = importlib.util.spec_from_file_location(full, work / "prev" / "driver" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
        loaded[name] = module
    return loaded


def claim(model: Any, uid: str) -> Any:
    return model.ClaimRecord(
        uid=uid, namespace="default", name=f"claim-{uid[:8]}", state=model.PREPARE_COMPLETED,
        devices=[model.DeviceRecord(request_names=["gpu"], pool="node-a", device="gpu-5",
                                    cdi_device_ids=[f"k8s.gpu.nvidia.com/claim={uid}-gpu-5"],
                                    kind="gpu", uuid="GPU-5555")])


def main() -> None:
    work, directory, *actions = sys.argv[1:]
    prev = load_previous_build(Path(work))
    model, codec = prev["checkpoint_model"], prev["checkpoint_codec"]
    store = prev["checkpoint_store"].CheckpointStore(Path(directory), boot_id=BOOT_ID)
    for action in actions:
        verb, _, uid = action.partition(":")
        try:
            if verb == "put":
                store.update(lambda cp, uid=uid: model.with_claim(cp, claim(model, uid)))
            elif verb == "remove":
                store.update(lambda cp, uid=uid: model.without_claim(cp, uid))
            elif verb == "compact":
                store.compact()
            cp = store.load()
        except codec.CheckpointError as exc:
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
            return
        version = json.loads(store.path.read_bytes())["version"]
        data = json.loads(codec.encode(cp))["data"]
        print(json.dumps({"version": version, "data": data}), flush=True)


if __name__ == "__main__":
    main()

"""Start-up's side of recovery: gather what survives, apply what :mod:`.recovery` computed.

Two entry points, both blocking (files, NVML, the API server through ``ask_api``):

- :func:`recover` when the checkpoint cannot be read: the file is moved aside, the rebuilt
  checkpoint saved, the held set written to ``held-unknown.json``, and one log line says
  what happened (an Event and ``/readyz`` follow from the held set, a metric too);
- :func:`load_held` on every start: the held set, less what the operator has since put
  back to baseline.

A held-set file the daemon cannot read is a one-line start-up error naming it: guessing
would either forget held hardware or hold what is free.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from gpudra.driver import cdi
from gpudra.driver.checkpoint_codec import CheckpointCorrupt, CheckpointError
from gpudra.driver.checkpoint_store import CheckpointStore, Unreadable
from gpudra.driver.device_model import ModelOptions
from gpudra.driver.files import atomic_write
from gpudra.driver.gpu_shares import ALL
from gpudra.driver.held import HELD_FILE, HeldDevice, held_document, parse_held, still_held
from gpudra.driver.inventory import NodeInventory
from gpudra.driver.metrics import HELD_UNKNOWN
from gpudra.driver.nvml import Nvml, NvmlError
from gpudra.driver.prepare_plan import NodeIndex
from gpudra.driver.recovery import Recovery, rebuild
from gpudra.driver.survivors import (
    MAX_SPEC_BYTES,
    ClaimSpec,
    GpuHardware,
    Survivors,
    api_claims,
    parse_spec,
    published_mig,
)

log = structlog.get_logger("gpudra.node")

ApiAnswers = tuple[Sequence[object] | None, Sequence[object] | None]
"""(ResourceClaims of every namespace, ResourceSlices); ``None`` for a list that failed."""
AskApi = Callable[[], ApiAnswers]


class HeldFileError(CheckpointError):
    """The held set cannot be read; the message is one line naming the file."""


class CheckpointUnusable(CheckpointError):
    """The checkpoint's path is not a file the daemon can read or replace (a directory, no
    permission): one line naming it and what to do; nothing is changed."""


@dataclass(frozen=True)
class NodeFacts:
    """What the step needs to know about the node."""

    driver: str
    pool: str
    node: str
    cdi_root: Path
    dynamic_mig: bool
    mps_dir: Path | None
    """Where MPS control daemons keep their directories; ``None``: MPS is off."""


def read_hardware(nvml: Nvml, inventory: NodeInventory) -> list[GpuHardware]:
    """Every GPU that answers: compute mode, MIG mode, MIG devices (what claims change)."""
    gpus = []
    for gpu in inventory.gpus:
        uuid = gpu.probe.uuid
        try:
            mode: int | None = nvml.compute_mode(uuid)
        except NvmlError:
            mode = None
        try:
            instances = tuple(nvml.mig_instances(uuid))
        except NvmlError:
            instances = tuple(gpu.mig_instances)
        mig = gpu.mig_mode
        gpus.append(GpuHardware(uuid=uuid, minor=gpu.probe.minor, compute_mode=mode,
                                mig_enabled=bool(mig and mig.current),
                                mig_instances=instances))
    return gpus


def read_specs(cdi_root: Path, driver: str) -> tuple[list[ClaimSpec], list[str]]:
    """The claims' specs this driver wrote; and one line per spec that is not one."""
    specs, bad = [], []
    for uid, path in cdi.list_claim_specs(cdi_root, driver).items():
        try:
            with path.open("rb") as f:
                content = f.read(MAX_SPEC_BYTES + 1)
        except OSError as exc:
            bad.append(f"{path}: {exc.strerror or exc}")
            continue
        parsed = parse_spec(uid, content, driver)
        if isinstance(parsed, str):
            bad.append(f"{path}: {parsed}")
        else:
            specs.append(parsed)
    return specs, bad


def open_checkpoint(store: CheckpointStore, *, facts: NodeFacts, nvml: Nvml,
                    inventory: NodeInventory, ask_api: AskApi | None,
                    ) -> tuple[HeldDevice, ...]:
    """Open the checkpoint at start-up (:meth:`CheckpointStore.open`); when it cannot be
    read, rebuild it (:func:`recover`). Returns the node's held set."""
    path = store.path
    error: CheckpointCorrupt | None = None
    try:
        # Unreadable: nothing changed yet; an older layout is rewritten as the current one.
        outcome = store.open()
    except RecursionError:
        # json recurses once per nesting level: a file nested that deep is not ours.
        error = CheckpointCorrupt(path, "JSON nested too deeply to be a checkpoint")
    except IsADirectoryError as exc:
        raise CheckpointUnusable(
            f"checkpoint {path} is a directory, not a file: move it aside (mv {path} "
            f"{path}.bad) and restart; nothing was changed") from exc
    except OSError as exc:
        raise CheckpointUnusable(
            f"checkpoint {path}: {exc.strerror or exc}: make it a readable file the daemon "
            f"owns, or move it aside (mv {path} {path}.bad) and restart") from exc
    else:
        if isinstance(outcome, Unreadable):
            error = outcome.error
    if error is not None:
        return recover(store, error, facts=facts, nvml=nvml, inventory=inventory,
                       ask_api=ask_api)
    return load_held(store.directory, nvml, inventory)


def recover(store: CheckpointStore, error: CheckpointError, *, facts: NodeFacts, nvml: Nvml,
            inventory: NodeInventory, ask_api: AskApi | None) -> tuple[HeldDevice, ...]:
    """The checkpoint could not be read (``error``): rebuild it, hold the rest; returns the
    node's held set (earlier entries kept)."""
    gpus = read_hardware(nvml, inventory)
    specs, bad_specs = read_specs(facts.cdi_root, facts.driver)
    claims_raw, slices_raw = ask_api() if ask_api is not None else (None, None)
    mps = frozenset(_mps_daemons(facts.mps_dir))
    survivors = Survivors(
        specs=specs, gpus=gpus,
        claims=None if claims_raw is None else api_claims(
            claims_raw, driver=facts.driver, pool=facts.pool, node=facts.node),
        published_mig={} if slices_raw is None else published_mig(
            slices_raw, driver=facts.driver, node=facts.node),
        mps_daemons=mps)
    # As if every live MIG device were ours and every GPU offered every dynamic MIG device
    # (ModelOptions' default offer): a dynamic device's name finds its placement, also one
    # prepared under an earlier --dynamic-mig-* offer.
    options = ModelOptions(dynamic_mig=facts.dynamic_mig, shareable=ALL, owned_mig_uuids={
        i.uuid for g in gpus for i in g.mig_instances})
    targets = NodeIndex.build(facts.pool, inventory, options).targets
    result = rebuild(survivors, targets=targets, pool=facts.pool, driver=facts.driver,
                     boot_id=store.boot_id)
    moved = store.quarantine()
    if not result.empty:
        store.save(result.checkpoint)
    earlier, released = still_held(_read_held(store.directory), gpus)
    for entry in released:
        log.info("held hardware is back to baseline (or gone); released", held=entry.what)
    held = _merge(earlier, result.held)
    _write_held(store.directory, held)
    _say(error, moved, result, held, bad_specs, api=claims_raw is not None,
         slices=slices_raw is not None)
    return held


def load_held(directory: Path, nvml: Nvml, inventory: NodeInventory) -> tuple[HeldDevice, ...]:
    """The held set on a start whose checkpoint reads fine, less what is back to baseline."""
    held = _read_held(directory)
    if not held:
        HELD_UNKNOWN.set(0)
        return held
    kept, released = still_held(held, read_hardware(nvml, inventory))
    for entry in released:
        log.info("held hardware is back to baseline (or gone); released", held=entry.what)
    if released:
        _write_held(directory, kept)
    if kept:
        log.error("hardware held for claims this node cannot name: tainted, never destroyed "
                  "automatically (README, Operations)", held_unknown=len(kept),
                  held=[f"{h.what}: {h.reason}" for h in kept])
    HELD_UNKNOWN.set(len(kept))
    return kept


def _say(error: CheckpointError, moved: Path | None, result: Recovery,
         held: Sequence[HeldDevice], bad_specs: Sequence[str], *, api: bool,
         slices: bool) -> None:
    """The one loud line."""
    if result.empty and not held:
        outcome = "nothing to rebuild and nothing held: starting empty"
    else:
        outcome = "rebuilt from CDI specs, hardware and API claims; held what nobody explains"
    (log.error if held else log.warning)(
        f"checkpoint unreadable; {outcome}", error=str(error),
        moved_to=str(moved) if moved else None, rebuilt_claims=len(result.rebuilt),
        rolled_back_claims=len(result.restarted), held_unknown=len(held),
        claims=list(result.rebuilt), restarted=list(result.restarted),
        held=[f"{h.what}: {h.reason}" for h in held], unusable_specs=list(bad_specs),
        api_claims_read=api, slices_read=slices)
    HELD_UNKNOWN.set(len(held))


def _mps_daemons(mps_dir: Path | None) -> list[str]:
    if mps_dir is None:
        return []
    with contextlib.suppress(OSError):
        return sorted(p.name for p in mps_dir.iterdir() if p.is_dir())
    return []


def _merge(old: Sequence[HeldDevice], new: Sequence[HeldDevice]) -> tuple[HeldDevice, ...]:
    seen = {(h.kind, h.gpu, h.mig_uuid, h.claim) for h in new}
    return (*[h for h in old if (h.kind, h.gpu, h.mig_uuid, h.claim) not in seen], *new)


def _read_held(directory: Path) -> tuple[HeldDevice, ...]:
    path = directory / HELD_FILE
    try:
        with path.open("rb") as f:
            content = f.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        return ()
    except OSError as exc:
        raise HeldFileError(f"held-hardware file {path}: {exc.strerror or exc}; fix it or "
                            "move it aside (the hardware it names is then no longer held)"
                            ) from exc
    try:
        return parse_held(content, str(path))
    except ValueError as exc:
        raise HeldFileError(f"{exc}; fix it or move it aside (the hardware it names is then "
                            "no longer held)") from exc


def _write_held(directory: Path, held: Sequence[HeldDevice]) -> None:
    path = directory / HELD_FILE
    if not held:
        path.unlink(missing_ok=True)
        return
    atomic_write(path, held_document(held), tmp=directory / f".{HELD_FILE}.tmp-{os.getpid()}",
                 mode=0o600)

"""What the checkpoint holds: the node's prepared claims and what to undo for each.

Immutable pydantic models whose field aliases are the on-disk camelCase names
(:mod:`gpudra.driver.checkpoint_codec` reads and writes them). Fields this build does not
know — written by a newer one — are kept in each record's ``model_extra`` and written back
in front of the known ones, so a downgrade → upgrade round trip loses nothing. Change a
checkpoint with the ``with_*`` functions at the bottom.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_serializer,
    field_validator,
    model_serializer,
)
from pydantic.alias_generators import to_camel

from gpudra.api.claims import PreparedDevice, claim_ref

ClaimState = Literal["PrepareStarted", "PrepareCompleted"]
PREPARE_STARTED: ClaimState = "PrepareStarted"
PREPARE_COMPLETED: ClaimState = "PrepareCompleted"
DeviceKind = Literal["gpu", "mig"]


class _Stored(BaseModel):
    # Strict: the file is JSON, so "5" is never an integer and true never a 1. Built in
    # Python by field name; the codec reads by alias only, so a snake_case key on disk is
    # an unknown field like any other.
    model_config = ConfigDict(
        extra="allow",
        frozen=True,
        strict=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )


class MigRecord(_Stored):
    """A MIG device prepared for a claim; ``created`` means we made it, so we destroy it."""

    parent_uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile_id: int
    placement_start: int
    placement_size: int
    mig_uuid: str | None = None
    created: bool = False


class VfioFunction(_Stored):
    """One PCI function a VFIO claim moves to ``vfio-pci``, and the driver to give it back."""

    bus_id: str
    """Sysfs form: ``0000:18:00.0``."""
    previous_driver: str | None
    gpu_uuid: str | None = None
    """For an NVIDIA GPU: NVML must see it again after the rebind."""


class VfioRecord(_Stored):
    """A GPU passed through by ``vfio-pci``: its IOMMU group's functions, the GPU first.

    Written before the first driver change, so undo (now or after a crash) knows every
    function that may have moved (see ``gpudra.driver.vfio``)."""

    iommu_group: int
    functions: list[VfioFunction]


class DeviceRecord(_Stored):
    """One device of a prepared claim: the kubelet's answer plus what identifies it."""

    request_names: list[str]
    pool: str
    device: str
    cdi_device_ids: list[str]
    kind: DeviceKind
    share_id: str | None = None
    uuid: str | None = None
    parent_uuid: str | None = None
    mig: MigRecord | None = None
    admin_access: bool = False
    vfio: VfioRecord | None = None
    """A VFIO passthrough device (kind ``gpu``: it holds the whole GPU)."""

    @model_serializer(mode="wrap")
    def _without_vfio_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        if dumped.get("vfio", ()) is None:
            del dumped["vfio"]  # records without it are written as before the field
        return dumped

    def prepared(self) -> PreparedDevice:
        """The kubelet's answer for this device."""
        return PreparedDevice(request_names=tuple(self.request_names), pool=self.pool,
                              device=self.device, cdi_device_ids=tuple(self.cdi_device_ids),
                              share_id=self.share_id)


class MpsRestore(_Stored):
    """The claim's own MPS control daemon: stopped at unprepare, restarted after a crash."""

    claim: str
    uuids: list[str]
    commands: list[str] | None = None
    """The control commands it was started with; absent in records of older versions."""

    @model_serializer(mode="wrap")
    def _without_unknown_commands(self, handler: SerializerFunctionWrapHandler
                                  ) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        if dumped.get("commands", ()) is None:
            del dumped["commands"]  # not known (a rebuilt record): left out, as before
        return dumped


_RESTORE_KEYS = frozenset({"computeMode", "timeSlice", "mps", "preexistingMig", "shares"})


class Restore(_Stored):
    """What unprepare must undo for a claim, recorded before or as it is changed.

    Empty fields are not written (a full GPU's record holds ``{}``, as before the model);
    keys a newer build adds are kept like any unknown field.
    """

    compute_mode: dict[str, int | str] = Field(default_factory=dict)
    """Device UUID → its compute mode before the claim (older records hold its name)."""
    time_slice: dict[str, int] = Field(default_factory=dict)
    """Device UUID → the time slice to put back."""
    mps: MpsRestore | None = None
    preexisting_mig: dict[str, list[int]] = Field(default_factory=dict)
    """GPU UUID → GPU instances on it before the claim: never ours to destroy."""
    shares: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Share ID → the share as :class:`gpudra.driver.shares.ShareEntry` records it."""

    @model_serializer(mode="wrap")
    def _without_empty(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items()
                if key not in _RESTORE_KEYS or value not in ({}, None)}

    def with_compute_mode(self, uuid: str, previous: int) -> Restore:
        """Remember a device's compute mode; a second change keeps the first one."""
        if uuid in self.compute_mode:
            return self
        return self.model_copy(update={"compute_mode": {**self.compute_mode, uuid: previous}})

    def with_time_slice(self, uuid: str, value: int) -> Restore:
        if uuid in self.time_slice:
            return self
        return self.model_copy(update={"time_slice": {**self.time_slice, uuid: value}})

    def with_mps(self, mps: MpsRestore) -> Restore:
        return self.model_copy(update={"mps": mps})


class ClaimRecord(_Stored):
    """A claim this node has started or finished preparing; ``restore`` is what unprepare
    must undo."""

    # The key in ``Checkpoint.claims``; not repeated inside the record on disk.
    uid: str = Field(exclude=True)
    namespace: str
    name: str
    state: ClaimState
    devices: list[DeviceRecord]
    restore: Restore = Field(default_factory=Restore)
    started_at: str = ""

    @field_validator("restore", mode="before")
    @classmethod
    def _as_json_has_it(cls, value: object) -> object:
        # Given as a plain dict (recovery builds one): what a reader of the file will see
        # (integer keys become strings, tuples lists), so a record compares equal to itself
        # after a save and a load.
        if not isinstance(value, dict):
            return value
        # Empty (a full GPU's, the common case): nothing to convert, skip the round trip.
        return json.loads(json.dumps(value)) if value else {}

    @property
    def ref(self) -> str:
        return claim_ref(self.namespace, self.name, self.uid)


class Checkpoint(_Stored):
    """Everything the node remembers across restarts; change it with the ``with_*`` helpers."""

    boot_id: str = Field(validation_alias="nodeBootId", serialization_alias="nodeBootId")
    claims: dict[str, ClaimRecord] = Field(default_factory=dict)
    mig_mode_baseline: dict[str, bool] = Field(default_factory=dict)
    """MIG mode per GPU UUID before gpudra first changed it (survives reboots, as MIG mode does)."""

    @field_validator("claims", mode="before")
    @classmethod
    def _uid_from_key(cls, claims: object) -> object:
        if not isinstance(claims, dict):
            return claims
        return {uid: {**raw, "uid": uid} if isinstance(raw, dict) else raw
                for uid, raw in claims.items()}

    @field_serializer("claims", "mig_mode_baseline", mode="wrap")
    def _sorted(self, value: object, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return dict(sorted(handler(value).items()))

    def completed(self) -> dict[str, ClaimRecord]:
        return {uid: c for uid, c in self.claims.items() if c.state == PREPARE_COMPLETED}

    def completed_count(self) -> int:
        """``len(completed())`` without building the dict (a gauge set per kubelet call)."""
        return sum(c.state == PREPARE_COMPLETED for c in self.claims.values())

    def started(self) -> dict[str, ClaimRecord]:
        """Claims whose prepare began but never finished (crash or failure): roll back first."""
        return {uid: c for uid, c in self.claims.items() if c.state == PREPARE_STARTED}

    def devices_in_use(self, exclude_uid: str | None = None) -> set[tuple[str, str]]:
        """``(pool, device)`` held by claims other than ``exclude_uid``, admin access aside.

        Claims in ``PrepareStarted`` count too: hardware may be half-configured for them
        until they are rolled back.
        """
        return {
            (d.pool, d.device)
            for uid, claim in self.claims.items()
            if uid != exclude_uid
            for d in claim.devices
            if not d.admin_access
        }


# --- pure transitions ------------------------------------------------------------------


def with_claim(cp: Checkpoint, record: ClaimRecord) -> Checkpoint:
    """Put ``record`` in (replacing any earlier record of its uid), as it is."""
    if cp.claims.get(record.uid) is record:
        return cp  # already there: checkpoints are immutable, so nothing to copy
    return cp.model_copy(update={"claims": {**cp.claims, record.uid: record}})


def with_claim_started(cp: Checkpoint, record: ClaimRecord) -> Checkpoint:
    """Record ``record`` as ``PrepareStarted`` (replacing any earlier record of its uid)."""
    if record.state != PREPARE_STARTED:
        record = record.model_copy(update={"state": PREPARE_STARTED})
    return with_claim(cp, record)


def with_claim_completed(cp: Checkpoint, uid: str, devices: Sequence[DeviceRecord]) -> Checkpoint:
    """Mark a started claim ``PrepareCompleted`` with the devices handed to the kubelet."""
    if uid not in cp.claims:
        raise KeyError(f"claim {uid} was never recorded as started")
    return with_claim(cp, cp.claims[uid].model_copy(
        update={"state": PREPARE_COMPLETED, "devices": list(devices)}))


def without_claim(cp: Checkpoint, uid: str) -> Checkpoint:
    """Forget a claim; a no-op when it is unknown (unprepare is idempotent)."""
    if uid not in cp.claims:
        return cp
    return cp.model_copy(update={"claims": {k: v for k, v in cp.claims.items() if k != uid}})


def with_mig_mode_baseline(cp: Checkpoint, gpu_uuid: str, enabled: bool) -> Checkpoint:
    """Remember a GPU's MIG mode before gpudra first changes it; later calls keep the first."""
    if gpu_uuid in cp.mig_mode_baseline:
        return cp
    return cp.model_copy(
        update={"mig_mode_baseline": {**cp.mig_mode_baseline, gpu_uuid: enabled}})

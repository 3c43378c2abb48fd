"""Device health policy, pure: what NVML reported → device taints and kubelet health.

Inputs are :data:`HealthEvent` s (from the XID watcher, or anything else) with the time they
were seen; the output is a :class:`HealthState`, an immutable value. Nothing here reads a
clock, touches NVML or knows about gRPC, so the policy is a table test.

The rules, and why:

- **Critical XID** → ``gpu.nvidia.com/xid=<xid>`` with effect ``NoSchedule`` (the key and
  value NVIDIA's driver uses, so tolerations written for it keep working). ``NoSchedule``,
  not ``NoExecute``: a running job may be fine or may checkpoint; evicting it is the
  operator's call (a DeviceTaintRule can escalate).
- **Scope.** An XID NVML attributes to one MIG device (GPU + compute instance ids) taints
  only that MIG device: MIG contains the fault, and NVIDIA keys XIDs by (parent, GI, CI) the
  same way. The device is named by profile and placement, so with dynamic MIG the taint
  stays on those memory slices after the instance is destroyed. An XID for the whole GPU
  taints the full GPU *and every MIG device on it* (in NVIDIA's map such an XID reaches the
  full-GPU device only, which a static-MIG GPU does not even publish).
- **Application XIDs** (13, 31, 43, 45, 68, 109 and any configured extra) are a program's
  fault, not the device's: the same key with effect ``None`` — visible to admins and
  ``kubectl``, never blocking. A device shows one ``xid`` taint: the critical one when any
  applies (an application XID must not relax a broken GPU to ``None``), else the
  application one.
- **Latest wins** for the value; ``time_added`` is when the taint first appeared and stays
  while it lasts (a new value is not a new taint).
- **Recovery** (NVIDIA's taints stay until the daemon restarts, their #1455): an XID taint
  clears once ``quiet_period`` passes without a new XID of its class in its scope; with
  ``quiet_period=None`` it never clears (NVIDIA's behaviour).
- **Recovery** (reset- or reboot-required XIDs, ``gpudra.driver.xid_catalog``): the GPU
  needs a reset, a reboot or a drain before it can be trusted, whatever the quiet period
  says. Which XIDs need what comes from NVML's GPU recovery action where the driver offers
  it (the driver knows this GPU and this fault), from NVIDIA's XID catalog otherwise. Such a
  GPU gets ``gpu.nvidia.com/recovery=<gpu-reset|node-reboot|…>`` (``NoSchedule``, or
  ``NoExecute`` where the admin opts in) on the GPU and its MIG devices: a reset resets the
  whole GPU. It never clears by itself: only when the driver reports the GPU healthy again
  (recovery action NONE after it asked for one), or, on a driver without the field, when
  the GPU comes back after being lost (a reset or reboot makes it leave the bus and
  return); the critical XIDs of that GPU clear with it (the reset made them history). A
  recovery the driver reports with no XID (e.g. after the daemon restarted) taints too.
  Until then the XID's own ``xid`` taint clears after the quiet period as any: it says what
  happened, ``recovery`` says what is needed.
- **GPU lost** (GPU_IS_LOST) → ``gpu.nvidia.com/gpu-lost`` ``NoSchedule`` (empty value)
  on the GPU and its MIG devices, until the GPU answers NVML again.
- **Unmonitored** (XID events cannot be registered) → ``gpu.nvidia.com/unmonitored``
  with effect ``None``, and health UNKNOWN rather than a HEALTHY nobody checked.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Literal

from gpudra.driver import gpu_recovery, xid_catalog
from gpudra.driver.devices import Device, NodeDevices, Taint
from gpudra.driver.mig import parse_device_name

TAINT_XID = "gpu.nvidia.com/xid"
TAINT_GPU_LOST = "gpu.nvidia.com/gpu-lost"
TAINT_UNMONITORED = "gpu.nvidia.com/unmonitored"
TAINT_RECOVERY = "gpu.nvidia.com/recovery"
OWN_TAINT_KEYS = frozenset({TAINT_XID, TAINT_GPU_LOST, TAINT_UNMONITORED, TAINT_RECOVERY})

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109}) | xid_catalog.application_xids()
"""XIDs caused by the program on the GPU (NVIDIA's default ignore list, and what the XID
catalog files as ``RESTART_APP``)."""
RecoveryEffect = Literal["NoSchedule", "NoExecute"]
RECOVERY_EFFECTS: tuple[RecoveryEffect, ...] = ("NoSchedule", "NoExecute")

DEFAULT_QUIET_PERIOD = 300.0


# --- configuration --------------------------------------------------------------------------


def parse_xids(text: str, *, field_name: str = "XID list") -> frozenset[int]:
    """``"13, 31,43"`` → ``{13, 31, 43}``; an empty string is the empty set.

    Raises :class:`ValueError` naming ``field_name`` and the bad entry.
    """
    xids = set()
    for raw in text.replace(" ", "").split(","):
        if not raw:
            continue
        if not raw.isdigit() or int(raw) <= 0:
            raise ValueError(f"{field_name}: {raw!r} is not a positive XID number")
        xids.add(int(raw))
    return frozenset(xids)


def parse_recovery_effect(text: str, *, field_name: str) -> RecoveryEffect:
    """``NoSchedule`` or ``NoExecute``; anything else raises ValueError naming the field."""
    for effect in RECOVERY_EFFECTS:
        if text.strip() == effect:
            return effect
    raise ValueError(f"{field_name}: {text.strip()!r} is not one of {', '.join(RECOVERY_EFFECTS)}")


@dataclass(frozen=True)
class HealthPolicy:
    application_xids: frozenset[int] = APPLICATION_XIDS
    """XIDs recorded with effect ``None``; every other XID is critical."""
    quiet_period: float | None = DEFAULT_QUIET_PERIOD
    """Seconds without a new XID after which an XID taint clears; ``None``: never."""
    recovery_effect: RecoveryEffect = "NoSchedule"
    """Effect of the ``recovery`` taint: ``NoExecute`` (evict) only where the admin opts in."""

    def __post_init__(self) -> None:
        if self.recovery_effect not in RECOVERY_EFFECTS:
            raise ValueError(f"recovery_effect: must be one of {', '.join(RECOVERY_EFFECTS)}, "
                             f"got {self.recovery_effect!r}")
        if self.quiet_period is not None and not self.quiet_period > 0:
            raise ValueError(f"quiet_period: must be > 0 seconds (or None), "
                             f"got {self.quiet_period}")
        bad = sorted(x for x in self.application_xids if x <= 0)
        if bad:
            raise ValueError(f"application_xids: {bad} are not positive XID numbers")

    @classmethod
    def with_additional(
        cls, additional_application_xids: Iterable[int] = (), *,
        quiet_period: float | None = DEFAULT_QUIET_PERIOD,
        recovery_effect: RecoveryEffect = "NoSchedule",
    ) -> HealthPolicy:
        """The default application XIDs plus ``additional_application_xids`` (NVIDIA's
        ``--additional-xids-to-ignore``)."""
        return cls(APPLICATION_XIDS | frozenset(additional_application_xids), quiet_period,
                   recovery_effect)

    def is_critical(self, xid: int) -> bool:
        return xid not in self.application_xids

    def recovery_needed(self, xid: int, driver_action: int | None) -> int | None:
        """The NVML recovery action ``xid`` calls for, None for none. ``driver_action`` is
        the driver's field read at the XID (None: not offered): where offered it decides,
        an XID the admin ignores included; else the catalog does, for XIDs not ignored."""
        if driver_action is not None:
            return driver_action if driver_action != gpu_recovery.NONE else None
        if xid in self.application_xids:
            return None
        needed = xid_catalog.recovery_of(xid)
        return gpu_recovery.CATALOG_ACTIONS.get(needed) if needed is not None else None


# --- inputs -----------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class MigLocation:
    """Which MIG device, in the terms its DRA device name encodes (profile id, first slice)."""

    profile_id: int
    start: int


@dataclass(frozen=True)
class XidObserved:
    gpu_uuid: str
    xid: int
    mig: MigLocation | None = None
    """Set when NVML attributed the XID to one MIG device."""
    mig_uuid: str | None = None
    """For messages only."""
    recovery_action: int | None = None
    """NVML's GPU recovery action read right after the XID; None: the driver lacks it."""


@dataclass(frozen=True)
class RecoveryActionChanged:
    """The driver's GPU recovery action changed (the watcher's probe); ``action`` None: the
    driver does not offer the field."""

    gpu_uuid: str
    action: int | None


@dataclass(frozen=True)
class GpuLostChanged:
    gpu_uuid: str
    lost: bool


@dataclass(frozen=True)
class MonitoringChanged:
    gpu_uuid: str
    monitored: bool
    reason: str = ""


HealthEvent = XidObserved | GpuLostChanged | MonitoringChanged | RecoveryActionChanged


# --- outputs ----------------------------------------------------------------------------------

HealthStatus = Literal["Healthy", "Unhealthy", "Unknown"]


@dataclass(frozen=True)
class DeviceHealth:
    """One published device as the kubelet's health stream reports it."""

    device: str
    status: HealthStatus
    message: str
    last_updated: float
    """Unix seconds."""


def rfc3339(unix_seconds: float) -> str:
    """``2025-01-02T03:04:05Z`` (whole seconds: what ``metav1.Time`` keeps)."""
    return _rfc3339_second(int(unix_seconds))


@functools.lru_cache(maxsize=4)
def _rfc3339_second(second: int) -> str:
    # Cached: a prepare stamps several claim conditions in the same second, and strftime
    # is most of what stamping one costs.
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- state ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scope:
    gpu_uuid: str
    mig: MigLocation | None


@dataclass(frozen=True)
class _XidRecord:
    xid: int
    since: float
    """When the taint appeared (its ``time_added``)."""
    last_seen: float
    """The last XID of this class in this scope: the quiet period counts from here."""
    where: str


@dataclass(frozen=True)
class _Flag:
    since: float
    reason: str = ""


@dataclass(frozen=True)
class RecoveryRecord:
    """A GPU waiting for recovery (``gpudra.driver.health_store`` keeps them)."""

    action: int
    since: float
    cause: str
    from_driver: bool
    """The driver asked for it (its field), so its NONE clears it; else the catalog did."""


@dataclass(frozen=True)
class _DeviceView:
    """Everything the state says about one device (before it becomes taints or health)."""

    critical: _XidRecord | None
    critical_since: float
    application: _XidRecord | None
    application_since: float
    lost: _Flag | None
    unmonitored: _Flag | None
    recovery: RecoveryRecord | None


@dataclass(frozen=True)
class HealthState:
    """Health of one node's GPUs. Immutable: every transition returns a new state, so one
    thread can publish snapshots while another computes the next."""

    policy: HealthPolicy = field(default_factory=HealthPolicy)
    _critical: Mapping[_Scope, _XidRecord] = field(default_factory=dict)
    _application: Mapping[_Scope, _XidRecord] = field(default_factory=dict)
    _lost: Mapping[str, _Flag] = field(default_factory=dict)
    _unmonitored: Mapping[str, _Flag] = field(default_factory=dict)
    _recovery: Mapping[str, RecoveryRecord] = field(default_factory=dict)

    # --- transitions ----------------------------------------------------------------------

    def observe(self, event: HealthEvent, now: float) -> HealthState:
        """The state after ``event``, seen at ``now`` (unix seconds)."""
        if isinstance(event, XidObserved):
            return self._xid(event, now)
        if isinstance(event, RecoveryActionChanged):
            return self._driver_recovery(event, now)
        if isinstance(event, GpuLostChanged):
            after = replace(self, _lost=_set_flag(self._lost, event.gpu_uuid, event.lost,
                                                  _Flag(now)))
            old = self._recovery.get(event.gpu_uuid)
            if not event.lost and event.gpu_uuid in self._lost and old is not None \
                    and not old.from_driver:
                # Seen again after leaving the bus (a reset, a reboot): all a driver without
                # the recovery field can tell us.
                after = replace(after, _recovery=_without(self._recovery, event.gpu_uuid),
                                _critical=_other_gpus(self._critical, event.gpu_uuid))
            return after
        return replace(self, _unmonitored=_set_flag(
            self._unmonitored, event.gpu_uuid, not event.monitored, _Flag(now, event.reason)))

    def _xid(self, event: XidObserved, now: float) -> HealthState:
        scope = _Scope(event.gpu_uuid, event.mig)
        critical = self.policy.is_critical(event.xid)
        records = dict(self._critical if critical else self._application)
        old = records.get(scope)
        where = event.gpu_uuid + (f" ({event.mig_uuid})" if event.mig_uuid else "")
        records[scope] = _XidRecord(event.xid, old.since if old else now, now, where)
        after = (replace(self, _critical=records) if critical
                 else replace(self, _application=records))
        needed = self.policy.recovery_needed(event.xid, event.recovery_action)
        if needed is None:
            return after
        from_driver = event.recovery_action is not None
        cause = f"XID {event.xid}" + (" (the driver's recovery action)" if from_driver
                                      else " (NVIDIA's XID catalog)")
        return replace(after, _recovery=_with_recovery(self._recovery, event.gpu_uuid,
                                                       RecoveryRecord(needed, now, cause,
                                                                 from_driver)))

    def _driver_recovery(self, event: RecoveryActionChanged, now: float) -> HealthState:
        old = self._recovery.get(event.gpu_uuid)
        if event.action is None:
            return self  # the driver does not say; the catalog's records stand
        if event.action == gpu_recovery.NONE:
            if old is None or not old.from_driver:
                return self
            # Recovered: the XIDs that led here are history, whatever their quiet period.
            return replace(self, _recovery=_without(self._recovery, event.gpu_uuid),
                           _critical=_other_gpus(self._critical, event.gpu_uuid))
        cause = old.cause if old is not None else "the driver's recovery action"
        return replace(self, _recovery=_with_recovery(
            self._recovery, event.gpu_uuid, RecoveryRecord(event.action, now, cause, True)))

    def expire(self, now: float) -> HealthState:
        """Drop XID records whose quiet period has passed; ``self`` when nothing changes."""
        quiet = self.policy.quiet_period
        if quiet is None:
            return self

        def keep(records: Mapping[_Scope, _XidRecord]) -> dict[_Scope, _XidRecord]:
            return {s: r for s, r in records.items() if now - r.last_seen < quiet}

        critical, application = keep(self._critical), keep(self._application)
        if len(critical) == len(self._critical) and len(application) == len(self._application):
            return self
        return replace(self, _critical=critical, _application=application)

    def next_expiry(self) -> float | None:
        """When :meth:`expire` will next change something (unix seconds), if ever."""
        if self.policy.quiet_period is None:
            return None
        seen = [r.last_seen for r in (*self._critical.values(), *self._application.values())]
        return min(seen) + self.policy.quiet_period if seen else None

    # --- views ----------------------------------------------------------------------------

    def apply(self, devices: NodeDevices) -> NodeDevices:
        """``devices`` with this state's taints (ours replaced, anyone else's kept)."""
        return replace(devices, devices=tuple(self._with_taints(d) for d in devices.devices))

    def _with_taints(self, device: Device) -> Device:
        ours = self._taints(self._view(device))
        kept = tuple(t for t in device.taints if t.key not in OWN_TAINT_KEYS)
        if not ours and len(kept) == len(device.taints):
            return device
        return replace(device, taints=kept + ours)

    def device_health(self, devices: NodeDevices, checked_at: float) -> tuple[DeviceHealth, ...]:
        """Every device's health; ``checked_at`` is when the watcher last confirmed it."""
        return tuple(self._health(device, self._view(device), checked_at)
                     for device in devices.devices)

    def fingerprint(self) -> tuple[object, ...]:
        """Equal for two states whose taints are equal: a repeat of the same XID in the same
        scope only moves its quiet period, so it is no change worth republishing."""
        return (_shown(self._critical), _shown(self._application),
                frozenset(self._lost), frozenset(self._unmonitored),
                frozenset((g, r.action, int(r.since)) for g, r in self._recovery.items()))

    def recoveries(self) -> Mapping[str, RecoveryRecord]:
        """GPU UUID → what it waits for, as kept across restarts."""
        return self._recovery

    def with_recoveries(self, records: Mapping[str, RecoveryRecord]) -> HealthState:
        """This state with ``records`` (from before a restart) added."""
        merged = dict(self._recovery)
        for gpu, record in records.items():
            merged[gpu] = merged.get(gpu, record)
        return replace(self, _recovery=merged)

    def recovering(self) -> Mapping[str, str]:
        """GPU UUID → the recovery it waits for (``gpu-reset`` …)."""
        return {gpu: gpu_recovery.name(r.action) for gpu, r in self._recovery.items()}

    def _view(self, device: Device) -> _DeviceView:
        gpu_uuid, mig = _identity(device)
        scopes = [_Scope(gpu_uuid, None)] + ([_Scope(gpu_uuid, mig)] if mig else [])
        critical = [r for s in scopes if (r := self._critical.get(s)) is not None]
        application = [r for s in scopes if (r := self._application.get(s)) is not None]
        return _DeviceView(
            critical=_latest(critical),
            critical_since=min((r.since for r in critical), default=0.0),
            application=_latest(application),
            application_since=min((r.since for r in application), default=0.0),
            lost=self._lost.get(gpu_uuid),
            unmonitored=self._unmonitored.get(gpu_uuid),
            recovery=self._recovery.get(gpu_uuid),
        )

    def _taints(self, view: _DeviceView) -> tuple[Taint, ...]:
        taints = []
        if view.critical is not None:
            taints.append(Taint(TAINT_XID, str(view.critical.xid), "NoSchedule",
                                rfc3339(view.critical_since)))
        elif view.application is not None:
            taints.append(Taint(TAINT_XID, str(view.application.xid), "None",
                                rfc3339(view.application_since)))
        if view.lost is not None:
            taints.append(Taint(TAINT_GPU_LOST, "", "NoSchedule", rfc3339(view.lost.since)))
        if view.unmonitored is not None:
            taints.append(Taint(TAINT_UNMONITORED, "", "None", rfc3339(view.unmonitored.since)))
        if view.recovery is not None:
            taints.append(Taint(TAINT_RECOVERY, gpu_recovery.name(view.recovery.action),
                                self.policy.recovery_effect, rfc3339(view.recovery.since)))
        return tuple(taints)

    def _health(self, device: Device, view: _DeviceView, checked_at: float) -> DeviceHealth:
        problems, notes = [], []
        if view.lost is not None:
            problems.append(f"GPU is lost (NVML GPU_IS_LOST) since {rfc3339(view.lost.since)}: "
                            "it fell off the bus or needs a reset")
        if view.recovery is not None:
            problems.append(_recovery_message(view.recovery))
        if view.critical is not None:
            problems.append(f"critical XID {view.critical.xid} on {view.critical.where} "
                            f"at {rfc3339(view.critical.last_seen)}{self._clears()}")
        elif view.application is not None:
            notes.append(f"application XID {view.application.xid} on {view.application.where} "
                         f"at {rfc3339(view.application.last_seen)} (a program's fault, "
                         "not the device's)")
        status: HealthStatus = "Unhealthy" if problems else "Healthy"
        if view.unmonitored is not None and not problems:
            status = "Unknown"
            notes.insert(0, "XID events cannot be watched on this GPU: "
                         + (view.unmonitored.reason or "not supported"))
        return DeviceHealth(device.name, status, "; ".join(problems + notes), checked_at)

    def _clears(self) -> str:
        quiet = self.policy.quiet_period
        if quiet is None:
            return ""
        return f"; clears after {quiet:g} s without another critical XID"


def _recovery_message(recovery: RecoveryRecord) -> str:
    until = ("until the driver reports no recovery action pending" if recovery.from_driver
             else "until the GPU is seen again after a reset, or the daemon restarts "
                  "(this driver does not report recovery actions)")
    return (f"needs {gpu_recovery.name(recovery.action)} since {rfc3339(recovery.since)} "
            f"({recovery.cause}); unschedulable {until}")


def _with_recovery(records: Mapping[str, RecoveryRecord], gpu: str,
                   new: RecoveryRecord) -> Mapping[str, RecoveryRecord]:
    """``records`` with ``new`` for ``gpu``; one already there keeps its ``since`` (the
    taint's time) and counts as the driver's once either said so."""
    old = records.get(gpu)
    if old is not None:
        new = RecoveryRecord(new.action, old.since, new.cause, old.from_driver or new.from_driver)
        if new == old:
            return records
    return {**records, gpu: new}


def _without(records: Mapping[str, RecoveryRecord], gpu: str) -> Mapping[str, RecoveryRecord]:
    return {g: r for g, r in records.items() if g != gpu}


def _other_gpus(records: Mapping[_Scope, _XidRecord], gpu: str) -> Mapping[_Scope, _XidRecord]:
    """``records`` without those of ``gpu`` (and its MIG devices)."""
    return {scope: r for scope, r in records.items() if scope.gpu_uuid != gpu}


def _set_flag(flags: Mapping[str, _Flag], key: str, on: bool, flag: _Flag) -> Mapping[str, _Flag]:
    if on == (key in flags):
        return flags  # already so: keep the original ``since``
    updated = dict(flags)
    if on:
        updated[key] = flag
    else:
        del updated[key]
    return updated


def _latest(records: list[_XidRecord]) -> _XidRecord | None:
    return max(records, key=lambda r: r.last_seen, default=None)


def _shown(records: Mapping[_Scope, _XidRecord]) -> frozenset[tuple[_Scope, int, int]]:
    """(scope, XID shown, since) per scope. A MIG device also sees its GPU's record, and the
    latest of the two is shown, so a repeat can change what a MIG device shows."""
    shown = set()
    for scope, record in records.items():
        pair = [record]
        if scope.mig is not None and (gpu := records.get(_Scope(scope.gpu_uuid, None))):
            pair.append(gpu)
        latest = max(pair, key=lambda r: r.last_seen)
        shown.add((scope, latest.xid, int(min(r.since for r in pair))))
    return frozenset(shown)


def _identity(device: Device) -> tuple[str, MigLocation | None]:
    """(GPU UUID, MIG location) of a published device: full GPUs carry ``uuid``, MIG devices
    (static or dynamic) ``parentUUID`` and a name that encodes profile and placement."""
    attrs = device.attributes
    if device.type == "mig":
        ref = parse_device_name(device.name)
        mig = MigLocation(ref.profile_id, ref.start) if ref is not None else None
        return str(attrs.get("parentUUID", "")), mig
    return str(attrs.get("uuid", "")), None

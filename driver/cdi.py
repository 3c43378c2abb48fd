"""CDI: the spec model and one transient spec file per claim.

A claim's spec is ``<cdi_root>/k8s.<driver>-claim_<claimUID>.json`` with kind
``k8s.<driver>/claim`` and device names ``<claimUID>-<device>``, so a runtime's CDI cache
never serves one claim's edits to another. Spec-level edits (control nodes, libraries,
binaries) apply whenever any of the claim's devices is requested; each device adds its own
device nodes. ``cdiVersion`` is the lowest the content needs, so older runtimes accept it.
What goes into the edits is found under the driver root by :mod:`gpudra.driver.driver_root`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from gpudra.driver.files import atomic_write, fsync_directory, make_dirs, open_created, write_all
from gpudra.driver.paths import UnsafePath, child, child_path

CDI_CLASS = "claim"
DEFAULT_CDI_ROOT = Path("/var/run/cdi")
BASE_VERSION = "0.3.0"


class CdiError(Exception):
    """A spec cannot be built or written, or the driver root lacks what containers need."""


# --- container edits ------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceNode:
    """A device node in the container; ``host_path`` only when it differs from ``path``."""

    path: str
    host_path: str | None = None
    type: Literal["c"] | None = None
    major: int | None = None
    minor: int | None = None
    permissions: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        for key, value in (
            ("hostPath", self.host_path),
            ("type", self.type),
            ("major", self.major),
            ("minor", self.minor),
            ("permissions", self.permissions),
        ):
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    options: Sequence[str] = ()
    type: str | None = None
    """Setting it raises the spec to cdiVersion 0.4.0."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", tuple(self.options))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hostPath": self.host_path, "containerPath": self.container_path}
        if self.options:
            out["options"] = list(self.options)
        if self.type is not None:
            out["type"] = self.type
        return out


HOOK_NAMES = ("createRuntime", "createContainer", "startContainer", "poststart", "poststop")


@dataclass(frozen=True)
class Hook:
    hook_name: str
    path: str
    args: Sequence[str] = ()
    env: Sequence[str] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "env", tuple(self.env))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hookName": self.hook_name, "path": self.path}
        if self.args:
            out["args"] = list(self.args)
        if self.env:
            out["env"] = list(self.env)
        return out


@dataclass(frozen=True)
class ContainerEdits:
    """CDI ``containerEdits``; sequences are stored as tuples so equal edits compare equal."""

    env: Sequence[str] = ()
    device_nodes: Sequence[DeviceNode] = ()
    mounts: Sequence[Mount] = ()
    hooks: Sequence[Hook] = ()

    def __post_init__(self) -> None:
        for name in ("env", "device_nodes", "mounts", "hooks"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def merge(self, *others: ContainerEdits) -> ContainerEdits:
        """Concatenate, keeping the first device node per path and mount per container path."""
        every = (self, *others)
        return ContainerEdits(
            env=_unique(e for x in every for e in x.env),
            device_nodes=_unique((n for x in every for n in x.device_nodes), key=_node_path),
            mounts=_unique((m for x in every for m in x.mounts), key=_mount_target),
            hooks=_unique(h for x in every for h in x.hooks),
        )

    def is_empty(self) -> bool:
        return not (self.env or self.device_nodes or self.mounts or self.hooks)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [n.to_json() for n in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_json() for m in self.mounts]
        if self.hooks:
            out["hooks"] = [h.to_json() for h in self.hooks]
        return out

    def shared_json(self, where: str) -> SharedJson:
        """:meth:`to_json`, validated (as ``where``) and built once for this object: the
        edits every claim's spec shares. Read-only: each spec holding it holds the same one."""
        cached: SharedJson | None = self.__dict__.get("_shared_json")
        if cached is None:
            self.validate(where)
            cached = SharedJson(self.to_json())
            object.__setattr__(self, "_shared_json", cached)
        return cached

    def validate(self, where: str) -> None:
        for env in self.env:
            if "=" not in env[1:]:
                raise CdiError(f"{where}.env: {env!r} is not KEY=VALUE")
        for node in self.device_nodes:
            if not node.path.startswith("/"):
                raise CdiError(f"{where}.deviceNodes: path {node.path!r} is not absolute")
            if node.permissions is not None and not set(node.permissions) <= set("rwm"):
                raise CdiError(
                    f"{where}.deviceNodes[{node.path}].permissions: {node.permissions!r}"
                    " is not a subset of 'rwm'"
                )
        for mount in self.mounts:
            if not mount.host_path or not mount.container_path:
                raise CdiError(f"{where}.mounts: {mount} needs hostPath and containerPath")
        for hook in self.hooks:
            if hook.hook_name not in HOOK_NAMES:
                raise CdiError(f"{where}.hooks: hookName {hook.hook_name!r} not in {HOOK_NAMES}")
            if not hook.path.startswith("/"):
                raise CdiError(f"{where}.hooks: path {hook.path!r} is not absolute")


class SharedJson(dict[str, Any]):
    """A ``containerEdits`` object many specs share (the driver's files): serialised once,
    by :func:`write_spec`, not once per claim."""

    text: str | None = None


_T = TypeVar("_T")


def _unique(items: Iterable[_T], key: Callable[[_T], object] | None = None) -> list[_T]:
    seen: set[object] = set()
    out: list[_T] = []
    for item in items:
        k = item if key is None else key(item)
        if k not in seen:
            seen.add(k)
            out.append(item)
    return out


def _node_path(node: DeviceNode) -> str:
    return node.path


def _mount_target(mount: Mount) -> str:
    return mount.container_path


@dataclass(frozen=True)
class CdiDevice:
    """One prepared device: ``name`` is the DRA device name (``gpu-0``), not the CDI name."""

    name: str
    edits: ContainerEdits = field(default_factory=ContainerEdits)


# --- names -------------------------------------------------------------------------------

_VENDOR_RE = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CLASS_RE = _VENDOR_RE
_DEVICE_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_UUID_PREFIX_RE = re.compile(r"^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                             r"[0-9a-fA-F]{12})-")


def vendor(driver: str) -> str:
    return f"k8s.{driver}"


def spec_kind(driver: str) -> str:
    return f"{vendor(driver)}/{CDI_CLASS}"


def device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def qualified_name(driver: str, claim_uid: str, device: str) -> str:
    """The id handed to the kubelet: ``k8s.gpu.nvidia.com/claim=<uid>-gpu-0``."""
    return f"{spec_kind(driver)}={device_name(claim_uid, device)}"


def spec_file_name(driver: str, claim_uid: str) -> str:
    # CDI's GenerateTransientSpecName: <vendor>-<class>_<id>, "/" in the id becomes "_".
    return f"{vendor(driver)}-{CDI_CLASS}_{claim_uid.replace('/', '_')}.json"


def spec_path(cdi_root: Path, driver: str, claim_uid: str) -> Path:
    return child_path(cdi_root, spec_file_name(driver, claim_uid), "CDI spec name")


def validate_names(kind: str, device_names: Sequence[str]) -> None:
    vendor_part, _, class_part = kind.partition("/")
    if not _VENDOR_RE.match(vendor_part) or len(vendor_part) > 253:
        raise CdiError(
            f"CDI vendor {vendor_part!r} must start with a letter, end with a letter or digit"
            " and contain only letters, digits, '-', '_' and '.' (at most 253 characters)"
        )
    if not _CLASS_RE.match(class_part) or len(class_part) > 63:
        raise CdiError(
            f"CDI class {class_part!r} must start with a letter, end with a letter or digit"
            " and contain only letters, digits, '-', '_' and '.' (at most 63 characters)"
        )
    for name in device_names:
        if not _DEVICE_RE.match(name):
            raise CdiError(
                f"CDI device name {name!r} must start and end with a letter or digit and"
                " contain only letters, digits, '-', '_', '.' and ':'"
            )


# --- spec ----------------------------------------------------------------------------------


def build_claim_spec(
    *,
    driver: str,
    claim_uid: str,
    devices: Sequence[CdiDevice],
    common: ContainerEdits,
) -> dict[str, Any]:
    """A complete CDI spec for one claim, at the lowest ``cdiVersion`` its content needs."""
    if not devices:
        raise CdiError(f"claim {claim_uid}: a CDI spec needs at least one device")
    names = [device_name(claim_uid, d.name) for d in devices]
    validate_names(spec_kind(driver), names)
    if len(set(names)) != len(names):
        raise CdiError(f"claim {claim_uid}: device names repeat: {names}")
    shared = common.shared_json("containerEdits")
    spec_devices = []
    for name, d in zip(names, devices, strict=True):
        if d.edits.is_empty():
            # CDI rejects a device without edits; it would also give the container nothing.
            raise CdiError(f"CDI device {name}: no container edits")
        d.edits.validate(f"devices[{name}].containerEdits")
        spec_devices.append({"name": name, "containerEdits": d.edits.to_json()})
    spec: dict[str, Any] = {"cdiVersion": "", "kind": spec_kind(driver), "devices": spec_devices}
    if not common.is_empty():
        spec["containerEdits"] = shared  # last: write_spec splices its cached text there
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def _all_edits(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    devices = spec.get("devices") or []
    return [spec.get("containerEdits") or {}, *[d.get("containerEdits") or {} for d in devices]]


def _needs_1_1_0(spec: Mapping[str, Any]) -> bool:
    return any(
        e.get("netDevices")
        or any(k in (e.get("intelRdt") or {}) for k in ("schemata", "enableMonitoring"))
        for e in _all_edits(spec)
    )


def _needs_0_7_0(spec: Mapping[str, Any]) -> bool:
    return any(e.get("intelRdt") is not None or e.get("additionalGids") for e in _all_edits(spec))


def _needs_0_6_0(spec: Mapping[str, Any]) -> bool:
    devices = spec.get("devices") or []
    _, _, class_part = str(spec.get("kind", "")).partition("/")
    return bool(spec.get("annotations")) or any(d.get("annotations") for d in devices) or (
        "." in class_part
    )


def _needs_0_5_0(spec: Mapping[str, Any]) -> bool:
    # A name starting with a digit (claim UIDs can) was allowed only in 0.5.0.
    names = [str(d.get("name", "")) for d in spec.get("devices") or []]
    if any(name and not name[0].isalpha() for name in names):
        return True
    return any(n.get("hostPath") for e in _all_edits(spec) for n in e.get("deviceNodes") or [])


def _needs_0_4_0(spec: Mapping[str, Any]) -> bool:
    return any(m.get("type") for e in _all_edits(spec) for m in e.get("mounts") or [])


# Highest first; the first rule that matches decides.
_VERSION_RULES: tuple[tuple[str, Callable[[Mapping[str, Any]], bool]], ...] = (
    ("1.1.0", _needs_1_1_0),
    ("0.7.0", _needs_0_7_0),
    ("0.6.0", _needs_0_6_0),
    ("0.5.0", _needs_0_5_0),
    ("0.4.0", _needs_0_4_0),
)


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The lowest CDI version whose schema allows everything ``spec`` uses (CDI 1.1.0 rules)."""
    for version, needed in _VERSION_RULES:
        if needed(spec):
            return version
    return BASE_VERSION


def _version_tuple(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in version.removeprefix("v").split("."))
    except ValueError:
        raise CdiError(f"cdiVersion {version!r} is not a version") from None


# --- files ---------------------------------------------------------------------------------


def write_spec(cdi_root: Path, spec: Mapping[str, Any], *, claim_uid: str | None = None,
               durable: bool = True) -> Path:
    """Write a claim's spec atomically (temp, fsync, rename, directory fsync); returns its path.

    ``claim_uid`` defaults to the UUID that prefixes every device name (Kubernetes UIDs are
    UUIDs). ``durable=False`` leaves out both fsyncs: a caller writing several specs calls
    :func:`sync_root` once afterwards.
    """
    kind = str(spec.get("kind", ""))
    vendor_part, _, class_part = kind.partition("/")
    if class_part != CDI_CLASS or not vendor_part.startswith("k8s."):
        raise CdiError(f"spec kind {kind!r} is not a claim spec (k8s.<driver>/{CDI_CLASS})")
    uid = claim_uid if claim_uid is not None else _uid_from_devices(spec)
    declared = str(spec.get("cdiVersion", ""))
    needed = minimum_version(spec)
    if _version_tuple(declared) < _version_tuple(needed):
        raise CdiError(f"spec declares cdiVersion {declared!r} but its content needs {needed}")
    name = spec_file_name(vendor_part.removeprefix("k8s."), uid)
    try:
        path = child_path(cdi_root, name, "CDI spec name")
    except UnsafePath as err:
        raise CdiError(str(err)) from None
    content = _serialise(spec)
    # Hidden and not ending in .json, so runtimes scanning the directory ignore it.
    tmp = f".{name}.tmp-{os.getpid()}"
    try:
        if durable:
            make_dirs(cdi_root, ROOT_MODE)
            atomic_write(path, content, tmp=cdi_root / tmp, mode=SPEC_MODE)
        else:
            _replace_unsynced(cdi_root, name, tmp, content)
    except OSError as err:
        raise CdiError(f"cannot write CDI spec {path}: {err.strerror or err}") from err
    return path


def _serialise(spec: Mapping[str, Any]) -> bytes:
    """The spec as one line of JSON (indentation would switch json to its pure-Python
    encoder, on the hot path). Shared edits last in the spec (as build_claim_spec puts them)
    are spliced in from the text made the first time: the driver's files are most of a
    spec, and the same in every claim's."""
    shared = spec.get("containerEdits")
    if not isinstance(shared, SharedJson) or list(spec)[-1] != "containerEdits":
        return (json.dumps(spec) + "\n").encode()
    if shared.text is None:
        shared.text = json.dumps(shared)
    head = json.dumps({k: v for k, v in spec.items() if k != "containerEdits"})
    return f'{head[:-1]}, "containerEdits": {shared.text}}}\n'.encode()


_CREATE = os.O_WRONLY | os.O_TRUNC
# Container runtimes read the specs (containerd and CRI-O as root, but also rootless
# podman, and tools listing devices as a user): world-readable, as every CDI writer
# (nvidia-ctk, the CDI library's spec cache) makes them. A spec holds device paths, mounts
# and environment, no secret; nobody but us may write one (it decides what a container
# gets), hence 0644 and a 0755 root, not the umask's 0666/0777.
SPEC_MODE = 0o644
ROOT_MODE = 0o755


def _replace_unsynced(directory: Path, name: str, tmp: str, content: bytes) -> None:
    """``atomic_write(durable=False)`` on the prepare path: plain ``os`` calls on strings (no
    Path objects, no buffered file), and the directory made only when it is missing."""
    root = os.fspath(directory)
    tmp_path = f"{root}/{tmp}"
    try:
        fd = open_created(tmp_path, _CREATE, SPEC_MODE)
    except FileNotFoundError:
        make_dirs(directory, ROOT_MODE)
        fd = open_created(tmp_path, _CREATE, SPEC_MODE)
    try:
        try:
            write_all(fd, content, f"{root}/{name}")
        finally:
            os.close(fd)
        os.replace(tmp_path, f"{root}/{name}")  # noqa: PTH105
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_path)  # noqa: PTH108
        raise


def sync_root(cdi_root: Path) -> None:
    """Make the specs written (renamed) into ``cdi_root`` so far durable: one directory fsync."""
    try:
        fsync_directory(cdi_root)
    except OSError as err:
        raise CdiError(f"cannot sync CDI directory {cdi_root}: {err.strerror or err}") from err


def _uid_from_devices(spec: Mapping[str, Any]) -> str:
    uids = set()
    for d in spec.get("devices") or []:
        m = _UUID_PREFIX_RE.match(str(d.get("name", "")))
        uids.add(m.group(1) if m else None)
    if len(uids) != 1 or None in uids:
        raise CdiError("cannot tell the claim UID from the spec's device names; pass claim_uid")
    return str(uids.pop())


def remove_spec(cdi_root: Path, driver: str, claim_uid: str) -> bool:
    """Delete a claim's spec; ``False`` when there was none (unprepare is idempotent)."""
    name = spec_file_name(driver, claim_uid)
    try:
        path = child(cdi_root, name, "CDI spec name")
    except UnsafePath as err:  # a caller's error for this claim, like any other here
        raise CdiError(str(err)) from None
    try:
        os.unlink(path)  # noqa: PTH108 - per unprepare: no Path
    except FileNotFoundError:
        return False
    except OSError as err:
        # A read-only root answers EROFS before it looks the name up: when no spec is
        # there (a prepare whose write failed, rolled back), there is nothing to remove,
        # and the write's error is the one to report, not this one.
        if not os.path.lexists(path):
            return False
        raise CdiError(f"cannot remove CDI spec {cdi_root / name}: {err.strerror or err}") \
            from err
    # No directory fsync: a removal lost in a crash leaves a stray spec, which
    # list_claim_specs finds at startup.
    return True


def check_root(cdi_root: Path) -> None:
    """At start-up: a CDI root that exists but is no directory can never hold a spec, so
    every prepare would fail; refuse to start, naming it (one line, no traceback)."""
    if os.path.lexists(cdi_root) and not cdi_root.is_dir():
        raise CdiError(f"--cdi-root {cdi_root} is not a directory: point --cdi-root (env "
                       "CDI_ROOT) at the directory the container runtime reads CDI specs from")


def remove_stale_spec(path: Path) -> str | None:
    """Remove a spec no prepared claim owns (start-up); what went wrong, else ``None``.

    A spec that cannot be removed (a read-only CDI root) is a warning for the caller, not
    a failed start-up: it names devices of no prepared claim, which no new container is
    given, and the daemon says so until someone removes it.
    """
    try:
        path.unlink(missing_ok=True)
    except OSError as err:
        return (f"cannot remove CDI spec {path}, which no prepared claim owns: "
                f"{err.strerror or err}; remove it by hand")
    return None


def list_claim_specs(cdi_root: Path, driver: str) -> dict[str, Path]:
    """Claim specs of this driver in ``cdi_root`` by claim UID (stray ones after a crash).

    ``.yaml`` files count too: NVIDIA's driver writes the same names with that extension.
    """
    prefix = f"{vendor(driver)}-{CDI_CLASS}_"
    found: dict[str, Path] = {}
    try:
        entries = sorted(cdi_root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return found
    for path in entries:
        name = path.name
        for suffix in (".json", ".yaml"):
            if name.startswith(prefix) and name.endswith(suffix):
                found.setdefault(name[len(prefix) : -len(suffix)], path)
    return found

#!/usr/bin/env python3
"""``nvidia-cdi-hook``: the OCI hooks our CDI specs name, with NVIDIA's command line.

The container runtime runs it on the host at ``createContainer``, with the container's OCI
state on standard input, as ``nvidia-cdi-hook [--debug] [--quiet] <hook> [flags]`` (or as
``nvidia-ctk hook <hook>`` under that name). The hooks, as nvidia-container-toolkit's
``cmd/nvidia-cdi-hook`` defines them:

``create-symlinks --link TARGET::LINK``
    create ``LINK`` (a path in the container) pointing to ``TARGET``;
``update-ldcache --folder DIR [--ldconfig-path P]``
    add ``DIR`` to the container's ``ld.so.conf.d`` and rebuild its ``ld.so.cache``;
``enable-cuda-compat --host-driver-version=V``
    put ``/usr/local/cuda/compat`` first when the image's forward-compatibility libcuda is
    newer than the host driver;
``disable-device-node-modification``
    show the container a ``/proc/driver/nvidia/params`` with ``ModifyDeviceFiles: 0``, so
    NVML in the container never creates or changes device nodes;
``chmod --mode M --path P``
    set ``P``'s mode (``/dev/dri``, which rootless runtimes create 0700).

An unknown hook is a warning and success, as NVIDIA's: a spec written for a newer toolkit
must not stop a container from starting.

This file is a program on its own (the Python standard library only): the chart copies it to
the host, where nothing else of gpudra is. Every path of the container is resolved inside its
root filesystem, a symlink's absolute target included, so an image cannot point a hook at
a host file.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import json
import os
import re
import secrets
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

PARAMS = "/proc/driver/nvidia/params"
DEFAULT_COMPAT = "/usr/local/cuda/compat"
DEFAULT_LDCONFIG = "/sbin/ldconfig"
_SYMLINK_HOPS = 40


class HookError(Exception):
    """A hook cannot do what it was asked: the message goes to the runtime's log."""


# --- the container ---------------------------------------------------------------------


def container_root(state_file: str | None) -> Path:
    """The container's root filesystem, from its OCI state (stdin, or ``--container-spec``)."""
    try:
        if state_file in (None, "", "-"):
            state = json.load(sys.stdin)
        else:
            with open(state_file, encoding="utf-8") as f:  # noqa: PTH123 - a flag's path
                state = json.load(f)
    except (OSError, ValueError) as err:
        raise HookError(f"cannot read the container state: {err}") from err
    bundle = Path(str(state.get("bundle") or ""))
    if not bundle.is_absolute():
        raise HookError(f"container state has no absolute bundle path: {state.get('bundle')!r}")
    try:
        config = json.loads((bundle / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise HookError(f"cannot read {bundle / 'config.json'}: {err}") from err
    root = Path(str((config.get("root") or {}).get("path") or ""))
    root = root if root.is_absolute() else bundle / root
    if str(root) in ("", "/", str(bundle)) or not root.is_dir():
        raise HookError(f"container root {root} is not a directory")
    return root


def in_root(root: Path, path: str, *, follow_last: bool = True) -> Path:
    """``path`` of the container as a host path under ``root``: symlinks are followed inside
    the root (an absolute target means the root's), ``..`` stops at the root."""
    pending = [p for p in path.split("/") if p]
    resolved: list[str] = []
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = root.joinpath(*resolved, part)
        if candidate.is_symlink() and (pending or follow_last):
            hops += 1
            if hops > _SYMLINK_HOPS:
                raise HookError(f"too many symlinks resolving {path} in the container")
            target = str(candidate.readlink())
            if target.startswith("/"):
                resolved = []
            pending = [p for p in target.split("/") if p] + pending
            continue
        resolved.append(part)
    return root.joinpath(*resolved)


def _write_new(root: Path, directory: str, pattern: str, lines: Sequence[str]) -> Path:
    """A new file (``*`` in ``pattern`` made unique) in the container's ``directory``."""
    folder = in_root(root, directory)
    folder.mkdir(parents=True, exist_ok=True, mode=0o755)
    path = folder / pattern.replace("*", secrets.token_hex(8))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{line}\n" for line in dict.fromkeys(lines)))
    # World-readable whatever the umask: containers may run as any user.
    path.chmod(0o644)
    return path


# --- the hooks ---------------------------------------------------------------------------


def create_symlinks(root: Path, links: Sequence[str]) -> None:
    for spec in dict.fromkeys(links):
        target, sep, link = spec.partition("::")
        if not sep or not target or not link or "::" in link:
            raise HookError(f"invalid symlink specification {spec!r} (want TARGET::LINK)")
        path = in_root(root, link, follow_last=False)
        if path.is_symlink() and str(path.readlink()) == target:
            continue
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        if path.is_symlink() or path.exists():
            if path.is_dir() and not path.is_symlink():
                raise HookError(f"cannot create link {link}: a directory is there")
            path.unlink()
        path.symlink_to(target)


def chmod(root: Path, paths: Sequence[str], mode: str) -> None:
    try:
        wanted = int(mode, 8)
    except ValueError:
        raise HookError(f"--mode {mode!r} is not an octal mode") from None
    for p in paths:
        if not p.strip():
            raise HookError("--path must not be empty")
        path = in_root(root, p)
        try:
            current = stat.S_IMODE(path.stat().st_mode)
        except OSError:
            continue  # not in this container
        if current == wanted:
            continue
        with contextlib.suppress(PermissionError):  # e.g. a whole /dev bind-mounted read-only
            path.chmod(wanted)


def _major(version: str) -> int | None:
    m = re.match(r"(\d+)", version)
    return int(m.group(1)) if m else None


def enable_cuda_compat(root: Path, host_driver_version: str, compat_root: str) -> Path | None:
    """The ``ld.so.conf.d`` file naming the image's compat directory, when it is to be used:
    its libcuda's major version is newer than the host driver's."""
    host = _major(host_driver_version) if host_driver_version else None
    if host is None:
        return None
    compat = in_root(root, compat_root)
    if not compat.is_dir():
        return None
    libs = sorted(p for p in compat.glob("libcuda.so.*.*") if not p.is_dir())
    if len(libs) != 1:
        return None
    compat_major = _major(libs[0].name.removeprefix("libcuda.so."))
    if compat_major is None or compat_major <= host:
        return None
    inside = "/" + str(compat.relative_to(root))
    return _write_new(root, "/etc/ld.so.conf.d", "00-compat-*.conf", [inside])


def _system_dirs(root: Path) -> list[str]:
    """The container's own library directories: the host's ldconfig may know others."""
    if in_root(root, "/etc/debian_version").exists():
        machine = os.uname().machine
        triplet = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}.get(
            machine, f"{machine}-linux-gnu")
        return [f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib", "/usr/lib"]
    return ["/lib64", "/usr/lib64", "/lib", "/usr/lib"]


def update_ldcache(root: Path, folders: Sequence[str], ldconfig: str) -> list[str]:
    """Write the folders to the container's ``ld.so.conf.d`` and run ``ldconfig`` in its root;
    returns the command run."""
    conf = in_root(root, "/etc/ld.so.conf")
    if not conf.exists():
        conf.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        conf.write_text("include /etc/ld.so.conf.d/*.conf\n")
    wanted = [f for f in dict.fromkeys(folders) if in_root(root, f).is_dir()]
    if wanted:
        _write_new(root, "/etc/ld.so.conf.d", "00-nvcr-*.conf", wanted)
    _write_new(root, "/etc/ld.so.conf.d", "zz-nvcr-*.conf", _system_dirs(root))
    argv = [ldconfig, "-r", str(root), "-f", "/etc/ld.so.conf", "-C", "/etc/ld.so.cache"]
    try:
        subprocess.run(argv, check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", b"") or b""
        raise HookError(f"{' '.join(argv)} failed: {err} {detail.decode(errors='replace')}") \
            from err
    return argv


def params_without_device_file_changes(text: str) -> str | None:
    """The driver's params with ``ModifyDeviceFiles: 0``; ``None`` when nothing changes."""
    lines = text.splitlines()
    if "ModifyDeviceFiles: 1" not in lines:
        return None
    return "".join(("ModifyDeviceFiles: 0" if line == "ModifyDeviceFiles: 1" else line) + "\n"
                   for line in lines)


_MS_RDONLY, _MS_REMOUNT, _MS_BIND = 1, 32, 4096


def disable_device_node_modification(root: Path, host_params: str = PARAMS) -> bool:
    """Bind a read-only copy of the params with ``ModifyDeviceFiles: 0`` over the container's
    (the hook runs in the container's mount namespace); ``False`` when nothing was needed."""
    try:
        text = Path(host_params).read_text()
    except FileNotFoundError:
        return False
    modified = params_without_device_file_changes(text)
    if modified is None:
        return False
    target = in_root(root, PARAMS)
    if not target.exists():
        return False
    fd = os.memfd_create("nvidia-params")
    try:
        os.write(fd, modified.encode())
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        source = f"/proc/self/fd/{fd}".encode()
        for flags in (_MS_BIND, _MS_BIND | _MS_REMOUNT | _MS_RDONLY):
            src = source if flags == _MS_BIND else None
            if libc.mount(src, str(target).encode(), None, flags, None) != 0:
                errno = ctypes.get_errno()
                raise HookError(f"cannot mount over {target}: {os.strerror(errno)}")
    finally:
        os.close(fd)
    return True


# --- the command line --------------------------------------------------------------------

HOOKS = ("create-symlinks", "update-ldcache", "enable-cuda-compat",
         "disable-device-node-modification", "chmod", "noop")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="nvidia-cdi-hook",
        description="Hooks a container runtime runs from a CDI spec (NVIDIA's command line).")
    top.add_argument("-d", "--debug", action="store_true")
    top.add_argument("--quiet", action="store_true")
    sub = top.add_subparsers(dest="hook")

    def hook(name: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name)
        p.add_argument("--container-spec", default=None,
                       help="the OCI state file; default: standard input")
        return p

    hook("create-symlinks").add_argument("--link", action="append", default=[])
    ld = hook("update-ldcache")
    ld.add_argument("--folder", action="append", default=[])
    ld.add_argument("--ldconfig-path", default=DEFAULT_LDCONFIG)
    compat = hook("enable-cuda-compat")
    compat.add_argument("--host-driver-version", default="")
    compat.add_argument("--host-cuda-version", default="")
    compat.add_argument("--cuda-compat-container-root", default=DEFAULT_COMPAT)
    hook("disable-device-node-modification")
    mode = hook("chmod")
    mode.add_argument("--path", action="append", default=[])
    mode.add_argument("--mode", required=True)
    hook("noop")
    return top


def run(argv: Sequence[str]) -> None:
    args = parser().parse_args(argv)
    if args.hook == "noop":
        return
    root = container_root(args.container_spec)
    if args.hook == "create-symlinks":
        create_symlinks(root, args.link)
    elif args.hook == "update-ldcache":
        update_ldcache(root, args.folder, args.ldconfig_path)
    elif args.hook == "enable-cuda-compat":
        enable_cuda_compat(root, args.host_driver_version, args.cuda_compat_container_root)
    elif args.hook == "disable-device-node-modification":
        disable_device_node_modification(root)
    elif args.hook == "chmod":
        chmod(root, args.path, args.mode)


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    # As `nvidia-ctk hook <name>`: the same hooks one word further.
    if os.path.basename(sys.argv[0]) == "nvidia-ctk" and words[:1] == ["hook"]:  # noqa: PTH119
        words = words[1:]
    name = next((w for w in words if not w.startswith("-")), None)
    if name not in HOOKS:
        # NVIDIA's rule: a hook this version does not know is not a reason to fail a start.
        print(f"nvidia-cdi-hook: warning: unsupported CDI hook: {name or '(none)'}",
              file=sys.stderr)
        return 0
    try:
        run(words)
    except HookError as err:
        print(f"nvidia-cdi-hook {name}: error: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"nvidia-cdi-hook {name}: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The CDI hooks a CUDA container needs beyond bind mounts, as NVIDIA's CDI generation
writes them: ``create-symlinks`` for the ``.so`` development links and ``update-ldcache`` so
the image's loader finds libraries mounted into a directory its config does not list.

They run on the host, by the container runtime, as ``nvidia-cdi-hook`` (or the older
``nvidia-ctk hook``) from the NVIDIA Container Toolkit; without it on the host there are no
hooks, and the driver says so once per discovery.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpudra.driver.cdi import Hook
from gpudra.driver.host_tree import HostTree

# The GPU Operator's toolkit directory first, then the usual binary directories.
HOOK_DIRS = ("usr/local/nvidia/toolkit", "usr/bin", "usr/local/bin", "usr/sbin", "bin", "sbin")
# Binary → the argv words before a hook's name.
HOOK_BINARIES: Mapping[str, tuple[str, ...]] = {
    "nvidia-cdi-hook": ("nvidia-cdi-hook",),
    "nvidia-ctk": ("nvidia-ctk", "hook"),
}
# Soname → the development link NVIDIA's CDI creates next to it (``dlopen("libcuda.so")``).
DEV_LINKS: Mapping[str, str] = {
    "libcuda.so.1": "libcuda.so",
    "libnvidia-opticalflow.so.1": "libnvidia-opticalflow.so",
}


@dataclass(frozen=True)
class HookBinary:
    host_path: str
    argv: tuple[str, ...]

    def hook(self, name: str, *args: str) -> Hook:
        return Hook("createContainer", self.host_path, (*self.argv, name, *args))


def given_hook_binary(host_path: str) -> HookBinary:
    """A hook binary named by the operator (its host path, e.g. the GPU Operator's
    ``/usr/local/nvidia/toolkit/nvidia-cdi-hook``, outside any root this process sees)."""
    argv = HOOK_BINARIES.get(posixpath.basename(host_path), HOOK_BINARIES["nvidia-cdi-hook"])
    return HookBinary(host_path, argv)


def find_hook_binary(tree: HostTree) -> HookBinary | None:
    """The toolkit's hook binary in ``tree``, preferring ``nvidia-cdi-hook``."""
    for name, argv in HOOK_BINARIES.items():
        found = tree.find(HOOK_DIRS, name)
        if found:
            return HookBinary(tree.host_path(found[0][1]), argv)
    return None


def missing_hook_message(tree: HostTree) -> str:
    return (
        f"no nvidia-cdi-hook or nvidia-ctk under {tree.host} (searched "
        f"{', '.join(HOOK_DIRS)}): CDI specs get no create-symlinks/update-ldcache hooks, so "
        "an image whose loader config does not list the mounted library directory will not "
        "find libcuda.so.1; install the NVIDIA Container Toolkit on the host or name its "
        "nvidia-cdi-hook with --cdi-hook-path"
    )


def library_hooks(binary: HookBinary, library_paths: Sequence[str]) -> list[Hook]:
    """Development links for the mounted sonames that have one, then the ldcache update
    for every directory libraries were mounted into."""
    hooks = []
    links = [
        f"{posixpath.basename(path)}::{posixpath.join(posixpath.dirname(path), link)}"
        for path in library_paths
        if (link := DEV_LINKS.get(posixpath.basename(path))) is not None
    ]
    if links:
        hooks.append(binary.hook("create-symlinks", *(w for x in links for w in ("--link", x))))
    folders = sorted({posixpath.dirname(path) for path in library_paths})
    if folders:
        hooks.append(binary.hook("update-ldcache",
                                 *(w for f in folders for w in ("--folder", f))))
    return hooks

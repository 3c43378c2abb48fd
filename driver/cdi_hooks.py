"""The program CDI specs name for their hooks, and how they call it.

The container runtime runs the hooks on the host: ``nvidia-cdi-hook`` (or the older
``nvidia-ctk hook``), from the NVIDIA Container Toolkit or the copy of our own
(:mod:`gpudra.driver.cdi_hook_cli`) the chart puts on the host. Which hooks a spec gets is
:mod:`gpudra.driver.cdi_edits`'s business; without a hook binary there are none, and the
driver says so once per discovery.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
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
        f"{', '.join(HOOK_DIRS)}): CDI specs get no hooks (no .so links, ldcache update, "
        "CUDA forward compatibility or device node protection), so an image whose loader "
        "config does not list the mounted library directory will not find every library; "
        "name a hook with --cdi-hook-path (the chart copies its own unless cdiHookPath is set)"
    )

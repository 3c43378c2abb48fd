"""IMEX channel device nodes in a simulated device root, as the NVIDIA kernel module offers them.

The module registers the ``nvidia-caps-imex-channels`` character device (its major in
``/proc/devices``); channel ``N`` is ``/dev/nvidia-caps-imex-channels/channelN`` with minor
``N``. Regular files stand in for the nodes, as for every other simulated device node.
"""

from __future__ import annotations

from pathlib import Path

IMEX_CHANNELS_MAJOR = 234
"""Dynamic on a real host; any free number does for the simulated ``/proc/devices``."""
CHANNEL_DIR = "dev/nvidia-caps-imex-channels"
DEVICE_NAME = "nvidia-caps-imex-channels"


def channel_path(root: Path, channel: int) -> Path:
    return root / CHANNEL_DIR / f"channel{channel}"


def populate_imex_channels(root: Path, count: int) -> Path:
    """Channels ``0 .. count-1`` under device root ``root`` and the major in ``proc/devices``
    (appended once); returns the channel directory."""
    if count < 0:
        raise ValueError(f"channel count {count} < 0")
    channels = root / CHANNEL_DIR
    channels.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        channel_path(root, n).touch()
    devices = root / "proc" / "devices"
    devices.parent.mkdir(parents=True, exist_ok=True)
    text = devices.read_text() if devices.exists() else "Character devices:\n"
    if f" {DEVICE_NAME}\n" not in text:
        devices.write_text(text + f"{IMEX_CHANNELS_MAJOR} {DEVICE_NAME}\n")
    return channels

"""The installed distribution's version, for ``gpudra --version`` and start-up logs."""

from __future__ import annotations

from importlib import metadata


def version() -> str:
    try:
        return metadata.version("gpudra")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"

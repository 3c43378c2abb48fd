"""The cluster face: ResourceSlice building, validation and publishing; CEL tooling.

May import ``gpudra.api`` and ``gpudra.driver``.
"""

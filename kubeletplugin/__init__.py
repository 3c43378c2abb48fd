"""The node daemon's gRPC face: registration, DRA services, claim decoding, prepare/unprepare.

May import ``gpudra.api`` and ``gpudra.driver``.
"""

"""What users and the kubelet speak: opaque config types, quantities, kubelet gRPC protos.

This layer imports nothing else of gpudra; every other layer may import it.
"""

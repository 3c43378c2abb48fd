"""The device layer: NVML access (real and simulated), inventory, MIG math, CDI, checkpoint.

No Kubernetes client and no gRPC here. May import ``gpudra.api`` only.
"""

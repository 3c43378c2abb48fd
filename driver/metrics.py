"""Prometheus metrics of the node daemon, defined once for every layer to record into.

Names carry the ``gpudra_`` prefix. Latencies are histograms with buckets from 0.5 ms to
30 s because a prepare is milliseconds on a warm node and seconds when MIG mode toggles.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                   10, 30)

PREPARE_SECONDS = Histogram(
    "gpudra_prepare_seconds", "NodePrepareResources time per claim", buckets=LATENCY_BUCKETS)
UNPREPARE_SECONDS = Histogram(
    "gpudra_unprepare_seconds", "NodeUnprepareResources time per claim", buckets=LATENCY_BUCKETS)
PREPARE_ERRORS = Counter(
    "gpudra_prepare_errors", "Claims whose prepare failed, by reason", ["reason"])
UNPREPARE_ERRORS = Counter(
    "gpudra_unprepare_errors", "Claims whose unprepare failed, by reason", ["reason"])
PREPARED_CLAIMS = Gauge("gpudra_prepared_claims", "Claims prepared on this node")
MIG_OPERATIONS = Counter(
    "gpudra_mig_operations", "MIG devices created or destroyed", ["operation", "outcome"])
MIG_OPERATION_SECONDS = Histogram(
    "gpudra_mig_operation_seconds", "Time to create or destroy a MIG device", ["operation"],
    buckets=LATENCY_BUCKETS)
CHECKPOINT_WRITE_SECONDS = Histogram(
    "gpudra_checkpoint_write_seconds", "Time to write the checkpoint durably",
    buckets=LATENCY_BUCKETS)
PUBLISHED_DEVICES = Gauge("gpudra_published_devices", "Devices in the published pool")
PUBLISHED_SLICES = Gauge("gpudra_published_slices", "ResourceSlices in the published pool")
XID_EVENTS = Counter("gpudra_xid_events", "XID events seen, by GPU and XID", ["gpu", "xid"])
DEVICE_TAINTS = Gauge("gpudra_device_taints", "Taints currently on published devices",
                      ["effect"])
GPU_RECOVERY_REQUIRED = Gauge(
    "gpudra_gpu_recovery_required",
    "1 while a GPU waits for the recovery its driver or NVIDIA's XID catalog calls for "
    "(gpu-reset, node-reboot, ...): it stays tainted until the driver reports it healthy",
    ["gpu", "action"])
HELD_UNKNOWN = Gauge(
    "gpudra_held_unknown_devices",
    "Hardware held for claims the node cannot name (a checkpoint it could not read): "
    "tainted, never destroyed; see README, Operations")


def error_reason(message: str) -> str:
    """A small, bounded label for an error message (never the message itself)."""
    lowered = message.lower()
    for needle, reason in (
        ("not found in the api server", "claim_not_found"),
        ("replaced", "claim_replaced"),
        ("not allocated", "not_allocated"),
        ("opaque config", "invalid_config"),
        ("not in this node's inventory", "unknown_device"),
        ("already prepared", "device_in_use"),
        ("overlaps", "device_in_use"),
        ("placement", "mig_placement"),
        ("api server", "api_error"),
        ("cdi", "cdi"),
        ("nvml", "nvml"),
    ):
        if needle in lowered:
            return reason
    return "other"

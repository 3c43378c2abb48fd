"""What a node publishes for the ``compute-domain.nvidia.com`` driver: IMEX channels and
IMEX daemon slots, placed in their NVLink clique.

- ``channel-0 … channel-<N-1>``: one IMEX channel each (``id`` = the channel number). A
  channel claim is usable only once this node's IMEX daemon for the claim's domain is up,
  so every channel carries the binding condition ``ComputeDomainReady`` (and the failure
  condition ``ComputeDomainFailed``): the scheduler waits for the controller to set it
  instead of the kubelet retrying a prepare that cannot succeed yet. Several domains on one
  node take different channels.
- ``daemon-0 … daemon-<M-1>``: one slot per IMEX daemon (one daemon per domain per node).

Every device has ``cliqueID`` (``<fabric cluster UUID>.<clique id>``) and
``fabricClusterUUID``, so ``matchAttribute`` keeps a domain inside one NVLink clique. A
node whose fabric is not usable (no multi-node NVLink, or the fabric manager has not
registered its GPUs) publishes an empty pool: nothing there could join a domain.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpudra.api.compute_domain import (
    ATTRIBUTE_CLIQUE_ID,
    ATTRIBUTE_FABRIC_CLUSTER_UUID,
    ATTRIBUTE_ID,
    ATTRIBUTE_TYPE,
    CONDITION_FAILED,
    CONDITION_READY,
    DEVICE_TYPE_CHANNEL,
    DEVICE_TYPE_DAEMON,
)
from gpudra.driver.compute_domain_imex import MAX_CHANNELS
from gpudra.driver.devices import AttributeValue, Device, NodeDevices
from gpudra.driver.nvml import FabricInfo

DEFAULT_CHANNELS = 8
DEFAULT_DAEMONS = 8
GROUP = "imex"


class FabricProblem(ValueError):
    """The GPUs of this node disagree about their fabric, or it is not usable."""


def node_clique(fabrics: Sequence[FabricInfo | None]) -> FabricInfo | None:
    """The node's fabric: None when no GPU has one; FabricProblem when the GPUs are not
    ready or do not agree (one tray is one clique)."""
    known = [f for f in fabrics if f is not None]
    if not known:
        return None
    not_ready = [f for f in known if not f.ready]
    if not_ready:
        raise FabricProblem(f"the NVLink fabric is not ready (state {not_ready[0].state}, "
                            f"status {not_ready[0].status})")
    cliques = {(f.cluster_uuid, f.clique_id) for f in known}
    if len(cliques) > 1 or len(known) != len(fabrics):
        raise FabricProblem(f"the GPUs of this node are in different cliques: {sorted(cliques)}")
    return known[0]


def clique_id(fabric: FabricInfo) -> str:
    return f"{fabric.cluster_uuid}.{fabric.clique_id}"


def channel_name(channel: int) -> str:
    return f"channel-{channel}"


def daemon_name(slot: int) -> str:
    return f"daemon-{slot}"


def parse_device(name: str) -> tuple[str, int] | None:
    """(type, id) of one of our device names; None for anything else."""
    kind, sep, number = name.partition("-")
    if not sep or kind not in (DEVICE_TYPE_CHANNEL, DEVICE_TYPE_DAEMON) or not number.isdigit():
        return None
    if number != str(int(number)) or int(number) >= MAX_CHANNELS:
        return None
    return kind, int(number)


def build_devices(fabric: FabricInfo | None, *, channels: int = DEFAULT_CHANNELS,
                  daemons: int = DEFAULT_DAEMONS) -> NodeDevices:
    if not 0 < channels <= MAX_CHANNELS or not 0 < daemons <= MAX_CHANNELS:
        raise ValueError(f"channels and daemons must be in 1..{MAX_CHANNELS}")
    if fabric is None:
        return NodeDevices(devices=())

    def attributes(kind: str, number: int) -> dict[str, AttributeValue]:
        return {ATTRIBUTE_TYPE: kind, ATTRIBUTE_ID: number,
                ATTRIBUTE_CLIQUE_ID: clique_id(fabric),
                ATTRIBUTE_FABRIC_CLUSTER_UUID: fabric.cluster_uuid}

    found = [Device(name=channel_name(n), group=GROUP,
                    attributes=attributes(DEVICE_TYPE_CHANNEL, n), capacity={},
                    binding_conditions=(CONDITION_READY,),
                    binding_failure_conditions=(CONDITION_FAILED,), binds_to_node=True)
             for n in range(channels)]
    found += [Device(name=daemon_name(n), group=GROUP,
                     attributes=attributes(DEVICE_TYPE_DAEMON, n), capacity={})
              for n in range(daemons)]
    return NodeDevices(devices=tuple(found), groups=(GROUP,))

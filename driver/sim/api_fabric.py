"""NVML's multi-node NVLink fabric calls: which NVLink cluster and clique a GPU belongs to.

``nvmlDeviceGetGpuFabricInfo`` (the v1 struct, no version field) and
``nvmlDeviceGetGpuFabricInfoV`` (versioned: v2 adds ``healthMask``, v3 ``healthSummary``)
answer from the node profile's ``fabric:`` section; a node without one answers
NOT_SUPPORTED, as a GPU outside a GB200-class rack does. One node's fabric can be changed
at run time (the fabric manager has not finished, the tray moved to another partition) with
:func:`set_fabric`, which keeps the change in the node's state directory, so every process
using that directory sees it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from .cabi import struct_version, target
from .codes import NvmlFailure, Return
from .core import LibraryCore, symbol
from .profiles import FABRIC_STATES, Fabric

FABRIC_FILE = "fabric.json"
"""In a node's state directory: fields that replace its profile's fabric."""
_HEALTH_SUMMARY_HEALTHY = 1  # NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
_NOT_SUPPORTED_MASK = 0  # every NVML_GPU_FABRIC_HEALTH_MASK_* field NOT_SUPPORTED


def set_fabric(state_dir: Path, **changes: Any) -> None:
    """Change what the node in ``state_dir`` reports: ``state`` (a ``FABRIC_STATES`` name),
    ``clique_id``, ``cluster_uuid``, ``status`` (a return code name such as ``SUCCESS``).
    Values are checked; the change is one atomic file replace."""
    allowed = {"state", "clique_id", "cluster_uuid", "status"}
    unknown = set(changes) - allowed
    if unknown:
        raise ValueError(f"unknown fabric fields {sorted(unknown)}; known: {sorted(allowed)}")
    path = Path(state_dir) / FABRIC_FILE
    current: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    current.update(changes)
    _checked(current)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(current))
    tmp.replace(path)


def _checked(fields: dict[str, Any]) -> dict[str, Any]:
    if "state" in fields and fields["state"] not in FABRIC_STATES:
        raise ValueError(f"fabric state {fields['state']!r}; known: {sorted(FABRIC_STATES)}")
    if "status" in fields and fields["status"] not in Return.__members__:
        raise ValueError(f"fabric status {fields['status']!r} is not an NVML return code name")
    if "cluster_uuid" in fields:
        fields["cluster_uuid"] = str(uuid.UUID(str(fields["cluster_uuid"])))
    if "clique_id" in fields and not (isinstance(fields["clique_id"], int)
                                      and 0 <= fields["clique_id"] < 2**32):
        raise ValueError(f"clique_id {fields['clique_id']!r} is not a uint32")
    return fields


class FabricApi(LibraryCore):
    def _fabric(self) -> Fabric:
        fabric = self.node.fabric
        if fabric is None:
            raise NvmlFailure(Return.ERROR_NOT_SUPPORTED)
        path = self.store.dir / FABRIC_FILE
        try:
            override = json.loads(path.read_text())
        except FileNotFoundError:
            return fabric
        except (OSError, ValueError):
            raise NvmlFailure(Return.ERROR_UNKNOWN) from None
        return Fabric(**{**asdict(fabric), **_checked(override)})

    def _fill(self, device: object, info: Any) -> None:
        self.full_gpu(device)  # a lost GPU answers GPU_IS_LOST; a MIG handle is refused
        fabric = self._fabric()
        if fabric.state != "COMPLETED":
            # Cluster and clique are only meaningful once the fabric manager registered the GPU.
            fabric = replace(fabric, cluster_uuid=str(uuid.UUID(int=0)), clique_id=0)
        info.clusterUuid[:] = list(uuid.UUID(fabric.cluster_uuid).bytes)
        info.status = int(Return[fabric.status]) if fabric.state == "COMPLETED" else int(
            Return.ERROR_NOT_READY)
        info.cliqueId = fabric.clique_id
        info.state = FABRIC_STATES[fabric.state]

    @symbol
    def nvmlDeviceGetGpuFabricInfo(self, device: object, info: object) -> None:
        """The v1 struct (``clusterUuid, status, cliqueId, state``), deprecated by NVML."""
        self._fill(device, target(info))

    @symbol
    def nvmlDeviceGetGpuFabricInfoV(self, device: object, info: object) -> None:
        """``nvmlGpuFabricInfo_v2_t`` or ``_v3_t`` as the struct's version field says."""
        out = target(info)
        version = struct_version(out)
        if version not in (2, 3):
            raise NvmlFailure(Return.ERROR_ARGUMENT_VERSION_MISMATCH)
        self._fill(device, out)
        out.healthMask = _NOT_SUPPORTED_MASK
        if version == 3:
            out.healthSummary = _HEALTH_SUMMARY_HEALTHY

"""The kubelet gRPC APIs gpudra speaks: wire names and the generated protobuf/gRPC modules.

Our own ``.proto`` files live in ``api/proto/src``; the stubs generated from them are
committed in ``api/proto/gen`` (regenerate with ``python -m gpudra.api.proto.generate``).
Use the aliases below rather than the generated paths::

    from gpudra.api.proto import dra_v1_pb2, dra_v1_pb2_grpc

The aliases are imported on first access, so reading the constants (or running the
generator when the committed stubs are broken) never loads protobuf or grpc.

Two kinds of names exist for each service and are easy to mix up:

- the **wire service name** (proto package + service), which is in every method path, e.g.
  ``/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources``;
- the **registration string** the plugin lists in ``PluginInfo.supported_versions``, e.g.
  ``"v1.DRAPlugin"``. For the DRA services it differs from the wire name; for the health
  services the two are the same.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from .gen.dra.v1 import dra_pb2 as dra_v1_pb2
    from .gen.dra.v1 import dra_pb2_grpc as dra_v1_pb2_grpc
    from .gen.dra.v1beta1 import dra_pb2 as dra_v1beta1_pb2
    from .gen.dra.v1beta1 import dra_pb2_grpc as dra_v1beta1_pb2_grpc
    from .gen.health.v1 import health_pb2 as health_v1_pb2
    from .gen.health.v1 import health_pb2_grpc as health_v1_pb2_grpc
    from .gen.health.v1alpha1 import health_pb2 as health_v1alpha1_pb2
    from .gen.health.v1alpha1 import health_pb2_grpc as health_v1alpha1_pb2_grpc
    from .gen.pluginregistration.v1 import registration_pb2, registration_pb2_grpc

# --- wire service names (proto package + service; the first part of every method path) ---
DRA_V1_SERVICE: Final = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
DRA_V1BETA1_SERVICE: Final = "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
REGISTRATION_SERVICE: Final = "pluginregistration.Registration"
HEALTH_V1ALPHA1_SERVICE: Final = "v1alpha1.DRAResourceHealth"
HEALTH_V1_SERVICE: Final = "v1.DRAResourceHealth"

# --- registration: PluginInfo.type and the supported_versions strings ---
DRA_PLUGIN_TYPE: Final = "DRAPlugin"
DRA_V1_ADVERTISED: Final = "v1.DRAPlugin"
DRA_V1BETA1_ADVERTISED: Final = "v1beta1.DRAPlugin"
HEALTH_V1ALPHA1_ADVERTISED: Final = "v1alpha1.DRAResourceHealth"
HEALTH_V1_ADVERTISED: Final = "v1.DRAResourceHealth"
# The kubelet takes the first entry of supported_versions it knows: v1 first, v1beta1 second.
DRA_ADVERTISED_PREFERRED: Final = (DRA_V1_ADVERTISED, DRA_V1BETA1_ADVERTISED)

# Registration string -> wire service name, for every service gpudra can serve.
WIRE_SERVICE_BY_ADVERTISED: Final = {
    DRA_V1_ADVERTISED: DRA_V1_SERVICE,
    DRA_V1BETA1_ADVERTISED: DRA_V1BETA1_SERVICE,
    HEALTH_V1ALPHA1_ADVERTISED: HEALTH_V1ALPHA1_SERVICE,
    HEALTH_V1_ADVERTISED: HEALTH_V1_SERVICE,
}

_MODULES: Final = {
    "dra_v1_pb2": ".gen.dra.v1.dra_pb2",
    "dra_v1_pb2_grpc": ".gen.dra.v1.dra_pb2_grpc",
    "dra_v1beta1_pb2": ".gen.dra.v1beta1.dra_pb2",
    "dra_v1beta1_pb2_grpc": ".gen.dra.v1beta1.dra_pb2_grpc",
    "registration_pb2": ".gen.pluginregistration.v1.registration_pb2",
    "registration_pb2_grpc": ".gen.pluginregistration.v1.registration_pb2_grpc",
    "health_v1alpha1_pb2": ".gen.health.v1alpha1.health_pb2",
    "health_v1alpha1_pb2_grpc": ".gen.health.v1alpha1.health_pb2_grpc",
    "health_v1_pb2": ".gen.health.v1.health_pb2",
    "health_v1_pb2_grpc": ".gen.health.v1.health_pb2_grpc",
}

__all__ = [
    "DRA_ADVERTISED_PREFERRED",
    "DRA_PLUGIN_TYPE",
    "DRA_V1BETA1_ADVERTISED",
    "DRA_V1BETA1_SERVICE",
    "DRA_V1_ADVERTISED",
    "DRA_V1_SERVICE",
    "HEALTH_V1ALPHA1_ADVERTISED",
    "HEALTH_V1ALPHA1_SERVICE",
    "HEALTH_V1_ADVERTISED",
    "HEALTH_V1_SERVICE",
    "REGISTRATION_SERVICE",
    "WIRE_SERVICE_BY_ADVERTISED",
    "dra_v1_pb2",
    "dra_v1_pb2_grpc",
    "dra_v1beta1_pb2",
    "dra_v1beta1_pb2_grpc",
    "health_v1_pb2",
    "health_v1_pb2_grpc",
    "health_v1alpha1_pb2",
    "health_v1alpha1_pb2_grpc",
    "registration_pb2",
    "registration_pb2_grpc",
]


def __getattr__(name: str) -> ModuleType:
    """Import a generated module the first time its alias is used (PEP 562)."""
    try:
        target = _MODULES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    module = importlib.import_module(target, __name__)
    globals()[name] = module
    return module


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULES))

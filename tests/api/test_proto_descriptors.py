"""Wire names and field numbers of the kubelet APIs, read back from the generated descriptors.

Everything pinned here is on the wire: a changed package, service, method name or field number
breaks the kubelet silently, so the tables are written out in full rather than derived.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

import gpudra.api.proto as proto
from gpudra.api.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)

# (pb2 module, pb2_grpc module, proto package, service) for every file
FILES = {
    "dra.v1": (dra_v1_pb2, dra_v1_pb2_grpc, "k8s.io.kubelet.pkg.apis.dra.v1", "DRAPlugin"),
    "dra.v1beta1": (
        dra_v1beta1_pb2,
        dra_v1beta1_pb2_grpc,
        "k8s.io.kubelet.pkg.apis.dra.v1beta1",
        "DRAPlugin",
    ),
    "registration": (
        registration_pb2,
        registration_pb2_grpc,
        "pluginregistration",
        "Registration",
    ),
    "health.v1alpha1": (
        health_v1alpha1_pb2,
        health_v1alpha1_pb2_grpc,
        "v1alpha1",
        "DRAResourceHealth",
    ),
    "health.v1": (health_v1_pb2, health_v1_pb2_grpc, "v1", "DRAResourceHealth"),
}

# Wire method paths: (path, client streams, server streams)
METHOD_PATHS = {
    "dra.v1": [
        ("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources", False, False),
        ("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources", False, False),
    ],
    "dra.v1beta1": [
        ("/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources", False, False),
        ("/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources", False, False),
    ],
    "registration": [
        ("/pluginregistration.Registration/GetInfo", False, False),
        ("/pluginregistration.Registration/NotifyRegistrationStatus", False, False),
    ],
    "health.v1alpha1": [("/v1alpha1.DRAResourceHealth/NodeWatchResources", False, True)],
    "health.v1": [("/v1.DRAResourceHealth/NodeWatchResources", False, True)],
}

_DRA_COMMON: dict[str, dict[str, tuple[int, str]]] = {
    "NodePrepareResourcesRequest": {"claims": (1, "repeated Claim")},
    "NodePrepareResourcesResponse": {
        "claims": (1, "map<string, NodePrepareResourceResponse>"),
    },
    "NodePrepareResourceResponse": {
        "devices": (1, "repeated Device"),
        "error": (2, "string"),
    },
    "Device": {
        "request_names": (1, "repeated string"),
        "pool_name": (2, "string"),
        "device_name": (3, "string"),
        "cdi_device_ids": (4, "repeated string"),
    },
    "NodeUnprepareResourcesRequest": {"claims": (1, "repeated Claim")},
    "NodeUnprepareResourcesResponse": {
        "claims": (1, "map<string, NodeUnprepareResourceResponse>"),
    },
    "NodeUnprepareResourceResponse": {"error": (1, "string")},
    "Claim": {"namespace": (1, "string"), "uid": (2, "string"), "name": (3, "string")},
}

_HEALTH: dict[str, dict[str, tuple[int, str]]] = {
    "NodeWatchResourcesRequest": {},
    "NodeWatchResourcesResponse": {"devices": (1, "repeated DeviceHealth")},
    "DeviceIdentifier": {"pool_name": (1, "string"), "device_name": (2, "string")},
    "DeviceHealth": {
        "device": (1, "DeviceIdentifier"),
        "health": (2, "HealthStatus"),
        "last_updated_time": (3, "int64"),
        "health_check_timeout_seconds": (4, "int64"),
        "message": (5, "string"),
    },
}

# message -> field -> (number, type as it would be written in the .proto)
FIELDS: dict[str, dict[str, dict[str, tuple[int, str]]]] = {
    "dra.v1": {
        **_DRA_COMMON,
        "Device": {**_DRA_COMMON["Device"], "share_id": (5, "optional string")},
    },
    "dra.v1beta1": _DRA_COMMON,
    "registration": {
        "InfoRequest": {},
        "PluginInfo": {
            "type": (1, "string"),
            "name": (2, "string"),
            "endpoint": (3, "string"),
            "supported_versions": (4, "repeated string"),
        },
        "RegistrationStatus": {"plugin_registered": (1, "bool"), "error": (2, "string")},
        "RegistrationStatusResponse": {},
    },
    "health.v1alpha1": _HEALTH,
    "health.v1": _HEALTH,
}

_SCALARS = {
    9: "string",  # TYPE_STRING
    8: "bool",  # TYPE_BOOL
    3: "int64",  # TYPE_INT64
}


def _type_name(field: Any, package: str) -> str:
    if field.message_type is not None:
        return str(field.message_type.full_name).removeprefix(package + ".")
    if field.enum_type is not None:
        return str(field.enum_type.full_name).removeprefix(package + ".")
    return _SCALARS[field.type]


def _describe(field: Any, package: str) -> str:
    """A field's type as written in proto3 source: repeated/map/optional prefix included."""
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key = field.message_type.fields_by_name["key"]
        value = field.message_type.fields_by_name["value"]
        return f"map<{_type_name(key, package)}, {_type_name(value, package)}>"
    if field.is_repeated:
        return f"repeated {_type_name(field, package)}"
    # proto3 `optional` scalars live in a synthetic one-field oneof
    if field.containing_oneof is not None and field.message_type is None:
        return f"optional {_type_name(field, package)}"
    return _type_name(field, package)


@pytest.mark.parametrize("key", sorted(FILES))
def test_package_and_unique_file_name(key: str) -> None:
    pb2, _, package, _ = FILES[key]
    assert pb2.DESCRIPTOR.package == package
    assert pb2.DESCRIPTOR.name.startswith("gpudra/api/proto/gen/")


def test_descriptor_file_names_are_unique() -> None:
    names = [pb2.DESCRIPTOR.name for pb2, *_ in FILES.values()]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("key", sorted(FILES))
def test_method_paths_from_descriptors(key: str) -> None:
    pb2, _, package, service_name = FILES[key]
    assert list(pb2.DESCRIPTOR.services_by_name) == [service_name]
    service = pb2.DESCRIPTOR.services_by_name[service_name]
    assert service.full_name == f"{package}.{service_name}"
    paths = [
        (f"/{service.full_name}/{m.name}", m.client_streaming, m.server_streaming)
        for m in service.methods
    ]
    assert paths == METHOD_PATHS[key]


class _RecordingChannel:
    """Collects the method paths a generated client stub binds to."""

    def __init__(self) -> None:
        self.paths: list[tuple[str, str]] = []

    def _bind(self, kind: str) -> Any:
        def bind(path: str, **_: object) -> object:
            self.paths.append((kind, path))
            return object()

        return bind

    def __getattr__(self, kind: str) -> Any:
        if kind in {"unary_unary", "unary_stream", "stream_unary", "stream_stream"}:
            return self._bind(kind)
        raise AttributeError(kind)


@pytest.mark.parametrize("key", sorted(FILES))
def test_generated_client_stub_uses_the_wire_paths(key: str) -> None:
    _, pb2_grpc, _, service_name = FILES[key]
    channel = _RecordingChannel()
    getattr(pb2_grpc, f"{service_name}Stub")(channel)
    expected = [
        ("unary_stream" if server_streams else "unary_unary", path)
        for path, _client_streams, server_streams in METHOD_PATHS[key]
    ]
    assert channel.paths == expected


@pytest.mark.parametrize("key", sorted(FILES))
def test_field_numbers_and_types(key: str) -> None:
    pb2, _, package, _ = FILES[key]
    actual = {
        name: {f.name: (f.number, _describe(f, package)) for f in message.fields}
        for name, message in pb2.DESCRIPTOR.message_types_by_name.items()
    }
    assert actual == FIELDS[key]


def test_share_id_is_v1_only_and_tracks_presence() -> None:
    v1 = dra_v1_pb2.Device.DESCRIPTOR.fields_by_name["share_id"]
    assert (v1.number, v1.has_presence) == (5, True)
    assert 5 not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_number
    device = dra_v1_pb2.Device(pool_name="node-a", device_name="gpu-0")
    assert not device.HasField("share_id")
    device.share_id = ""
    assert device.HasField("share_id")


@pytest.mark.parametrize("pb2", [health_v1alpha1_pb2, health_v1_pb2], ids=["v1alpha1", "v1"])
def test_health_status_enum(pb2: ModuleType) -> None:
    enum = pb2.DESCRIPTOR.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in enum.values} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


def test_exported_wire_names_match_the_descriptors() -> None:
    def service(pb2: ModuleType, name: str) -> str:
        return str(pb2.DESCRIPTOR.services_by_name[name].full_name)

    assert service(dra_v1_pb2, "DRAPlugin") == proto.DRA_V1_SERVICE
    assert service(dra_v1beta1_pb2, "DRAPlugin") == proto.DRA_V1BETA1_SERVICE
    assert service(registration_pb2, "Registration") == proto.REGISTRATION_SERVICE
    assert service(health_v1alpha1_pb2, "DRAResourceHealth") == proto.HEALTH_V1ALPHA1_SERVICE
    assert service(health_v1_pb2, "DRAResourceHealth") == proto.HEALTH_V1_SERVICE


def test_registration_strings() -> None:
    assert proto.DRA_PLUGIN_TYPE == "DRAPlugin"
    assert proto.DRA_ADVERTISED_PREFERRED == ("v1.DRAPlugin", "v1beta1.DRAPlugin")
    assert proto.WIRE_SERVICE_BY_ADVERTISED == {
        "v1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
        "v1beta1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
        "v1alpha1.DRAResourceHealth": "v1alpha1.DRAResourceHealth",
        "v1.DRAResourceHealth": "v1.DRAResourceHealth",
    }
    assert proto.HEALTH_V1ALPHA1_ADVERTISED == "v1alpha1.DRAResourceHealth"
    assert proto.HEALTH_V1_ADVERTISED == "v1.DRAResourceHealth"


def test_aliases_are_the_generated_modules() -> None:
    assert dra_v1_pb2.__name__ == "gpudra.api.proto.gen.dra.v1.dra_pb2"
    assert registration_pb2_grpc.__name__ == (
        "gpudra.api.proto.gen.pluginregistration.v1.registration_pb2_grpc"
    )
    assert set(proto.__all__) <= set(dir(proto))
    with pytest.raises(AttributeError, match="no attribute 'dra_v1alpha3_pb2'"):
        _ = proto.dra_v1alpha3_pb2

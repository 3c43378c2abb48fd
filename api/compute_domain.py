"""The ComputeDomain custom resource and the names both ComputeDomain sides agree on.

Compatible with NVIDIA's ``resource.nvidia.com/v1beta1`` ComputeDomain: the same group,
version, kind, spec and status fields, so a manifest written for NVIDIA's driver means the
same here. The controller (``gpudra controller``) and the node side (the
``compute-domain.nvidia.com`` kubelet plugin and ``gpudra compute-domain-daemon``) import
their names from here so the two cannot drift.

Decoding is strict where the user writes (spec: unknown fields, wrong types and unknown
enum values are errors naming the field) and lenient where servers write (metadata, and a
status written by a newer version may carry fields this one does not know).
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)
from pydantic.alias_generators import to_camel

from gpudra.api.identifiers import IdentifierError, check_name, check_uid

GROUP: Final = "resource.nvidia.com"
VERSION: Final = "v1beta1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "ComputeDomain"
PLURAL: Final = "computedomains"
SINGULAR: Final = "computedomain"

DRIVER_NAME: Final = "compute-domain.nvidia.com"
"""The node-side DRA driver that publishes IMEX channel and daemon devices."""
CHANNEL_DEVICE_CLASS: Final = "compute-domain-default-channel.nvidia.com"
DAEMON_DEVICE_CLASS: Final = "compute-domain-daemon.nvidia.com"

DEVICE_TYPE_CHANNEL: Final = "channel"
DEVICE_TYPE_DAEMON: Final = "daemon"
ATTRIBUTE_TYPE: Final = "type"
ATTRIBUTE_ID: Final = "id"
ATTRIBUTE_CLIQUE_ID: Final = "cliqueID"
ATTRIBUTE_FABRIC_CLUSTER_UUID: Final = "fabricClusterUUID"

CHANNEL_CONFIG_KIND: Final = "ComputeDomainChannelConfig"
DAEMON_CONFIG_KIND: Final = "ComputeDomainDaemonConfig"

CONDITION_READY: Final = "ComputeDomainReady"
"""Binding condition (KEP-5007) the controller sets True on an allocated channel device
once this node's IMEX daemon for the domain is Ready."""
CONDITION_FAILED: Final = "ComputeDomainFailed"
"""Binding failure condition set True, with a message, when the daemon cannot get Ready."""

LABEL_DOMAIN: Final = "resource.nvidia.com/computeDomain"
"""On every object the controller makes for a domain: the domain's uid."""
LABEL_NODE: Final = "gpudra.io/node"
"""On a daemon pod: the node it is pinned to."""

STATUS_READY: Final = "Ready"
STATUS_NOT_READY: Final = "NotReady"

AllocationMode = Literal["Single", "All"]
NodeStatus = Literal["Ready", "NotReady"]

NODE_ENTRIES_MAX: Final = 4096
"""Bound on ``status.nodes``: far above an NVL72 rack's 18 nodes times a few racks; a
longer list is an error, not memory the controller spends."""


class ComputeDomainError(ValueError):
    """A ComputeDomain (or a config) is invalid; ``problems`` are ``field: message``."""

    def __init__(self, what: str, problems: list[str]) -> None:
        super().__init__(f"{what} is invalid: " + "; ".join(problems))
        self.problems = problems


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True,
                              frozen=True)


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", alias_generator=to_camel, populate_by_name=True,
                              frozen=True)


class TemplateRef(_Strict):
    name: StrictStr

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "name")


class Channel(_Strict):
    resource_claim_template: TemplateRef
    allocation_mode: AllocationMode = "Single"


class ComputeDomainSpec(_Strict):
    num_nodes: StrictInt = Field(default=0, ge=0, le=NODE_ENTRIES_MAX)
    channel: Channel


class NodeEntry(_Lenient):
    """One node of the domain, written by that node's IMEX daemon (its own entry only)."""

    name: StrictStr
    ip_address: StrictStr = ""
    clique_id: StrictStr = Field(default="", alias="cliqueID")
    index: StrictInt = 0
    status: NodeStatus = "NotReady"


class ComputeDomainStatus(_Lenient):
    status: NodeStatus = "NotReady"
    nodes: list[NodeEntry] = Field(default_factory=list, max_length=NODE_ENTRIES_MAX)


class ObjectMeta(_Lenient):
    name: StrictStr
    namespace: StrictStr
    uid: StrictStr
    resource_version: StrictStr = ""
    generation: StrictInt = 0
    deletion_timestamp: StrictStr | None = None
    finalizers: list[StrictStr] = Field(default_factory=list)
    labels: dict[StrictStr, StrictStr] = Field(default_factory=dict)

    @field_validator("uid")
    @classmethod
    def _uid(cls, value: str) -> str:
        return check_uid(value, "uid")


class ComputeDomain(_Lenient):
    api_version: Literal["resource.nvidia.com/v1beta1"] = "resource.nvidia.com/v1beta1"
    kind: Literal["ComputeDomain"] = "ComputeDomain"
    metadata: ObjectMeta
    spec: ComputeDomainSpec
    status: ComputeDomainStatus = Field(default_factory=ComputeDomainStatus)

    @property
    def uid(self) -> str:
        return self.metadata.uid

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"

    @property
    def deleting(self) -> bool:
        return self.metadata.deletion_timestamp is not None


class ChannelConfig(_Strict):
    """``ComputeDomainChannelConfig``: the opaque config of the channel claim template."""

    api_version: Literal["resource.nvidia.com/v1beta1"] = "resource.nvidia.com/v1beta1"
    kind: Literal["ComputeDomainChannelConfig"] = "ComputeDomainChannelConfig"
    domain_id: StrictStr = Field(alias="domainID")
    allocation_mode: AllocationMode = "Single"

    @field_validator("domain_id")
    @classmethod
    def _domain(cls, value: str) -> str:
        return check_uid(value, "domainID")


class DaemonConfig(_Strict):
    """``ComputeDomainDaemonConfig``: the opaque config of the daemon claim template."""

    api_version: Literal["resource.nvidia.com/v1beta1"] = "resource.nvidia.com/v1beta1"
    kind: Literal["ComputeDomainDaemonConfig"] = "ComputeDomainDaemonConfig"
    domain_id: StrictStr = Field(alias="domainID")

    @field_validator("domain_id")
    @classmethod
    def _domain(cls, value: str) -> str:
        return check_uid(value, "domainID")


def _problems(error: ValidationError, prefix: str) -> list[str]:
    out = []
    for item in error.errors():
        where = ".".join(str(p) for p in (prefix, *item["loc"]) if p != "")
        message = str(item["msg"])
        ctx = item.get("ctx") or {}
        if isinstance(ctx.get("error"), IdentifierError):
            message = str(ctx["error"])
        out.append(f"{where}: {message}")
    return out


def parse_compute_domain(obj: object) -> ComputeDomain:
    """A ComputeDomain from its JSON object; :class:`ComputeDomainError` names the fields."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    what = (f"ComputeDomain {meta.get('namespace')}/{meta.get('name')}"
            if isinstance(meta, dict) else "ComputeDomain")
    try:
        return ComputeDomain.model_validate(obj)
    except ValidationError as error:
        raise ComputeDomainError(what, _problems(error, "")) from None


def parse_channel_config(obj: object) -> ChannelConfig:
    try:
        return ChannelConfig.model_validate(obj)
    except ValidationError as error:
        raise ComputeDomainError(CHANNEL_CONFIG_KIND, _problems(error, "")) from None


def parse_daemon_config(obj: object) -> DaemonConfig:
    try:
        return DaemonConfig.model_validate(obj)
    except ValidationError as error:
        raise ComputeDomainError(DAEMON_CONFIG_KIND, _problems(error, "")) from None


def channel_config(domain_uid: str, mode: AllocationMode = "Single") -> dict[str, Any]:
    """The opaque parameters the channel claim template carries."""
    return parse_channel_config({"domainID": domain_uid, "allocationMode": mode}).model_dump(
        by_alias=True)


def daemon_config(domain_uid: str) -> dict[str, Any]:
    """The opaque parameters the daemon claim template carries."""
    return parse_daemon_config({"domainID": domain_uid}).model_dump(by_alias=True)


def node_entry(name: str, *, ip_address: str, clique_id: str, index: int,
               status: NodeStatus) -> dict[str, Any]:
    """One ``status.nodes`` entry as JSON, for the daemon that writes its own."""
    entry = {"name": name, "ipAddress": ip_address, "cliqueID": clique_id, "index": index,
             "status": status}
    return NodeEntry.model_validate(entry).model_dump(by_alias=True)

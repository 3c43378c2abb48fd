"""One API request, already routed, and how its body decodes (independent of HTTP)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpudra.testing.fakeapi import errors as fe
from gpudra.testing.fakeapi.resources import ResourceType

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
APPLY_PATCH_CBOR = "application/apply-patch+cbor"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Request:
    """One API request, already routed."""

    resource: ResourceType
    namespace: str | None  # None: cluster-scoped, or a list/watch across all namespaces
    name: str | None = None
    subresource: str | None = None
    query: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    content_type: str = ""
    user_agent: str = ""
    # An older resource.k8s.io version asked for (``versions``): bodies come in its shape and
    # are stored in v1's. Identity for everything else.
    to_hub: Callable[[Any], Any] = field(default=lambda obj: obj, repr=False)
    from_hub: Callable[[Any], Any] = field(default=lambda obj: obj, repr=False)

    @property
    def dry_run(self) -> bool:
        return bool(self.query.get("dryRun"))

    def flag(self, key: str) -> bool:
        return self.query.get(key, "").lower() in ("true", "1")

    def manager(self) -> str:
        """fieldManager, or the apiserver's default: the User-Agent up to its first '/'."""
        return self.query.get("fieldManager") or self.user_agent.split("/")[0] or "unknown"


def json_body(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise fe.bad_request(f"couldn't get version/kind; json parse error: {exc}") from exc


def yaml_or_json_body(body: bytes) -> Any:
    """Apply bodies are YAML; JSON is YAML, and the Python client always sends JSON."""
    try:
        return json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError):
        pass
    try:
        import yaml
    except ImportError as exc:  # pragma: no cover - PyYAML is a project dependency
        raise fe.bad_request("YAML apply bodies need PyYAML in the test environment") from exc
    try:
        return yaml.safe_load(body)
    except yaml.YAMLError as exc:
        raise fe.bad_request(f"error decoding YAML: {exc}") from exc

"""The identifiers the node daemon takes from the kubelet and the API server, checked at its
edge before any of them reaches a path, a CDI name, a process argument, a log line or a
metric label.

The kubelet passes a claim's namespace, name and UID through unchecked, and the claim
object comes from the API server: both are untrusted here (a buggy or hostile API server,
a confused kubelet). Each identifier must have the form the apiserver itself enforces, so a
value that passes is one a real cluster can produce, and none can name a path: a UID is a
lower-case RFC 4122 UUID, names follow their Kubernetes rules, every length is bounded.

Each ``check_*`` returns the value or raises :class:`IdentifierError` whose message names
the field (``where``) and shows the value through :func:`shown` (quoted, control characters
escaped, cut short), so a hostile value never reaches a log line whole.
"""

from __future__ import annotations

import re
from typing import Final

from gpudra.api.api_limits import (
    DNS1123_LABEL_MAX_LENGTH,
    DNS1123_SUBDOMAIN_MAX_LENGTH,
    DRIVER_NAME_MAX_LENGTH,
    POOL_NAME_MAX_LENGTH,
)
from gpudra.api.name_formats import dns1123_label_errors, dns1123_subdomain_errors

UUID_RE: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""What the apiserver accepts for a ``shareID`` and what it generates for ``metadata.uid``:
36 characters, lower-case hex in 8-4-4-4-12 groups."""

# The rules below as one regular expression each, for the common case (every claim a sane
# kubelet and API server send, on every call): the per-rule checks build messages, and
# cost several times more (bench/RESULTS.md, "Trust").
_LABEL: Final = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_LABEL_63: Final = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_FAST_LABEL: Final = re.compile(_LABEL_63)
_SUBDOMAIN: Final = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_POOL: Final = re.compile(rf"{_LABEL}(?:\.{_LABEL})*(?:/{_LABEL}(?:\.{_LABEL})*)*")
_REQUEST: Final = re.compile(rf"{_LABEL_63}(?:/{_LABEL_63})?")

SHOWN_MAX: Final = 80
"""Characters of an offending value an error message shows."""


class IdentifierError(ValueError):
    """An identifier does not have its Kubernetes form; the message names the field."""


def shown(value: object) -> str:
    """``value`` as an error message may show it: ``repr`` (quotes, escapes), at most
    :data:`SHOWN_MAX` characters, the full length said when it was cut."""
    if not isinstance(value, str):
        return f"of type {type(value).__name__}"
    text = repr(value[:SHOWN_MAX])
    return text if len(value) <= SHOWN_MAX else f"{text}... ({len(value)} characters)"


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise IdentifierError(f"{where} must be a string, got {type(value).__name__}")
    if not value:
        raise IdentifierError(f"{where} must not be empty")
    return value


def check_uid(value: object, where: str = "uid") -> str:
    """A ``metadata.uid`` (or a ``shareID``): a lower-case RFC 4122 UUID."""
    text = _string(value, where)
    if not UUID_RE.fullmatch(text):
        raise IdentifierError(f"{where} {shown(text)} is not a lower-case RFC 4122 UUID "
                              "(8-4-4-4-12 hex digits)")
    return text


def _rule(errors: list[str], text: str, where: str, rule: str, limit: int) -> str:
    if errors:
        raise IdentifierError(f"{where} {shown(text)} is not a valid {rule} (at most {limit} "
                              "characters; lower-case letters, digits, '-'"
                              f"{' and .' if rule == 'DNS subdomain' else ''})")
    return text


def check_label(value: object, where: str) -> str:
    """A DNS-1123 label (namespace, device, request name): at most 63 characters."""
    if isinstance(value, str) and _FAST_LABEL.fullmatch(value):
        return value
    text = _string(value, where)
    return _rule(dns1123_label_errors(text), text, where, "DNS label", DNS1123_LABEL_MAX_LENGTH)


def check_subdomain(value: object, where: str, limit: int = DNS1123_SUBDOMAIN_MAX_LENGTH) -> str:
    """A DNS-1123 subdomain (object names): at most ``limit`` characters."""
    if isinstance(value, str) and len(value) <= limit and _SUBDOMAIN.fullmatch(value):
        return value
    text = _string(value, where)
    errors = dns1123_subdomain_errors(text)
    if len(text) > limit:
        errors.append(f"longer than {limit}")
    return _rule(errors, text, where, "DNS subdomain", limit)


def check_namespace(value: object, where: str = "namespace") -> str:
    return check_label(value, where)


def check_name(value: object, where: str = "name") -> str:
    """An object's ``metadata.name`` (a ResourceClaim's): a DNS subdomain."""
    return check_subdomain(value, where)


def check_driver(value: object, where: str = "driver") -> str:
    """A DRA driver name: a DNS subdomain of at most 63 characters (the apiserver lower-
    cases it before checking; a driver name that becomes a path must be lower-case)."""
    return check_subdomain(value, where, DRIVER_NAME_MAX_LENGTH)


def check_device(value: object, where: str = "device") -> str:
    return check_label(value, where)


def check_pool(value: object, where: str = "pool") -> str:
    """A pool name: at most 253 characters, DNS subdomains separated by ``/``."""
    if isinstance(value, str) and len(value) <= POOL_NAME_MAX_LENGTH and _POOL.fullmatch(value):
        return value
    text = _string(value, where)
    if len(text) > POOL_NAME_MAX_LENGTH or any(
            dns1123_subdomain_errors(part) for part in text.split("/")):
        raise IdentifierError(f"{where} {shown(text)} is not a valid pool name (DNS subdomains "
                              f"separated by '/'; at most {POOL_NAME_MAX_LENGTH} characters)")
    return text


def check_request(value: object, where: str = "request") -> str:
    """An allocation result's request: ``req`` or ``req/subrequest``, each a DNS label."""
    if isinstance(value, str) and _REQUEST.fullmatch(value):
        return value
    text = _string(value, where)
    parts = text.split("/")
    if len(parts) > 2 or any(dns1123_label_errors(part) for part in parts):
        raise IdentifierError(f"{where} {shown(text)} is not a valid request name (a DNS label, "
                              "or two joined by '/')")
    return text


def check_share_id(value: object, where: str = "shareID") -> str:
    return check_uid(value, where)


def check_claim(namespace: object, name: object, uid: object) -> tuple[str, str, str]:
    """The kubelet's name for a claim; raises naming the first field that is wrong."""
    return check_namespace(namespace), check_name(name), check_uid(uid)


def claim_problems(namespace: object, name: object, uid: object) -> list[str]:
    """Every problem with a claim's namespace, name and uid (empty when all are valid)."""
    problems = []
    for check, value in ((check_namespace, namespace), (check_name, name), (check_uid, uid)):
        try:
            check(value)
        except IdentifierError as exc:
            problems.append(str(exc))
    return problems


def safe_component(value: str, where: str) -> str:
    """A name that is to become one path component: not empty, not ``.`` or ``..``, no
    ``/`` and no NUL, at most 255 bytes (a file name's limit)."""
    if not value or value in (".", "..") or "/" in value or "\0" in value \
            or len(value.encode(errors="surrogatepass")) > 255:
        raise IdentifierError(f"{where} {shown(value)} cannot be a file name")
    return value


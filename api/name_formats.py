"""Name and value formats of ``k8s.io/apimachinery`` (``util/validation`` and the newer
``api/validate/content``), worded as apimachinery words them.

Each ``*_errors`` function returns the problem messages (empty when the value is valid);
callers turn them into field errors on their own paths.
"""

from __future__ import annotations

import re
from typing import Final

from gpudra.api.api_limits import (
    DNS1123_LABEL_MAX_LENGTH,
    DNS1123_SUBDOMAIN_MAX_LENGTH,
    LABEL_KEY_NAME_MAX_LENGTH,
    LABEL_VALUE_MAX_LENGTH,
)

_DNS1123_LABEL_FMT: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT: Final = _DNS1123_LABEL_FMT + "(\\." + _DNS1123_LABEL_FMT + ")*"
_C_IDENTIFIER_FMT: Final = "[A-Za-z_][A-Za-z0-9_]*"
_LABEL_KEY_FMT: Final = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE_FMT: Final = "(" + _LABEL_KEY_FMT + ")?"

_DNS1123_LABEL_RE: Final = re.compile(_DNS1123_LABEL_FMT)
_DNS1123_SUBDOMAIN_RE: Final = re.compile(_DNS1123_SUBDOMAIN_FMT)
_C_IDENTIFIER_RE: Final = re.compile(_C_IDENTIFIER_FMT)
_LABEL_KEY_RE: Final = re.compile(_LABEL_KEY_FMT)
_LABEL_VALUE_RE: Final = re.compile(_LABEL_VALUE_FMT)

_NUMERIC_ID: Final = "(0|[1-9][0-9]*)"
_PRERELEASE_ID: Final = "(0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)"
_BUILD_ID: Final = "[0-9a-zA-Z-]+"
SEMVER_RE: Final = re.compile(
    rf"{_NUMERIC_ID}\.{_NUMERIC_ID}\.{_NUMERIC_ID}"
    rf"(-{_PRERELEASE_ID}(\.{_PRERELEASE_ID})*)?"
    rf"(\+{_BUILD_ID}(\.{_BUILD_ID})*)?"
)
"""The semver 2.0.0 grammar the apiserver uses for version attributes (no leading zeros)."""


def _regex_error(message: str, fmt: str, *examples: str) -> str:
    """apimachinery's ``RegexError`` (the double space before ``or`` is theirs)."""
    if not examples:
        return f"{message} (regex used for validation is '{fmt}')"
    listed = " or ".join(f"'{example}', " for example in examples)
    return f"{message} (e.g. {listed}regex used for validation is '{fmt}')"


_DNS1123_LABEL_MSG: Final = _regex_error(
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character",
    _DNS1123_LABEL_FMT, "my-name", "123-abc",
)
_DNS1123_SUBDOMAIN_MSG: Final = _regex_error(
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character",
    _DNS1123_SUBDOMAIN_FMT, "example.com",
)
_C_IDENTIFIER_MSG: Final = _regex_error(
    "a valid C identifier must start with alphabetic character or '_', followed by a string "
    "of alphanumeric characters or '_'",
    _C_IDENTIFIER_FMT, "my_name", "MY_NAME", "MyName",
)
_LABEL_KEY_MSG: Final = _regex_error(
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character",
    _LABEL_KEY_FMT, "MyName", "my.name", "123-abc",
)
_LABEL_VALUE_MSG: Final = _regex_error(
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character",
    _LABEL_VALUE_FMT, "MyValue", "my_value", "12345",
)
SEMVER_MSG: Final = "must be a string compatible with semver.org spec 2.0.0"


def nbytes(text: str) -> int:
    """Go's ``len(string)``: the UTF-8 byte count."""
    return len(text.encode())


def _max_len_msg(length: int) -> str:
    # util/validation says "characters"; the newer api/validate/content says "bytes" (below).
    return f"must be no more than {length} characters"


def dns1123_label_errors(value: str) -> list[str]:
    """``IsDNS1123Label``: device, counter set and counter names."""
    errors = []
    if nbytes(value) > DNS1123_LABEL_MAX_LENGTH:
        errors.append(_max_len_msg(DNS1123_LABEL_MAX_LENGTH))
    if not _DNS1123_LABEL_RE.fullmatch(value):
        if _DNS1123_SUBDOMAIN_RE.fullmatch(value):
            errors.append("must not contain dots")
        else:
            errors.append(_DNS1123_LABEL_MSG)
    return errors


def dns1123_subdomain_errors(value: str) -> list[str]:
    """``IsDNS1123Subdomain``: object names, node names, pool name parts, driver names."""
    errors = []
    if nbytes(value) > DNS1123_SUBDOMAIN_MAX_LENGTH:
        errors.append(_max_len_msg(DNS1123_SUBDOMAIN_MAX_LENGTH))
    if not _DNS1123_SUBDOMAIN_RE.fullmatch(value):
        errors.append(_DNS1123_SUBDOMAIN_MSG)
    return errors


def _content_subdomain_errors(value: str) -> list[str]:
    errors = []
    if nbytes(value) > DNS1123_SUBDOMAIN_MAX_LENGTH:
        errors.append(f"must be no more than {DNS1123_SUBDOMAIN_MAX_LENGTH} bytes")
    if not _DNS1123_SUBDOMAIN_RE.fullmatch(value):
        errors.append(_DNS1123_SUBDOMAIN_MSG)
    return errors


def label_key_errors(value: str) -> list[str]:
    """``content.IsLabelKey`` (a.k.a. qualified name): taint keys."""
    errors: list[str] = []
    parts = value.split("/")
    if len(parts) > 2:
        return [
            "a valid label key " + _LABEL_KEY_MSG
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    name = parts[-1]
    if len(parts) == 2:
        if not parts[0]:
            errors.append("prefix part must be non-empty")
        else:
            errors += ["prefix part " + msg for msg in _content_subdomain_errors(parts[0])]
    if not name:
        errors.append("name part must be non-empty")
    elif nbytes(name) > LABEL_KEY_NAME_MAX_LENGTH:
        errors.append(f"name part must be no more than {LABEL_KEY_NAME_MAX_LENGTH} bytes")
    if not _LABEL_KEY_RE.fullmatch(name):
        errors.append("name part " + _LABEL_KEY_MSG)
    return errors


def label_value_errors(value: str) -> list[str]:
    """``content.IsLabelValue``: taint values."""
    errors = []
    if nbytes(value) > LABEL_VALUE_MAX_LENGTH:
        errors.append(f"must be no more than {LABEL_VALUE_MAX_LENGTH} bytes")
    if not _LABEL_VALUE_RE.fullmatch(value):
        errors.append(_LABEL_VALUE_MSG)
    return errors


def c_identifier_errors(value: str) -> list[str]:
    """``IsCIdentifier``: the name part of attribute and capacity keys."""
    return [] if _C_IDENTIFIER_RE.fullmatch(value) else [_C_IDENTIFIER_MSG]

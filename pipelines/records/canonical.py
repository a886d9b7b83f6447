"""Content identity of kernelindex.dev/v1alpha1 manifests.

digest = "sha256:" + hex(sha256(JCS({apiVersion, kind, spec}))), where JCS is RFC 8785. Metadata
never enters a digest.

``rfc8785`` (Trail of Bits) is the reference serializer, but it is pure Python, slow for a
path every record takes. The fast path hands a document to ``orjson`` with sorted keys when every
part of it is printed identically by both: ASCII keys (so byte order equals UTF-16 code-unit
order) and numbers that are integers or non-integral floats in [1e-5, 1e15), where orjson's shortest
round-trip output is ECMAScript's. Any other document takes the reference path.
tests/test_canonical.py proves the two byte-identical over generated documents and every vector.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson
import rfc8785

from pipelines.records.rules import MAX_SAFE_INTEGER

FAST_FLOAT_MIN = 1e-5
FAST_FLOAT_MAX = 1e15


def _fast_path_safe(value: Any) -> bool:
    """True when orjson with sorted keys prints `value` exactly as RFC 8785 does."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        number: int = value
        return -MAX_SAFE_INTEGER <= number <= MAX_SAFE_INTEGER
    if kind is float:
        magnitude = abs(value)
        return FAST_FLOAT_MIN <= magnitude < FAST_FLOAT_MAX and not value.is_integer()
    if kind is dict:
        return all(type(k) is str and k.isascii() and _fast_path_safe(v) for k, v in value.items())
    if kind is list:
        return all(_fast_path_safe(v) for v in value)
    return False


def number_text(value: int | float) -> str:
    """A number as RFC 8785 prints it (ECMAScript's Number::toString), for templates that splice
    numbers into canonical JSON. Python's repr has ECMAScript's shortest round-trip digits and,
    for magnitudes in [1e-4, 1e16), its positional form too; other numbers take the reference."""
    if type(value) is float:
        if 1e-4 <= abs(value) < 1e16 and not value.is_integer():
            return repr(value)
        if value.is_integer() and abs(value) <= MAX_SAFE_INTEGER:
            return str(int(value))
    elif type(value) is int and abs(value) <= MAX_SAFE_INTEGER:
        return str(value)
    return rfc8785.dumps(value).decode()


def canonical_json_reference(value: Any) -> bytes:
    """RFC 8785 canonical bytes by the reference implementation."""
    return rfc8785.dumps(value)


def canonical_json(value: Any) -> bytes:
    """RFC 8785 canonical bytes of a JSON value (fast path when provably identical)."""
    if _fast_path_safe(value):
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    return rfc8785.dumps(value)


def identity(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a manifest that carries meaning: apiVersion, kind and spec."""
    return {
        "apiVersion": manifest["apiVersion"],
        "kind": manifest["kind"],
        "spec": manifest["spec"],
    }


def identity_json(manifest: Mapping[str, Any]) -> bytes:
    return canonical_json(identity(manifest))


def digest_of_canonical(canonical: bytes) -> str:
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """The content address of a manifest."""
    return digest_of_canonical(identity_json(manifest))

"""Content identity of kernelindex.dev/v1alpha1 manifests.

digest = "sha256:" + hex(sha256(JCS({apiVersion, kind, spec}))), where JCS is RFC 8785. Metadata
never enters a digest. ``rfc8785`` (Trail of Bits) is the reference serializer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import rfc8785


def canonical_json(value: Any) -> bytes:
    """RFC 8785 canonical bytes of a JSON value."""
    return rfc8785.dumps(value)


def identity(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a manifest that carries meaning: apiVersion, kind and spec."""
    return {"apiVersion": manifest["apiVersion"], "kind": manifest["kind"], "spec": manifest["spec"]}


def identity_json(manifest: Mapping[str, Any]) -> bytes:
    return canonical_json(identity(manifest))


def digest_of_canonical(canonical: bytes) -> str:
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """The content address of a manifest."""
    return digest_of_canonical(identity_json(manifest))

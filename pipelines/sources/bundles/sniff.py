"""Is a dropped object a worker bundle? Decided by content (the key's suffix is only a hint)."""

from __future__ import annotations

import re

SNIFF_BYTES = 64 * 1024
BUNDLE_SUFFIXES = (".yaml", ".yml", ".json")
# A top-level key a bundle or manifest starts with, or a YAML document marker.
_BUNDLE_LINE = re.compile(
    rb"^(?:---|(?:apiVersion|kind|metadata|spec|projects|operations|workloads|implementations|runs)"
    rb"\s*:)",
    re.MULTILINE,
)


def looks_like_bundle(key: str, data: bytes) -> bool:
    head = data[:SNIFF_BYTES].lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith((b"{", b"[")):
        return True  # JSON (a CSV never starts with a bracket)
    if _BUNDLE_LINE.search(head):
        return True
    return key.lower().endswith(BUNDLE_SUFFIXES)

"""Is a dropped object a worker bundle? Decided by content: JSON is a bundle only when it claims
to be one (kernelindex's apiVersion, or a bundle's lists), since most JSON that GPU workers write
is some harness's own format (pipelines/sources/), or nobody's."""

from __future__ import annotations

import re

SNIFF_BYTES = 64 * 1024
YAML_SUFFIXES = (".yaml", ".yml")
# A top-level key a bundle or manifest starts with, or a YAML document marker.
_BUNDLE_LINE = re.compile(
    rb"^(?:---|(?:apiVersion|kind|metadata|spec|projects|operations|workloads|implementations|runs)"
    rb"\s*:)",
    re.MULTILINE,
)
# What a JSON bundle or manifest holds: kernelindex's apiVersion, a manifest's kind, or a list
# of manifests under a bundle's key.
_JSON_CLAIM = re.compile(
    rb'"apiVersion"\s*:\s*"kernelindex\.dev/|"kind"\s*:\s*"(?:OperationSpec|WorkloadCase|'
    rb"SoftwareProject|ImplementationRevision|BenchmarkProtocol|ExecutionEnvironment|"
    rb'BenchmarkRun|WorkloadSuite)"|"(?:projects|operations|workloads|implementations|runs)"'
    rb"\s*:\s*\["
)


def looks_like_bundle(key: str, data: bytes) -> bool:
    head = data[:SNIFF_BYTES].lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith((b"{", b"[")):
        return _JSON_CLAIM.search(head) is not None
    if _BUNDLE_LINE.search(head):
        return True
    return key.lower().endswith(YAML_SUFFIXES)

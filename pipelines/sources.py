"""Which source a dropped object is, recognized by content, and its normalizer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pipelines.records import RowOutcome


@dataclass(slots=True)
class SourceResult:
    source: str  # "liger-csv" | "worker-bundle"
    parser_version: str
    outcomes: Iterator[RowOutcome]


def normalize_object(
    key: str, data: bytes, *, known_digest: Callable[[str], bool] | None = None
) -> SourceResult:
    """Normalize the bytes of one object version. Never raises on bad content: a file that no
    source recognizes yields a single quarantined outcome that says why.

    `known_digest(d)` tells whether the index already holds a manifest with digest `d`; a worker
    bundle may name such manifests without carrying them."""
    from pipelines.bundles.sniff import looks_like_bundle

    if looks_like_bundle(key, data):
        from pipelines.bundles import normalize as bundle

        return SourceResult(
            "worker-bundle",
            bundle.PARSER_VERSION,
            bundle.normalize_bundle_bytes(data, known_digest or bundle.never_known),
        )
    from pipelines.liger import normalize as liger

    try:
        return SourceResult("liger-csv", liger.parser_version(), liger.normalize_bytes(data))
    except liger.NotLigerCsv as error:
        return SourceResult(
            "unrecognized", liger.parser_version(), iter([unrecognized(data, str(error))])
        )


RAW_PREVIEW_BYTES = 4096


def unrecognized(data: bytes, why: str) -> RowOutcome:
    """The single outcome of an object no source recognizes. Its bytes stay in the snapshot; the
    outcome keeps a readable preview of the start, with undecodable bytes escaped."""
    preview = data[:RAW_PREVIEW_BYTES].decode("utf-8", errors="backslashreplace")
    return RowOutcome(
        1,
        "quarantined",
        preview,
        "unrecognized_format",
        f"not a Liger CSV or a worker bundle: {why}",
    )

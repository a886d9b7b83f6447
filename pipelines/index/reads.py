"""Object versions read: which key (and ETag, version) each snapshot was read as, and which read
of a key is its newest version.

The same bytes dropped under two keys are one snapshot but two reads; retraction is judged per
key, so the index needs every read. Each read goes into the sets file of the batch that processed
it (`records/batches/<batch>/sets.json`; an object of its own beside its record set in homes
written before, `records/<parser_version>/<snapshot hex>/reads/<read id>.json`).

A read is an `ObjectRead` (pipelines/index/bucket_format.py, which owns the bucket's format).

A key that returns to bytes it held before (A, then B, then A again) is read again: the second A
is a new read of the same snapshot, with its own LastModified, so the key's newest read is what
it holds now, not what it held when those bytes were first seen.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

# The one rule for "the newest version of a key": by commit time where the version carries one
# (a file's git history may be uploaded in any order), else by LastModified; then LastModified
# (one-second resolution), the time of the read and the read's id break ties. `newest_order`
# and NEWEST_ORDER_SQL are the same rule for Python and for DuckDB over the snapshots table.
NEWEST_ORDER_SQL = (
    "{'at': coalesce(committed_at, last_modified), 'lm': last_modified, "
    "'taken': taken_at, 'id': read_id}"
)


def newest_order(
    committed_at: datetime | None, last_modified: datetime, taken_at: datetime, read_id: str = ""
) -> tuple[datetime, datetime, datetime, str]:
    """The sort key of a read: a larger one is a newer version of its key (NEWEST_ORDER_SQL)."""
    return (committed_at or last_modified, last_modified, taken_at, read_id)


def read_id(
    bucket: str,
    key: str,
    etag: str,
    version_id: str | None,
    last_modified: datetime,
    taken_at: datetime,
) -> str:
    """One per read of an object version: the same bytes uploaded to the key again are a new
    version (a new LastModified, or a new read within the same second); processing the same
    read again (a backfill) gives the same id."""
    text = "\x1f".join(
        [bucket, key, etag, version_id or "", last_modified.isoformat(), taken_at.isoformat()]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]

"""What every kindex asset shares: its keys, group, owner, retry policy, and the code versions
that say when what an asset holds was made by other code than now."""

from __future__ import annotations

import hashlib

from dagster import AssetKey, Backoff, Jitter, RetryPolicy

from pipelines.index.tables import views_fingerprint
from pipelines.sources import current_parser_versions

GROUP = "kindex"
OWNERS = ["team:kindex"]
RECORDS_KEY = AssetKey("records")
INDEX_KEY = AssetKey("index")
# One writer at a time (the instance gives every pool a limit of 1, see `kindex up`).
INDEX_POOL = "kindex_index"
# A transient fault of the batch as a whole (the index's publish, the ledger's commit) gets the
# step again: files already written find their record sets and add nothing twice.
FILE_RETRY_POLICY = RetryPolicy(
    max_retries=3, delay=1, backoff=Backoff.EXPONENTIAL, jitter=Jitter.PLUS_MINUS
)


def records_code_version() -> str:
    """The parser versions of every source: a record set made by another is made again on
    backfill, so `records` made before reads as stale in the UI."""

    text = "\n".join(sorted(current_parser_versions()))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def index_code_version() -> str:
    """The views' fingerprint (pipelines/index/tables.py): an index built with other views is
    built again."""

    return views_fingerprint()

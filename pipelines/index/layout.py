"""Where record objects, published index versions and the local index live.

Prefixes come from Settings when it names them (`records_prefix`, `index_prefix`); otherwise the
defaults below. The local side lives under the kindex home directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pipelines.settings import Settings

DEFAULT_RECORDS_PREFIX = "records/"
DEFAULT_INDEX_PREFIX = "index/"
# Under the records prefix: a folder per batch, for its shared objects and its sets file.
SHARED_DIR = "batches"


def _prefix(value: str) -> str:
    return value if value.endswith("/") or not value else value + "/"


@dataclass(frozen=True, slots=True)
class IndexLayout:
    bucket: str
    home: Path
    records_prefix: str = DEFAULT_RECORDS_PREFIX
    index_prefix: str = DEFAULT_INDEX_PREFIX

    @classmethod
    def of(cls, settings: Settings) -> IndexLayout:
        return cls(
            bucket=settings.bucket,
            home=Path(settings.home),
            records_prefix=_prefix(getattr(settings, "records_prefix", DEFAULT_RECORDS_PREFIX)),
            index_prefix=_prefix(getattr(settings, "index_prefix", DEFAULT_INDEX_PREFIX)),
        )

    # bucket side
    def record_set_prefix(self, parser_version: str, snapshot_digest: str) -> str:
        return f"{self.records_prefix}{parser_version}/{snapshot_hex(snapshot_digest)}/"

    @property
    def batches_prefix(self) -> str:
        return f"{self.records_prefix}{SHARED_DIR}/"

    # local side
    @property
    def cache_dir(self) -> Path:
        return Path(self._cache_root())

    def cached_location(self, key: str) -> str:
        """Where an object's local copy lives (a string: an install names thousands)."""
        return os.path.join(self._cache_root(), key)

    def _cache_root(self) -> str:
        return os.path.join(self.home, "cache", self.bucket)

    def cached_path(self, key: str) -> Path:
        return Path(self.cached_location(key))

    @property
    def local_db(self) -> Path:
        return self.home / "index.duckdb"

    @property
    def local_db_dir(self) -> Path:
        return self.home / "index-db"


def snapshot_hex(digest: str) -> str:
    return digest.removeprefix("sha256:")

"""The bucket's format for what a batch wrote: its sets file, as one typed record.

A batch's sets file (`records/batches/<written at>-<id>/sets.json`, written last) holds the
summary of each record set the batch's files name (`RecordSetSummary`) and each file's read
(`ObjectRead`). Ingest writes it (`SetsFileContent.dumps`), and the publish and intake read it
(`SetsFileContent.loads`); no one else knows its JSON. A batch's ledger rows name it
(`FileEntry.sets_file`), which is how a publish finds what was committed since its version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict, cast

import orjson

from pipelines.index.reads import read_id
from pipelines.records.record_objects import RecordSetSummary, record_object_key


@dataclass(frozen=True, slots=True)
class RecordSet:
    prefix: str  # records/<parser_version>/<snapshot hex>/
    summary: RecordSetSummary

    @property
    def snapshot_digest(self) -> str:
        return self.summary["snapshot_digest"]

    @property
    def parser_version(self) -> str:
        return self.summary["parser_version"]

    def object_names(self, name: str) -> list[str]:
        """What its summary names for one of its tables: its own object or parts, or an
        object of its batch (record_objects.is_shared)."""
        return list(self.summary.get("files", {}).get(name, [f"{name}.parquet"]))

    def file_keys(self, name: str) -> list[str]:
        return [record_object_key(self.prefix, n) for n in self.object_names(name)]


@dataclass(frozen=True, slots=True)
class ObjectRead:
    snapshot_digest: str
    bucket: str
    source_key: str
    etag: str
    version_id: str | None
    size: int
    last_modified: datetime  # the object version's LastModified (server clock)
    taken_at: datetime  # when kindex read it
    parser_version: str
    source: str
    processed_at: datetime | None = None  # when this parser version made the record set
    commit: str | None = None  # the git commit the version was uploaded from (kindex put --git)
    committed_at: datetime | None = None  # that commit's time

    @property
    def read_id(self) -> str:
        return read_id(
            self.bucket,
            self.source_key,
            self.etag,
            self.version_id,
            self.last_modified,
            self.taken_at,
        )

    def to_json(self) -> bytes:
        # Its fields are flat: asdict's deep copy of each would cost more than the dump.
        data = {name: getattr(self, name) for name in self.__slots__} | {"read_id": self.read_id}
        return orjson.dumps(data, option=orjson.OPT_SORT_KEYS | orjson.OPT_UTC_Z)

    @classmethod
    def from_json(cls, data: bytes) -> ObjectRead:
        """A read as `to_json` wrote it (a sets file's entry, or a legacy read object)."""
        return read_of(cast(ReadJson, orjson.loads(data)))


class ReadJson(TypedDict):
    """An ObjectRead as the sets file holds it (times as ISO 8601 text)."""

    snapshot_digest: str
    bucket: str
    source_key: str
    etag: str
    version_id: str | None
    size: int
    last_modified: str
    taken_at: str
    parser_version: str
    source: str
    processed_at: str | None
    commit: str | None
    committed_at: str | None
    read_id: str


class _SetJson(TypedDict):
    prefix: str
    summary: RecordSetSummary


class _ReadEntryJson(TypedDict):
    prefix: str
    read: ReadJson


class _SetsFileJson(TypedDict):
    sets: list[_SetJson]
    reads: list[_ReadEntryJson]


class SetsFileError(ValueError):
    """A sets file that does not hold what the format says."""


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def read_of(data: ReadJson) -> ObjectRead:
    """The ObjectRead a sets file's entry (or a legacy read object) holds."""
    last_modified, taken_at = _time(data["last_modified"]), _time(data["taken_at"])
    if last_modified is None or taken_at is None:
        raise SetsFileError(f"a read of {data.get('source_key')!r} lacks its times")
    return ObjectRead(
        snapshot_digest=data["snapshot_digest"],
        bucket=data["bucket"],
        source_key=data["source_key"],
        etag=data["etag"],
        version_id=data.get("version_id"),
        size=data["size"],
        last_modified=last_modified,
        taken_at=taken_at,
        parser_version=data["parser_version"],
        source=data["source"],
        processed_at=_time(data.get("processed_at")),
        commit=data.get("commit"),
        committed_at=_time(data.get("committed_at")),
    )


@dataclass(frozen=True, slots=True)
class RegisteredRead:
    """A read the sets file registers with a record set (its prefix)."""

    prefix: str
    read: ObjectRead


@dataclass(frozen=True, slots=True)
class SetsFileContent:
    """What one batch's sets file holds: summaries by record set prefix, and the reads."""

    summaries: dict[str, RecordSetSummary]
    reads: list[RegisteredRead]

    @staticmethod
    def dumps(
        summaries: Mapping[str, RecordSetSummary], reads: Sequence[orjson.Fragment | bytes]
    ) -> bytes:
        """The sets file's bytes: `reads` are entries serialized already
        (`{"prefix": …, "read": ObjectRead.to_json()}`), one per file as its batch adds it."""
        sets = [{"prefix": prefix, "summary": summary} for prefix, summary in summaries.items()]
        fragments = [r if isinstance(r, orjson.Fragment) else orjson.Fragment(r) for r in reads]
        return orjson.dumps({"sets": sets, "reads": fragments})

    @staticmethod
    def read_entry(prefix: str, read: ObjectRead) -> bytes:
        """One read's entry, as `dumps` takes it (a batch's `SetsFile.add` writes the same)."""
        return b'{"prefix":%s,"read":%s}' % (orjson.dumps(prefix), read.to_json())

    @classmethod
    def loads(cls, data: bytes, where: str = "a sets file") -> SetsFileContent:
        try:
            parsed = cast(_SetsFileJson, orjson.loads(data))
            summaries = {entry["prefix"]: entry["summary"] for entry in parsed["sets"]}
            reads = [
                RegisteredRead(entry["prefix"], read_of(entry["read"])) for entry in parsed["reads"]
            ]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise SetsFileError(f"{where} is not a sets file: {error}") from error
        return cls(summaries, reads)

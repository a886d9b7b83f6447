"""The source interface: what every source (a folder beside this file) gives, and the shared
bases. A source is pure: bytes and a context in, outcomes and record tables out; storage is the
caller's."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pipelines.curation import load
from pipelines.records import RowOutcome
from pipelines.records.record_objects import RecordSetBuilder
from pipelines.records.rules import Reason
from pipelines.sources.json_input import RAW_LIMIT, JsonInputError, Marks, head_text, read_document
from pipelines.sources.measured import observation_outcome, quarantined
from pipelines.sources.seen_keys import digest_of

if TYPE_CHECKING:
    from pipelines.records.record_objects import RecordSetContent
    from pipelines.sources.measured import Observation

KnownDigest = Callable[[str], bool]


def _never_known(digest: str) -> bool:
    return False


ManifestNamed = Callable[[str, str], "dict[str, Any] | None"]


def _never_named(kind: str, name: str) -> dict[str, Any] | None:
    return None


@dataclass(frozen=True, slots=True)
class SourceContext:
    """What a source may look up beyond the bytes it reads. `known_digest(d)`: whether the index
    already holds a manifest with digest `d` (a worker bundle may name such manifests without
    carrying them). `manifest_named(kind, name)`: the manifest of that kind and metadata name
    the index holds, if any (a FlashInfer trace names its definition, dropped in another file)."""

    known_digest: KnownDigest = _never_known
    manifest_named: ManifestNamed = _never_named
    # When the object version was received (its LastModified, a UTC instant), or how to learn
    # it (an upload still under way): the time of a run whose format records none.
    received_at: str | Callable[[], str | None] | None = None

    def received_time(self) -> str | None:
        return self.received_at() if callable(self.received_at) else self.received_at


@dataclass(frozen=True, slots=True)
class SourceObject:
    """The bytes of one object version, their content digest (its snapshot's), and when the
    version was received (the time of a run whose format records none)."""

    snapshot_digest: str
    data: bytes
    received_at: str | None = None


class Source(Protocol):
    name: str  # as record sets and reads name their source
    # Whether its records depend on the manifests the index holds (SourceContext's lookups):
    # then a batch's files are built one at a time, each seeing those of the files before it.
    reads_index: bool

    def recognize(self, key: str, data: bytes) -> str | None:
        """None when the bytes are this source's, else why they are not."""
        ...

    def parser_version(self) -> str: ...

    def version_of(self, data: bytes, context: SourceContext) -> str:
        """The version the object's record set is written under: the parser version, unless
        what the index holds changes the records (a trace whose definition arrived since)."""
        ...

    def outcomes(self, data: bytes, context: SourceContext) -> Iterator[RowOutcome]:
        """One outcome per row or entry, in order (`kindex normalize`, a dry run)."""
        ...

    def record_set(
        self, data: bytes, snapshot_digest: str, context: SourceContext, parts_dir: Path
    ) -> RecordSetContent:
        """The object's record tables. `parts_dir`: an empty folder where the source may spool
        large tables as Parquet parts (RecordSetContent.parts), kept until they are written."""
        ...

    def record_sets(
        self, objects: Sequence[SourceObject], context: SourceContext, parts_dir: Path
    ) -> list[RecordSetContent]:
        """The record tables of several objects of this source, in their order: a batch of
        small files pays the source's fixed cost once."""
        ...


# A record set of more runs than this is spooled as Parquet parts, this many runs a part.
SPOOL_RUNS = 16_384


def record_set_of_outcomes(
    outcomes: Iterator[RowOutcome],
    snapshot_digest: str,
    parser_version: str,
    parts_dir: Path | None = None,
) -> RecordSetContent:
    """Record tables built outcome by outcome (any source can). With `parts_dir`, the runs are
    written out as Parquet parts as they come, so memory stays flat however many there are."""

    builder = RecordSetBuilder(snapshot_digest, parser_version)
    for outcome in outcomes:
        builder.add(outcome)
        if parts_dir is not None and builder.unspooled_runs >= SPOOL_RUNS:
            builder.spool(parts_dir)
    return builder.content(parts_dir)


def external_id_of(outcome: RowOutcome) -> str | None:
    """The externalId its source gave an outcome's run (`spec.sourceNative.externalId`), if any."""
    run = outcome.run
    if run is None:
        return None
    native = run.manifest["spec"].get("sourceNative")
    external_id = native.get("externalId") if isinstance(native, dict) else None
    return external_id if isinstance(external_id, str) else None


def one_run_per_external_id(outcomes: Iterable[RowOutcome]) -> Iterator[RowOutcome]:
    """The rule every source obeys: a file holds one run per externalId, the first one wins; a
    later run with an externalId already seen is quarantined (`duplicate_external_id`). The
    keys are kept as 16-byte digests (the Liger source's columnar path applies the same rule
    with SeenKeys, pipelines/sources/liger/columnar.py)."""
    seen: set[bytes] = set()
    for outcome in outcomes:
        external_id = external_id_of(outcome) if outcome.status == "ok" else None
        if external_id is not None:
            key = digest_of(external_id)
            if key in seen:
                detail = f"an earlier run of the file has externalId {external_id!r}"
                yield RowOutcome(
                    outcome.source_line,
                    "quarantined",
                    outcome.raw,
                    Reason.DUPLICATE_EXTERNAL_ID,
                    detail,
                    pointer=outcome.pointer,
                )
                continue
            seen.add(key)
        yield outcome


class RecordsOfOutcomes(ABC):
    """A source whose record tables are built outcome by outcome: what it `read`s, with the
    rules every source obeys applied (one run per externalId)."""

    reads_index = False

    @abstractmethod
    def parser_version(self) -> str: ...

    def version_of(self, data: bytes, context: SourceContext) -> str:
        return self.parser_version()

    @abstractmethod
    def read(self, data: bytes, context: SourceContext) -> Iterator[RowOutcome]:
        """The source's own outcomes of an object, one per row or entry, in order."""

    def outcomes(self, data: bytes, context: SourceContext) -> Iterator[RowOutcome]:
        return one_run_per_external_id(self.read(data, context))

    def record_set(
        self, data: bytes, snapshot_digest: str, context: SourceContext, parts_dir: Path
    ) -> RecordSetContent:
        outcomes = self.outcomes(data, context)
        version = self.version_of(data, context)
        return record_set_of_outcomes(outcomes, snapshot_digest, version, parts_dir)

    def record_sets(
        self, objects: Sequence[SourceObject], context: SourceContext, parts_dir: Path
    ) -> list[RecordSetContent]:
        sets = []
        for i, o in enumerate(objects):
            folder = parts_dir / str(i)  # each object's parts apart: they are named by number
            folder.mkdir(exist_ok=True)
            own = replace(context, received_at=o.received_at)
            sets.append(self.record_set(o.data, o.snapshot_digest, own, folder))
        return sets


class HarnessSource(RecordsOfOutcomes):
    """A benchmark harness's result format (a folder beside this file), read in one skeleton:
    recognized by the start of a file (`shows`; its `marks` say how near another file comes and
    what it lacks), then read record by record. Its `entries` are what each record measured, as
    `Observation`s (pipelines/sources/measured.py builds their records, each rule once), or a
    record's quarantined outcome; a file that cannot be read at all is one quarantined outcome
    that says why. A format's folder states only its own rules: these marks, its test of a
    file's start, and what its records mean."""

    name: str
    format_version: str  # the format reader's own version, before the curation's fingerprint
    title: str  # the format's name as its users know it
    marks: Marks  # what its files show near their start, each with what a file lacking it lacks
    shape: str  # what a file of it is at all: what a file lacks that shows every mark

    def parser_version(self) -> str:
        return f"{self.format_version}+{load().fingerprint}"

    @abstractmethod
    def shows(self, head: str) -> bool:
        """Whether the start of a file (json_input.head_text) is this format's."""

    def recognize(self, key: str, data: bytes) -> str | None:
        return self.lacks(head_text(data))

    def lacks(self, head: str) -> str | None:
        """What the start of a file lacks to be this format's; None when it is."""
        if self.shows(head):
            return None
        return self.marks.lacks(head) or self.shape

    def closeness(self, head: str) -> int:
        """How many of the format's marks the start of a file shows (0: none)."""
        return self.marks.found(head)

    def json_object(self, data: bytes, *, listing: str | None = None) -> dict[str, Any]:
        """The file as one JSON object (json_input's bounds and checks), with a list under the
        key `listing` where the format has one; a file that is not is one quarantine row."""
        document = read_document(data, named=self.title)
        if isinstance(document, dict) and (
            listing is None or isinstance(document.get(listing), list)
        ):
            return document
        detail = f"{self.title} is a JSON object" + (f" with a list {listing}" if listing else "")
        raise JsonInputError(Reason.MALFORMED_RECORD, detail)

    @abstractmethod
    def entries(self, data: bytes, context: SourceContext) -> Iterator[Observation | RowOutcome]:
        """What each record of the file measured, in file order."""

    def read(self, data: bytes, context: SourceContext) -> Iterator[RowOutcome]:
        curation = load()
        try:
            for entry in self.entries(data, context):
                if isinstance(entry, RowOutcome):
                    yield entry
                else:
                    yield observation_outcome(entry, curation)
        except JsonInputError as error:
            head = data[:RAW_LIMIT].decode("utf-8", errors="backslashreplace")
            yield quarantined(error.line, "", head, error.reason, error.detail)

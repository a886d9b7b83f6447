"""The Liger normalizer's oracles, which production is held to byte for byte: every run and
workload built the plain, slow way, as dicts canonicalized by the reference RFC 8785 serializer
(production fills per-series templates), and a file normalized row by row (production goes
batch by batch, column by column)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from pipelines.curation import Curation
from pipelines.records import Record, RowOutcome, RunFacts
from pipelines.sources.liger.normalize import (
    NAME_LIMIT,
    Layout,
    Normalizer,
    RowRead,
    Series,
    Workload,
    _manifest,
    _record,
    duplicate_outcome,
    joined_slug,
    read_record,
)
from pipelines.sources.liger.read import CsvRecord, open_liger_csv


class ReferenceNormalizer(Normalizer):
    """A Normalizer whose runs and workloads are the oracle's."""

    def __init__(self, curation: Curation | None = None) -> None:
        super().__init__(curation)
        self.workload = lru_cache(maxsize=4096)(self.reference_workload)

    def run(self, row: RowRead) -> tuple[Record, RunFacts]:
        series, stamp, workload = row.series, row.stamp, row.workload
        external_id = series._external_id_of(workload.case_key, stamp.form)
        facts = series.facts(row.values, stamp.observed_at, external_id, workload, row.version)
        run = reference_run(series, row.stats, stamp.observed_at, stamp.form, workload, row.version)
        return run, facts


def reference_run(
    series: Series,
    stats: list[float],
    observed_at: str,
    stamp: str,
    workload: Workload,
    version: str,
) -> Record:
    """The run of a row as a dict: metadata, then the spec the series writes."""
    values = series.values(stats)
    external_id = series._external_id_of(workload.case_key, stamp)
    spec = series._spec(values, stats, observed_at, external_id, workload.record.digest)
    name = joined_slug(*series._name_parts(), workload.case_key, stamp)[:NAME_LIMIT]
    metadata: dict[str, Any] = {"name": name, "title": series._title()}
    if version:
        metadata["labels"] = {"liger_version": version}
    return _record(_manifest("BenchmarkRun", metadata, spec))


def outcome_of(record: CsvRecord, layout: Layout, normalizer: Normalizer) -> RowOutcome:
    """One record's outcome, judged alone, built row by row."""
    row = read_record(record, layout, normalizer)
    if isinstance(row, RowOutcome):
        return row
    records, facts = normalizer.records(row)
    return RowOutcome(record.line, "ok", record.raw, records=records, facts=facts)


def row_outcomes(data: bytes, normalizer: Normalizer | None = None) -> Iterator[RowOutcome]:
    """A file's outcomes row by row, each judged alone (`outcome_of`) and a repeated externalId
    quarantined: what the batch path must give, byte for byte."""
    normalizer = normalizer or Normalizer()
    csv_file = open_liger_csv(io.BytesIO(data))
    layout = Layout.of(csv_file.columns)
    seen: set[str] = set()
    for record in csv_file.records:
        outcome = outcome_of(record, layout, normalizer)
        if outcome.facts is not None:
            external_id = outcome.facts.external_id
            if external_id in seen:
                outcome = duplicate_outcome(record.line, record.raw, external_id)
            else:
                seen.add(external_id)
        yield outcome

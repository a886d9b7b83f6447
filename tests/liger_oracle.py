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
from pipelines.liger.normalize import (
    NAME_LIMIT,
    Layout,
    Normalizer,
    Series,
    Workload,
    _manifest,
    _record,
    duplicate_outcome,
    joined_slug,
    outcome_of,
)
from pipelines.liger.read import open_liger_csv
from pipelines.records import Record, RowOutcome, RunFacts


class ReferenceNormalizer(Normalizer):
    """A Normalizer whose runs and workloads are the oracle's."""

    def __init__(self, curation: Curation | None = None) -> None:
        super().__init__(curation)
        self.workload = lru_cache(maxsize=4096)(self.reference_workload)

    def run(
        self,
        series: Series,
        stats: list[float],
        observed_at: str,
        stamp: str,
        workload: Workload,
        version: str,
    ) -> tuple[Record, RunFacts]:
        facts = series.run(stats, observed_at, stamp, workload, version)[1]
        return reference_run(series, stats, observed_at, stamp, workload, version), facts


def reference_run(
    series: Series,
    stats: list[float],
    observed_at: str,
    stamp: str,
    workload: Workload,
    version: str,
) -> Record:
    """The run of a row as a dict: metadata, then the spec the series writes."""
    values = series._values(stats)
    external_id = series._external_id_of(workload.case_key, stamp)
    spec = series._spec(values, stats, observed_at, external_id, workload.record.digest)
    name = joined_slug(*series._name_parts(), workload.case_key, stamp)[:NAME_LIMIT]
    metadata: dict[str, Any] = {"name": name, "title": series._title()}
    if version:
        metadata["labels"] = {"liger_version": version}
    return _record(_manifest("BenchmarkRun", metadata, spec))


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

"""The Liger normalizer's oracle: every run and workload built the plain, slow way, as dicts
canonicalized by the reference RFC 8785 serializer. Production builds runs from per-series
templates (pipelines/liger/normalize.py); the tests hold the two equal byte for byte."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pipelines.curation import Curation
from pipelines.liger.normalize import (
    NAME_LIMIT,
    Normalizer,
    Series,
    Workload,
    _manifest,
    _record,
    joined_slug,
)
from pipelines.records import Record, RunFacts


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

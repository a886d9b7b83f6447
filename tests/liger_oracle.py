"""The Liger normalizer's oracle, which production is held to byte for byte: a file normalized
row by row, each row read alone by the rules' scalar forms and its run built the plain, slow way,
as a dict canonicalized by the reference RFC 8785 serializer (production reads a batch column by
column and fills per-series templates)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import numpy as np

from pipelines.curation.gaps import Gap
from pipelines.records import Record, RowOutcome, RunFacts
from pipelines.records.canonical import canonical_json_reference, manifest_digest
from pipelines.records.rules import SHORT_LIMIT, Reason, safe_columns, slug
from pipelines.sources.liger.model import Layout, Normalizer, Series, Workload, manifest, references
from pipelines.sources.liger.read import CsvRecord, open_liger_csv
from pipelines.sources.liger.rules import (
    RowRejected,
    kernel_of,
    parse_positive,
    parse_timestamp,
    record_rejection,
    run_labels,
    stored_values,
)


def read_row(
    fields: tuple[str, ...], normalizer: Normalizer
) -> tuple[Series, Workload, list[float], list[int], str, str, str]:
    """What a row's texts say, each by its rule in a row's order, or the first RowRejected:
    (series, workload, its own numbers, stored values, observedAt, timestamp form, version)."""
    (kernel, provider, mode, metric, unit, x_name, x_value, median, p20, p80,
     config, gpu, timestamp, version) = fields  # fmt: skip
    kernel = kernel_of(normalizer.curation, kernel, config)
    series = normalizer.series(kernel, provider, mode, gpu, metric, unit)
    stats = [
        parse_positive(median, "y_value_50"),
        parse_positive(p20, "y_value_20"),
        parse_positive(p80, "y_value_80"),
    ]
    observed_at, form = parse_timestamp(timestamp)
    workload = normalizer.workload(series.kernel, x_name, x_value, config)
    values = stored_values(np.array(stats, dtype=np.float64), series.scale)
    if not safe_columns(values):
        raise RowRejected(Reason.BAD_NUMBER, f"value out of range: {max(stats)!r}")
    return series, workload, stats, [int(v) for v in values], observed_at, form, version.strip()


def reference_run(
    series: Series,
    workload: Workload,
    stats: list[float],
    values: list[int],
    observed_at: str,
    form: str,
    version: str,
) -> tuple[Record, RunFacts]:
    """The run of a row as a dict: metadata, then the spec the series writes."""
    external_id = "/".join(
        [series.kernel, series.mode, series.provider, slug(series.gpu), workload.case_key, form]
    ) + (f"/{series.metric}" if series.metric else "/memory" if series.memory else "")
    spec = series.spec(values, stats, observed_at, external_id, workload.record.digest)
    name = slug("-".join([*series.name_parts, workload.case_key, form]))[:SHORT_LIMIT]
    metadata: dict[str, Any] = {"name": name, "title": series.title}
    gaps = (*series.gaps, *([Gap.CONFIG] if workload.uncurated else []))
    labels = run_labels(version, gaps)
    if labels:
        metadata["labels"] = labels
    document = manifest("BenchmarkRun", metadata, spec)
    # A run's manifest is written as its canonical JSON (`kindex normalize`, the record tables).
    text = canonical_json_reference(document).decode()
    run = Record("BenchmarkRun", manifest_digest(document), manifest_json=text)
    return run, series.facts(values, observed_at, external_id, workload, version)


def outcome_of(record: CsvRecord, layout: Layout, normalizer: Normalizer) -> RowOutcome:
    """One record's outcome, judged alone, built row by row."""
    try:
        rejected = record_rejection(record.fields, record.error, layout.width)
        if rejected is not None:
            raise rejected
        series, workload, *read = read_row(layout.pick(record.fields or []), normalizer)
    except RowRejected as rejected:
        return RowOutcome(record.line, "quarantined", record.raw, rejected.reason, rejected.detail)
    run, facts = reference_run(series, workload, *read)
    records = [run, *references(series, workload)]
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
                detail = (
                    f"externalId {external_id} already appeared earlier in this file"
                    " (first one wins)"
                )
                outcome = RowOutcome(
                    record.line, "quarantined", record.raw, "duplicate_external_id", detail
                )
            else:
                seen.add(external_id)
        yield outcome

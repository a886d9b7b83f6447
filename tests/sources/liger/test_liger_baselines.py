"""Baseline providers are stated once, as ranks in providers.yaml, and a speedup once, as the
index's `speedups` view, which reads them there; the chart (pipelines.charts) reads the view."""

from __future__ import annotations

from collections import Counter
from typing import Any

import duckdb
from index_support import DATA, LIGER_CSV, index_settings, ingest_bytes, query

from pipelines import curation
from pipelines.charts import SPEEDUP_COLUMNS, speedup_series
from pipelines.index.tables import baseline_providers_statement

SAMPLE = DATA / "liger" / "corpus_sample.csv"
__all__ = ["index_settings"]  # a fixture


def test_the_view_holds_the_curated_ranks_and_nothing_else() -> None:
    con = duckdb.connect()
    con.execute(baseline_providers_statement())
    rows = dict(con.execute("SELECT provider, rank FROM baseline_providers").fetchall())
    assert rows == curation.load().baseline_ranks()
    # Liger's scripts compare against the reference module (huggingface, torch) and Megatron's
    # unfused path; megatron (WrappedTorchNorm, a parity check) and DeepSpeed's tiled MLP are
    # compared, not compared against (KernelIndex's importer labels neither a baseline).
    assert {"huggingface", "torch", "megatron-unfused"} <= set(rows)
    assert not {"megatron", "deepspeed_tiled", "torch_compile", "liger"} & set(rows)
    con.execute(baseline_providers_statement({"x'y": 3}))
    assert con.execute("SELECT * FROM baseline_providers").fetchall() == [("x'y", 3)]


def test_the_chart_reads_the_speedups_view_whose_baseline_is_the_lowest_rank_present(
    s3_store: Any, index_settings: Any
) -> None:
    ingest_bytes(
        s3_store,
        index_settings,
        [
            ("incoming/head.csv", LIGER_CSV.read_bytes()),
            ("incoming/sample.csv", SAMPLE.read_bytes()),
        ],
    )
    rows = [
        dict(zip(SPEEDUP_COLUMNS, row, strict=True))
        for row in query(
            index_settings,
            f"SELECT {', '.join(SPEEDUP_COLUMNS)} FROM speedups WHERE metric = 'latency'",
        )
    ]
    series = speedup_series(rows)
    assert sum(map(len, series.values())) == len(rows) > 0
    # Each speedup's baseline is the lowest-ranked curated provider of its cohort's latest runs.
    ranks = curation.load().baseline_ranks()
    cohort = (
        "operation_digest, workload_digest, protocol_digest, environment_digest, metric, kernel"
    )
    present: dict[tuple[Any, ...], set[str]] = {}
    for *key, provider in query(index_settings, f"SELECT {cohort}, provider FROM latest_runs"):
        present.setdefault(tuple(key), set()).add(provider)
    pairs = query(index_settings, f"SELECT {cohort}, provider, baseline_provider FROM speedups")
    assert pairs
    for *key, provider, baseline in pairs:
        ranked = [p for p in present[tuple(key)] if p in ranks]
        assert baseline == min(ranked, key=ranks.__getitem__)
        assert provider != baseline
    view = Counter((label, value) for label, values in series.items() for value in values)
    labels = {label for label, _ in view}
    # the cohorts the SQL once ranked apart from the chart
    assert "megatron_cross_entropy: liger vs megatron-unfused" in labels
    assert "megatron_rms_norm: megatron vs torch" in labels
    assert "tiled_geglu: deepspeed_tiled vs huggingface" in labels
    assert not any(label.endswith((" vs megatron", " vs deepspeed_tiled")) for label in labels)

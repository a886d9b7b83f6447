"""Baseline providers are stated once, as ranks in providers.yaml: the index's `speedups` view
and the chart (pipelines.charts.speedups) read them there and agree cohort for cohort."""

from __future__ import annotations

from collections import Counter
from typing import Any

import duckdb
from index_support import DATA, LIGER_CSV, index_settings, ingest_bytes, query

from pipelines import curation
from pipelines.charts import speedups
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


def test_the_speedups_view_and_the_chart_agree_cohort_for_cohort(
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
    columns = ("kernel", "mode", "gpu", "case_key", "provider", "metric", "median", "run_digest")
    latest = [
        dict(zip(columns, row, strict=True))
        for row in query(index_settings, f"SELECT {', '.join(columns)} FROM latest_runs")
    ]
    observed = dict(query(index_settings, "SELECT run_digest, observed_at FROM latest_runs"))
    for row in latest:
        row["observed_at"] = observed[row["run_digest"]].isoformat()
    chart = Counter(
        (label, round(value, 4)) for label, values in speedups(latest).items() for value in values
    )
    view = Counter(
        (f"{kernel}: {provider} vs {baseline}", speedup)
        for kernel, provider, baseline, speedup in query(
            index_settings,
            "SELECT kernel, provider, baseline_provider, speedup FROM speedups"
            " WHERE metric = 'latency'",
        )
    )
    assert chart == view
    labels = {label for label, _ in view}
    # the cohorts the SQL once ranked apart from the chart
    assert "megatron_cross_entropy: liger vs megatron-unfused" in labels
    assert "megatron_rms_norm: megatron vs torch" in labels
    assert "tiled_geglu: deepspeed_tiled vs huggingface" in labels
    assert not any(label.endswith((" vs megatron", " vs deepspeed_tiled")) for label in labels)

"""A file processed again by another parser (a backfill after the curation grew) is described by
its new runs only: the runs its old record set alone held leave runs, latest_runs and every view,
and come back when that record set is current again; `--as-of` still shows them as they were."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from index_support import (
    NEW_GPU,
    add_new_gpu,
    csv_bytes,
    curation,
    drop_and_process,
    index_settings,
    liger_rows,
    query,
)

from pipelines.cli import main
from pipelines.index.local import load_current
from pipelines.index.publish import publish_index

__all__ = ["curation", "index_settings"]  # the fixtures, imported for pytest

KEY = "incoming/new-gpu.csv"
T1, T2 = "2026-02-28 00:23:31", "2026-03-02 10:00:00"
UNCURATED = "manifest->>'$.metadata.labels.curation' = 'uncurated'"


def file_bytes() -> bytes:
    """A curated B200 run and an RTX 2080 Ti case measured twice (T1, then T2: the first is
    superseded, a settled row), with a torch baseline of each so speedups has rows."""
    header, rows = liger_rows(
        [1836, 1843]
    )  # group_norm backward at 2048 channels: liger, huggingface
    gpu, timestamp, median = (header.index(c) for c in ("gpu_name", "timestamp", "y_value_50"))
    out = [list(r) for r in rows]
    for when, bump in ((T1, 0.0), (T2, 0.5)):
        for r in rows:
            moved = list(r)
            moved[gpu], moved[timestamp] = NEW_GPU, when
            moved[median] = repr(float(moved[median]) + bump)
            out.append(moved)
    return csv_bytes(header, out)


def process_and_publish(store: Any, settings: Any, data: bytes, key: str = KEY) -> None:
    drop_and_process(store, settings, key, data)
    publish_index(store, settings)


def test_a_backfill_after_the_curation_grew_leaves_only_the_curated_runs(
    s3_store: Any, index_settings: Any, curation: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = file_bytes()
    process_and_publish(s3_store, index_settings, data)
    before = load_current(s3_store, index_settings).version.version
    runs_sql = "SELECT gpu, architecture, observed_at, superseded_by IS NULL FROM runs ORDER BY ALL"
    uncurated = query(index_settings, f"SELECT run_digest FROM runs WHERE {UNCURATED}")
    assert len(uncurated) == 4
    old_runs = query(index_settings, runs_sql)
    assert query(index_settings, "SELECT count(*) FROM latest_runs") == [(4,)]

    shrink = add_new_gpu(curation)
    process_and_publish(s3_store, index_settings, data)  # the file processed again

    # The curated runs only: each GPU's case once per time, the T1 runs superseded by T2's.
    rows = query(index_settings, runs_sql)
    assert len(rows) == 6
    assert {(gpu, arch) for gpu, arch, _, _ in rows} == {
        ("NVIDIA B200", "sm_100"),
        (NEW_GPU, "sm_75"),
    }
    assert query(index_settings, f"SELECT count(*) FROM runs WHERE {UNCURATED}") == [(0,)]
    gone = {digest for (digest,) in uncurated}
    for view in ("runs", "latest_runs", "speedups", "lineage"):
        digests = {d for (d,) in query(index_settings, f"SELECT run_digest FROM {view}")}
        assert not digests & gone, view
    assert query(index_settings, "SELECT count(*) FROM latest_runs") == [(4,)]
    assert query(index_settings, "SELECT count(*) FROM runs WHERE superseded_by IS NOT NULL") == [
        (2,)
    ]
    assert query(index_settings, "SELECT count(DISTINCT run_digest), count(*) FROM runs") == [
        (6, 6)
    ]
    (speedups,) = query(index_settings, f"SELECT count(*) FROM speedups WHERE gpu = '{NEW_GPU}'")
    assert speedups[0] > 0
    # Every run is the current record set's, line by line.
    assert query(
        index_settings,
        "SELECT count(*) FROM runs r SEMI JOIN lineage l USING (run_digest)",
    ) == [(6,)]

    # The version before still shows the uncurated runs.
    sql = f"SELECT count(*) FROM runs WHERE {UNCURATED}"
    assert main(["query", sql, "--format", "csv", "--as-of", before]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "4"

    # The same bytes dropped under another key with the curation as it was: the file's first
    # record set is current again, and its runs come back (the curated ones leave).
    (curation / "gpus.yaml").write_text(shrink)
    process_and_publish(s3_store, index_settings, data, "incoming/again.csv")
    assert query(index_settings, runs_sql) == old_runs
    assert sorted(
        query(index_settings, f"SELECT run_digest FROM runs WHERE {UNCURATED}")
    ) == sorted(uncurated)


def test_processing_the_same_file_again_with_the_same_parser_changes_no_run(
    s3_store: Any, index_settings: Any, curation: Path
) -> None:
    data = file_bytes()
    process_and_publish(s3_store, index_settings, data)
    sql = "SELECT run_digest, superseded_by, retracted_in_source FROM runs ORDER BY ALL"
    first = query(index_settings, sql)
    process_and_publish(s3_store, index_settings, data)
    assert query(index_settings, sql) == first
    assert len(first) == 6

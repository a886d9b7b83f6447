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


def file_bytes(times: tuple[str, ...] = (T1, T2), curated: bool = True) -> bytes:
    """A curated B200 run (unless `curated` is false) and an RTX 2080 Ti case measured at each
    of `times` (the earlier superseded: a settled row), each with its torch baseline."""
    # group_norm backward at 2048 channels: liger, then huggingface
    header, rows = liger_rows([1836, 1843])
    gpu, timestamp, median = (header.index(c) for c in ("gpu_name", "timestamp", "y_value_50"))
    out = [list(r) for r in rows] if curated else []
    for when in times:
        for r in rows:
            moved = list(r)
            moved[gpu], moved[timestamp] = NEW_GPU, when
            moved[median] = repr(float(moved[median]) + {T1: 0.0, T2: 0.5}[when])
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
    counts = load_current(s3_store, index_settings).version.counts
    assert (counts["runs"], counts["superseded"]) == (6, 2)
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

    # The same state as one processing with the grown curation, in a home of its own.
    other_store = s3_store.with_bucket(s3_store.bucket + "-b")
    other_store.ensure_bucket()
    other = index_settings.replace(
        home=Path(index_settings.home).parent / "at-once", bucket=other_store.bucket
    )
    process_and_publish(other_store, other, data)
    assert query(index_settings, STATE) == query(other, STATE)
    for view in ("latest_runs", "speedups", "version_changes", "cohorts"):
        assert query(index_settings, f"SELECT count(*) FROM {view}") == query(
            other, f"SELECT count(*) FROM {view}"
        ), view

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


STATE = (
    "SELECT run_digest, superseded_by, retracted_in_source, head_of_version, live "
    "FROM run_segments ORDER BY ALL"
)


def test_a_run_superseded_by_a_stale_run_is_superseded_by_its_curated_form(
    s3_store: Any, index_settings: Any, curation: Path
) -> None:
    """a.csv measured a case at T1, b.csv again at T2, both on the uncurated GPU: b's runs
    superseded a's. Only b is processed again after the curation grew: its uncurated runs
    leave, and its curated ones (the same series: the GPU as the file names it) supersede a's,
    as in a home where b came after the curation grew."""
    a, b = file_bytes((T1,), curated=False), file_bytes((T2,), curated=False)
    process_and_publish(s3_store, index_settings, a, "incoming/a.csv")
    process_and_publish(s3_store, index_settings, b, "incoming/b.csv")
    superseded = "SELECT count(*) FROM runs WHERE superseded_by IS NOT NULL"
    assert query(index_settings, superseded) == [(2,)]
    shrink = add_new_gpu(curation)
    process_and_publish(s3_store, index_settings, b, "incoming/b.csv")
    rows = query(
        index_settings,
        """SELECT r.architecture, s.architecture, r.live FROM run_segments r
           LEFT JOIN runs s ON s.run_digest = r.superseded_by ORDER BY ALL""",
    )
    assert rows == [("sm_75", None, True)] * 2 + [("unspecified", "sm_75", False)] * 2

    other_store = s3_store.with_bucket(s3_store.bucket + "-c")
    other_store.ensure_bucket()
    other = index_settings.replace(
        home=Path(index_settings.home).parent / "in-order", bucket=other_store.bucket
    )
    (curation / "gpus.yaml").write_text(shrink)
    process_and_publish(other_store, other, a, "incoming/a.csv")
    add_new_gpu(curation)
    process_and_publish(other_store, other, b, "incoming/b.csv")
    assert query(index_settings, STATE) == query(other, STATE)


def test_a_run_only_an_older_version_still_holds_is_retracted(
    s3_store: Any, index_settings: Any, curation: Path
) -> None:
    """The key's first version and its newest hold the same uncurated runs. The backfill
    processes the newest again only: the runs stay (the first version's current record set
    holds them) but the newest no longer does: they are retracted_in_source."""
    process_and_publish(s3_store, index_settings, file_bytes((T1,), curated=False))
    process_and_publish(s3_store, index_settings, file_bytes((T1,)))
    add_new_gpu(curation)
    process_and_publish(s3_store, index_settings, file_bytes((T1,)))
    rows = query(
        index_settings,
        "SELECT architecture, retracted_in_source, superseded_by IS NULL FROM runs ORDER BY ALL",
    )
    assert rows == [
        ("sm_100", False, True),
        ("sm_100", False, True),
        ("sm_75", False, True),
        ("sm_75", False, True),
        ("unspecified", True, True),
        ("unspecified", True, True),
    ]


def test_a_rebuilt_index_holds_the_current_record_sets_runs_only(
    s3_store: Any, index_settings: Any, curation: Path
) -> None:
    """A home whose catalog is lost rebuilds the index from every record set in one publish,
    both of a re-processed file's among them: the runs are those of the index it replaces."""
    data = file_bytes()
    process_and_publish(s3_store, index_settings, data)
    add_new_gpu(curation)
    process_and_publish(s3_store, index_settings, data)
    reprocessed = query(index_settings, STATE)
    (Path(index_settings.home) / "catalog.db").unlink()
    publish_index(s3_store, index_settings)
    assert query(index_settings, STATE) == reprocessed
    assert query(index_settings, f"SELECT count(*) FROM runs WHERE {UNCURATED}") == [(0,)]


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

"""The harness formats together: each sample is read by its own source and no other, hostile JSON
is a clear quarantine row that never costs the rest of a file, and every sample file of every
format goes through the real ingest (SeaweedFS, the Iceberg index) to runs and quarantine rows."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from index_support import csv_bytes, index_settings, liger_rows, query

from pipelines.ingest import ingest_paths
from pipelines.intake.reconcile import reconcile
from pipelines.sources import (
    SOURCES,
    SourceContext,
    current_parser_versions,
    normalize_object,
    source_of,
)
from pipelines.sources.json_input import JsonInputError, read_lines, unpacked
from pipelines.storage.s3 import S3Store

__all__ = ["index_settings"]

FORMATS = Path(__file__).parents[1] / "data" / "formats"
CONTEXT = SourceContext(received_at="2026-01-01T00:00:00Z")

# Every shared sample file and the source that must read it.
SAMPLES: dict[str, str] = {
    "flashinfer-trace/gemm_n128_k2048.traces.jsonl": "flashinfer-trace",
    "flashinfer-trace/gemm_n128_k2048.definition.json": "flashinfer-trace",
    "flashinfer-trace/gpt-5_gemm_n128_k2048_cuda_optimized_r8_c0_high.solution.json": (
        "flashinfer-trace"
    ),
    "nvbench/test_ref.json": "nvbench-json",
    "google-benchmark/gbench_test1_run1.json": "google-benchmark-json",
    "google-benchmark/github-action-benchmark_googlecpp_output.json": "google-benchmark-json",
    "kernelbench/H100_Modal_baseline_time_torch.json": "kernelbench-timing",
    "pytorch-v3/add_loop_eager.json": "pytorch-benchmark-v3",
    "pytorch-v3/add_loop_inductor_dynamic_gpu.json": "pytorch-benchmark-v3",
    "pytorch-v3/json-each-row.json": "pytorch-benchmark-v3",
    "tritonbench/SYNTHETIC_nightly_result.json": "tritonbench-json",
    # earlier layouts of each format (tests/data/formats/NOTICE.md)
    "kernelbench/L4_GCP_baseline_time_torch_compile_inductor_max-autotune.json": (
        "kernelbench-timing"
    ),
    "kernelbench/tk_baseline_time.json": "kernelbench-timing",
    "kernelbench/L40S_babel_level5_baseline_time_torch_compile_inductor_max-autotune.json": (
        "kernelbench-timing"
    ),
    "kernelbench/A6000_babel_new_baseline_time_torch.json": "kernelbench-timing",
    "nvbench/nvbench.example.exec_tag_sync.2021-12.json": "nvbench-json",
    "nvbench/test.2021-03-layout.excerpt.json": "nvbench-json",
    "pytorch-v3/helion_h100_results.json": "pytorch-benchmark-v3",
    "pytorch-v3/add_loop_eager.2024-11-tuples.json": "pytorch-benchmark-v3",
    "flashinfer-trace/gemm_n_4096_k_4096.2025-08.traces.excerpt.jsonl": "flashinfer-trace",
    "flashinfer-trace/gemm_n_4096_k_4096.2025-08.definition.json": "flashinfer-trace",
    "flashinfer-trace/gemm_m_dynamic_n_4096_k_4096.2025-07.traces.excerpt.jsonl": (
        "flashinfer-trace"
    ),
    "flashinfer-trace/gemm_m_dynamic_n_4096_k_4096.2025-07.definition.json": "flashinfer-trace",
    "flashinfer-trace/rmsnorm.2025-07.definitions-list.json": "flashinfer-trace",
    "google-benchmark/gbench_test1_run1.before-v1.4.json": "google-benchmark-json",
    "google-benchmark/gbench_test3_run0.2018-run_type.json": "google-benchmark-json",
}

# A v3 sample that repeats the records of two others, and theirs (keys in incoming/).
V3_REPEATING = "incoming/json-each-row.json"
V3_REPEATED = ("incoming/add_loop_eager.json", "incoming/add_loop_inductor_dynamic_gpu.json")


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_each_sample_is_recognized_by_its_own_source_and_no_other(sample: str) -> None:
    data = (FORMATS / sample).read_bytes()
    recognizers = [s.name for s in SOURCES if s.recognize(f"incoming/{sample}", data) is None]
    assert recognizers == [SAMPLES[sample]]
    # by content: the key's name plays no part
    assert source_of("incoming/renamed.bin", data).name == SAMPLES[sample]
    assert source_of("incoming/renamed.json.gz", gzip.compress(data)).name == SAMPLES[sample]


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_every_record_of_a_sample_is_a_run_a_manifest_or_a_reason(sample: str) -> None:
    data = (FORMATS / sample).read_bytes()
    outcomes = list(normalize_object(sample, data, context=CONTEXT).outcomes)
    assert outcomes
    for outcome in outcomes:
        if outcome.status == "ok":
            assert outcome.records, outcome
        else:
            assert outcome.reason and outcome.detail, outcome
    again = list(normalize_object("elsewhere.json", data, context=CONTEXT).outcomes)
    assert [r.digest for o in again for r in o.records] == [
        r.digest for o in outcomes for r in o.records
    ]


def test_an_unrecognized_json_is_one_unrecognized_row_not_a_bundle() -> None:
    data = json.dumps({"results": [{"name": "x", "time": 1.0}]}).encode()
    (outcome,) = normalize_object("incoming/results.json", data).outcomes
    assert (outcome.status, outcome.reason) == ("quarantined", "unrecognized_format")
    assert "no source recognizes it" in (outcome.detail or "")
    # A JSON that claims to be a bundle is read as one, and its defects are a bundle's.
    claimed = json.dumps({"apiVersion": "kernelindex.dev/v1alpha1", "kind": "Nonsense"}).encode()
    assert source_of("incoming/x.json", claimed).name == "worker-bundle"
    reasons = {o.reason for o in normalize_object("incoming/x.json", claimed).outcomes}
    assert "unrecognized_format" not in reasons


def kernelbench(level: dict[str, Any]) -> bytes:
    return json.dumps({"level1": level}).encode()


def problem(mean: Any = 2.5) -> dict[str, Any]:
    return {"mean": mean, "std": 0.1, "min": 2.4, "max": 2.9, "num_trials": 100,
            "hardware": "NVIDIA H100 80GB HBM3", "device": "cuda:0"}  # fmt: skip


def outcomes_of(data: bytes) -> list[Any]:
    return list(normalize_object("incoming/hostile.json", data, context=CONTEXT).outcomes)


def test_nan_infinity_and_duplicate_keys_quarantine_their_record_alone() -> None:
    text = (
        '{"level1": {"1_a.py": ' + json.dumps(problem()) + ', "2_b.py": {"mean": NaN, "std": 0.1, '
        '"min": 1, "max": 2, "num_trials": 3, "hardware": "NVIDIA H100 80GB HBM3"}, '
        '"3_c.py": {"mean": Infinity, "min": 1, "max": 2, "hardware": "x"}, '
        '"4_d.py": {"mean": 1.0, "mean": 2.0, "min": 1, "max": 2, "hardware": "x"}}}'
    )
    outcomes = outcomes_of(text.encode())
    assert [o.status for o in outcomes] == ["ok", "quarantined", "quarantined", "quarantined"]
    assert [o.reason for o in outcomes[1:]] == [
        "non_finite_number",
        "non_finite_number",
        "duplicate_key",
    ]
    assert [o.pointer for o in outcomes] == ["/level1/1_a.py", "/level1/2_b.py",
                                             "/level1/3_c.py", "/level1/4_d.py"]  # fmt: skip
    assert all(o.raw for o in outcomes)


def test_a_byte_order_mark_is_dropped() -> None:
    plain = outcomes_of(kernelbench({"1_a.py": problem()}))
    marked = outcomes_of(b"\xef\xbb\xbf" + kernelbench({"1_a.py": problem()}))
    assert [o.run.digest for o in marked] == [o.run.digest for o in plain]


def test_ten_thousand_deep_nesting_is_one_clear_row() -> None:
    first = json.dumps(problem()).encode()
    deep = (
        b'{"level1": {"1_a.py": ' + first + b', "2_b.py": ' + b"[" * 10_000 + b"]" * 10_000 + b"}}"
    )
    (outcome,) = outcomes_of(deep)
    assert (outcome.status, outcome.reason) == ("quarantined", "too_deep")
    # a deep line in JSON Lines is that line's alone
    lines = list(read_lines(b'{"a": 1}\n' + b"[" * 10_000 + b"]" * 10_000 + b'\n{"b": 2}\n'))
    assert [(line.line, line.error.reason if line.error else None) for line in lines] == [
        (1, None),
        (2, "too_deep"),
        (3, None),
    ]


def test_a_gzip_bomb_is_refused_without_being_expanded() -> None:
    """A string of over 512 MiB, gzipped to well under a megabyte (as many gzip members, as
    `cat a.gz b.gz` makes): refused once the bound is passed."""
    first = json.dumps(problem()).encode()
    head = gzip.compress(b'{"level1": {"1_a.py": ' + first + b', "2_b.py": {"name": "')
    chunk = gzip.compress(b"a" * (8 << 20), 9)
    bomb = head + chunk * 70 + gzip.compress(b'"}}}')
    assert len(bomb) < 2 << 20
    with pytest.raises(JsonInputError) as refused:
        unpacked(bomb)
    assert refused.value.reason == "too_large"
    (outcome,) = outcomes_of(bomb)
    assert (outcome.status, outcome.reason) == ("quarantined", "too_large")


def test_every_member_of_a_gzip_file_is_read() -> None:
    members = gzip.compress(b'{"level1": {"1_a.py": ') + gzip.compress(
        json.dumps(problem()).encode() + b"}}"
    )
    assert unpacked(members) == b'{"level1": {"1_a.py": ' + json.dumps(problem()).encode() + b"}}"
    ((outcome,),) = [outcomes_of(members)]
    assert outcome.status == "ok"
    with pytest.raises(JsonInputError) as cut:
        unpacked(members[:-12])
    assert cut.value.reason == "json_syntax"


def test_a_line_longer_than_the_bound_is_that_line_alone() -> None:
    long_line = b'{"s": "' + b"a" * 2048 + b'"}'
    lines = list(read_lines(b'{"a": 1}\n' + long_line + b'\n{"b": 2}\n', max_line_bytes=1024))
    assert [line.error.reason if line.error else None for line in lines] == [
        None,
        "too_large",
        None,
    ]
    assert lines[1].text.startswith('{"s": "aaa')


def test_every_sample_of_every_format_lands_in_the_index(
    s3_store: Any, index_settings: Any, tmp_path: Path
) -> None:
    """All shared files in one ingest (the traces before their definition): each file's records
    are runs or quarantine rows with reasons, and nothing waits once the definition is in."""
    folder = tmp_path / "drop"
    folder.mkdir()
    paths = []
    for sample in sorted(SAMPLES):
        path = folder / Path(sample).name
        path.write_bytes((FORMATS / sample).read_bytes())
        paths.append(path)
    summary = ingest_paths(paths, index_settings, progress=False, store=s3_store)
    sources = Counter(f.source for f in summary.files if not f.reused)
    assert set(sources) == set(SAMPLES.values())
    by_source = dict(
        query(
            index_settings,
            "SELECT source, count(*) FROM runs JOIN first_reads USING (snapshot_digest) GROUP BY 1",
        )  # fmt: skip
    )
    # KernelBench: H100 250, L4 7 (243 failed), level_tk 6, level5 0 (14 failed), mean-only 198
    assert by_source["kernelbench-timing"] == 250 + 7 + 6 + 0 + 198
    assert by_source["flashinfer-trace"] == 25 + 6 + 5
    # json-each-row.json repeats the two records of add_loop_eager and _inductor_dynamic_gpu.
    # None has a timestamp, so each is observed when its file was received (its LastModified,
    # in seconds: docs/formats.md, Identity): a repeat received in the same second as the
    # record it repeats is that run, in another second a run of its own. The files go up on
    # threads, so a second may pass between two of them.
    received = dict(query(index_settings, "SELECT source_key, last_modified FROM snapshots"))
    apart = sum(received[key] != received[V3_REPEATING] for key in V3_REPEATED)
    assert by_source["pytorch-benchmark-v3"] == 1 + 1 + 3 - 2 + 107 + 1 + apart
    # Whenever they arrived, a repeat has the externalId of the record it repeats (and the
    # 2024-11 tuples measure add_loop_eager's case again, with another value).
    assert query(
        index_settings,
        "SELECT count(DISTINCT external_id) FROM runs JOIN first_reads USING (snapshot_digest) "
        "WHERE source = 'pytorch-benchmark-v3'",
    ) == [(1 + 1 + 3 - 2 + 107 + 1 - 1,)]
    assert query(
        index_settings, "SELECT count(*) FROM quarantine WHERE reason LIKE 'awaiting%'"
    ) == [(0,)]
    statuses = dict(
        query(
            index_settings,
            "SELECT status, count(*) FROM runs JOIN first_reads USING (snapshot_digest) "
            "WHERE source = 'flashinfer-trace' GROUP BY 1",
        )  # fmt: skip
    )
    assert statuses == {"passed": 22 + 6 + 3, "incorrect_numerical": 3 + 2}
    # the mean-only KernelBench file names no GPU; L4's level1 failed whole
    assert sorted(
        query(
            index_settings,
            "SELECT DISTINCT gpu, architecture FROM runs WHERE external_id LIKE 'level1/%'",
        )
    ) == [("NVIDIA H100 80GB HBM3", "sm_90"), ("unspecified", "unspecified")]
    failed = query(
        index_settings, "SELECT count(*) FROM quarantine WHERE reason = 'measurement_failed'"
    )
    assert failed == [(243 + 14 + 2,)]


def test_one_gpu_is_one_environment_whichever_source_saw_it() -> None:
    """KernelBench's "NVIDIA H100 80GB HBM3" and Liger's are one ExecutionEnvironment (one
    digest, one `gpu` name), so their runs share cohorts."""
    header, rows = liger_rows(range(2, 2449))
    h100 = [row for row in rows if row[header.index("gpu_name")] == "NVIDIA H100 80GB HBM3"][:1]
    liger = normalize_object("a.csv", csv_bytes(header, h100)).outcomes
    kernelbench = (FORMATS / "kernelbench" / "H100_Modal_baseline_time_torch.json").read_bytes()
    first = next(iter(normalize_object("b.json", kernelbench, context=CONTEXT).outcomes))
    liger_run = next(iter(liger))

    def environment(outcome: Any) -> str:
        return next(r.digest for r in outcome.records if r.kind == "ExecutionEnvironment")

    assert environment(first) == environment(liger_run)
    assert first.facts.gpu == liger_run.facts.gpu == "NVIDIA H100 80GB HBM3"


def test_traces_before_their_definition_end_with_the_same_runs(
    s3_store: Any, index_settings: Any, tmp_path: Path
) -> None:
    """Order independence: traces ingested alone wait (visibly, with a reason); the definition,
    ingested later in another call, resolves them to the runs one ingest of both gives."""
    traces = FORMATS / "flashinfer-trace" / "gemm_n128_k2048.traces.jsonl"
    definition = FORMATS / "flashinfer-trace" / "gemm_n128_k2048.definition.json"
    first = ingest_paths([traces], index_settings, progress=False, store=s3_store)
    assert first.files[0].quarantined_by_reason == {"awaiting_definition": 25}
    waiting = query(index_settings, "SELECT count(*), any_value(detail) FROM quarantine")
    assert waiting == [(25, "waits for definition gemm_n128_k2048")]
    assert query(index_settings, "SELECT count(*) FROM runs") == [(0,)]
    # Waiting is a state of its own, not a file that fell through: nothing is missing.
    assert reconcile(s3_store, index_settings, current_parser_versions()).missing_count == 0
    ingest_paths([definition], index_settings, progress=False, store=s3_store)
    assert query(index_settings, "SELECT count(*) FROM quarantine") == [(0,)]
    assert reconcile(s3_store, index_settings, current_parser_versions()).missing_count == 0
    later = sorted(r for (r,) in query(index_settings, "SELECT run_digest FROM runs"))
    assert len(later) == 25

    other_store = S3Store(
        s3_store.bucket + "-b",
        endpoint_url=s3_store.endpoint_url,
        credentials=s3_store.credentials,
        client=s3_store.client,
    )
    other_store.ensure_bucket()
    other = replace(index_settings, home=tmp_path / "other-home", bucket=other_store.bucket)
    ingest_paths([definition, traces], other, progress=False, store=other_store)
    together = sorted(r for (r,) in query(other, "SELECT run_digest FROM runs"))
    assert together == later


def test_a_file_of_many_runs_is_written_in_parts_and_indexed_whole(
    s3_store: Any, index_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past SPOOL_RUNS runs, a harness file's runs and lineage are spooled as Parquet parts as
    they come (flat memory); the index holds every run with its line, as from one table."""
    from pipelines.sources import source

    monkeypatch.setattr(source, "SPOOL_RUNS", 10)
    folder = FORMATS / "flashinfer-trace"
    paths = [folder / "gemm_n128_k2048.definition.json", folder / "gemm_n128_k2048.traces.jsonl"]
    summary = ingest_paths(paths, index_settings, progress=False, store=s3_store)
    assert [f.runs for f in summary.files] == [0, 25]
    written = [o.key for o in s3_store.list("records/") if "/runs-" in o.key]
    assert len(written) == 3  # 10 + 10 + 5
    lines = query(index_settings, "SELECT source_line FROM runs ORDER BY 1")
    assert [line for (line,) in lines] == list(range(1, 26))
    assert query(index_settings, "SELECT count(*) FROM lineage") == [(25,)]


# --- choosing a source: gzip once, errors that name the format ------------------------------


def test_a_gzipped_liger_csv_is_read_as_the_csv() -> None:
    data = csv_bytes(*liger_rows(range(2, 5)))
    plain = list(normalize_object("a.csv", data).outcomes)
    packed = normalize_object("a.csv.gz", gzip.compress(data))
    assert packed.source == "liger-csv"
    assert [o.run.digest for o in packed.outcomes if o.run] == [
        o.run.digest for o in plain if o.run
    ]
    assert plain and all(o.status == "ok" for o in plain)


def test_a_gzip_file_that_cannot_be_unpacked_is_one_row_that_says_so() -> None:
    cut = gzip.compress(json.dumps({"level1": {"1_a.py": problem()}}).encode())[:-12]
    (outcome,) = normalize_object("x.json.gz", cut).outcomes
    assert (outcome.status, outcome.reason) == ("quarantined", "json_syntax")
    assert "gzip" in (outcome.detail or "")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"level1": {"1_a.py": {"elapsed": 1.0}}},
         "KernelBench timing JSON: no problem with a mean or num_trials in any level"),
        ({"benchmarks": [{"name": "b", "states": []}]},
         "nvbench JSON: no devices with sm_version, nv/ summary tags nor nvbench version"),
        ([{"model": {"name": "m"}, "metric": {"name": "latency_ms"}}],
         "PyTorch OSS benchmark v3 records: no metric with benchmark_values"),
        ({"context": {"date": "2024-01-01"}, "benchmarks": [{"name": "BM", "real_time": 1}]},
         "Google Benchmark JSON: no context with num_cpus or library_build_type"),
    ],
)  # fmt: skip
def test_a_file_no_source_reads_names_the_closest_format(document: Any, message: str) -> None:
    (outcome,) = normalize_object("x.json", json.dumps(document).encode()).outcomes
    assert outcome.reason == "unrecognized_format"
    assert message in (outcome.detail or "")
    assert "Liger" not in (outcome.detail or "")


def test_a_csv_no_source_reads_is_named_a_liger_csv_that_lacks_columns() -> None:
    (outcome,) = normalize_object("x.csv", b"a,b\n1,2\n").outcomes
    assert "Liger benchmark CSV: header lacks Liger column(s)" in (outcome.detail or "")


def test_normalize_finds_a_definition_in_the_index_of_this_home(
    s3_store: Any, index_settings: Any, tmp_path: Path
) -> None:
    """`kindex normalize TRACES` after the definition was ingested: resolved from the index."""
    from pipelines.commands.normalize import definitions_of

    definition = FORMATS / "flashinfer-trace" / "gemm_n128_k2048.definition.json"
    traces = FORMATS / "flashinfer-trace" / "gemm_n128_k2048.traces.jsonl"
    ingest_paths([definition], index_settings, progress=False, store=s3_store)
    with definitions_of([traces]) as lookup:
        context = SourceContext(received_at="2026-01-01T00:00:00Z", manifest_named=lookup)
        outcomes = list(
            normalize_object(traces.name, traces.read_bytes(), context=context).outcomes
        )
    assert [o.status for o in outcomes] == ["ok"] * 25
    with definitions_of([traces], index=False) as lookup:
        context = SourceContext(received_at="2026-01-01T00:00:00Z", manifest_named=lookup)
        alone = list(normalize_object(traces.name, traces.read_bytes(), context=context).outcomes)
    assert {o.reason for o in alone} == {"awaiting_definition"}


def test_gzipped_files_of_every_source_land_as_their_plain_bytes_would(
    s3_store: Any, index_settings: Any, tmp_path: Path
) -> None:
    """A gzipped Liger CSV and a gzipped harness file through the real ingest: unpacked once
    where the source is chosen, their runs the plain files' runs."""
    liger = csv_bytes(*liger_rows(range(2, 12)))
    tk = (FORMATS / "kernelbench" / "tk_baseline_time.json").read_bytes()
    (tmp_path / "liger.csv.gz").write_bytes(gzip.compress(liger))
    (tmp_path / "tk.json.gz").write_bytes(gzip.compress(tk))
    paths = [tmp_path / "liger.csv.gz", tmp_path / "tk.json.gz"]
    summary = ingest_paths(paths, index_settings, progress=False, store=s3_store)
    assert sorted(f.source for f in summary.files) == ["kernelbench-timing", "liger-csv"]
    by_source = dict(
        query(
            index_settings,
            "SELECT source, count(*) FROM runs JOIN first_reads USING (snapshot_digest) GROUP BY 1",
        )  # fmt: skip
    )
    assert by_source == {"liger-csv": 10, "kernelbench-timing": 6}


def test_a_file_of_a_known_format_that_cannot_be_read_names_the_format() -> None:
    cut = json.dumps({"level1": {"1_a.py": problem(), "2_b.py": problem()}})[:-20].encode()
    (outcome,) = outcomes_of(cut)
    assert outcome.reason == "json_syntax"
    assert (outcome.detail or "").startswith("KernelBench timing JSON: ")


def test_the_corpus_script_fails_on_a_file_holding_results_that_yields_none(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    script = Path(__file__).parents[2] / "benchmarks" / "formats_corpus.py"
    (tmp_path / "tk.json").write_bytes(
        (FORMATS / "kernelbench" / "tk_baseline_time.json").read_bytes()
    )
    ok = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "tk.json\tkernelbench-timing\tlevel_tk\t6\t6\t-" in ok.stdout
    no_hardware = {k: v for k, v in problem().items() if k != "hardware"}
    (tmp_path / "lost.json").write_text(json.dumps({"level1": {"1_a.py": no_hardware}}))
    failed = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True
    )
    assert failed.returncode == 1
    assert "lost.json\tkernelbench-timing\tlevel1\t1\t0\tmissing_field 1\tFAIL" in failed.stdout

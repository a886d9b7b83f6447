"""Google Benchmark JSON (pipelines/sources/gbench): the real sample files (google/benchmark's
own test input, github-action-benchmark's), and a file in the shape of json_reporter.cc with
repetitions, aggregates, errors, skips, counters and a GPU in a custom context key."""

from __future__ import annotations

import collections
import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from pipelines.records import RowOutcome
from pipelines.sources import SourceContext, normalize_object, source_of
from pipelines.sources.gbench import GoogleBenchmarkJson

FORMATS = Path(__file__).parents[2] / "data" / "formats"
SAMPLES = FORMATS / "google-benchmark"
TEST1 = SAMPLES / "gbench_test1_run1.json"
GOOGLECPP = SAMPLES / "github-action-benchmark_googlecpp_output.json"
CONTEXT = SourceContext(received_at="2026-01-01T00:00:00Z")
SOURCE = GoogleBenchmarkJson.name


def outcomes_of(data: bytes, context: SourceContext = CONTEXT) -> list[RowOutcome]:
    result = normalize_object("any/key.json", data, context=context)
    assert result.source == SOURCE
    return list(result.outcomes)


def spec(outcome: RowOutcome, kind: str) -> dict[str, Any]:
    return next(r.manifest for r in outcome.records if r.kind == kind)["spec"]


def run_of(outcome: RowOutcome) -> dict[str, Any]:
    assert outcome.run is not None
    return outcome.run.manifest


def counts(outcomes: list[RowOutcome]) -> collections.Counter[tuple[str, str | None]]:
    return collections.Counter((o.status, o.reason) for o in outcomes)


def by_id(outcomes: list[RowOutcome]) -> dict[str, RowOutcome]:
    return {o.facts.external_id: o for o in outcomes if o.facts is not None}


def line_of(path: Path, name: str) -> int:
    """The line of the `{` that opens the row named `name`."""
    text = path.read_text()
    at = text.index(f'"name": "{name}"')
    return text.count("\n", 0, text.rindex("{", 0, at)) + 1


# --- the shared samples ---------------------------------------------------------------------


def test_test1_run1_every_row_is_a_run() -> None:
    outcomes = outcomes_of(TEST1.read_bytes())
    # 16 rows: 14 iteration rows, each a run; the BigO and RMS aggregates of MyComplexityTest
    # are one run (measurements only).
    assert counts(outcomes) == {("ok", None): 15}
    assert [o.pointer for o in outcomes] == [f"/benchmarks/{i}" for i in range(16) if i != 12]
    rows = by_id(outcomes)
    slow = rows["BM_NotBadTimeUnit"]
    assert slow.source_line == line_of(TEST1, "BM_NotBadTimeUnit")
    run = run_of(slow)["spec"]
    # real_time 0.4 s over 1000 iterations: the mean time of one.
    assert run["timing"] == {
        "primaryStatistic": "mean",
        "latencyNs": {"mean": 400_000_000},
        "samples": 1000,
    }
    assert run["measurements"] == [
        {
            "metric": "cpu_time",
            "unit": "ns",
            "statistic": "mean",
            "value": 500_000_000,
            "sampleCount": 1000,
        }
    ]
    assert run["observedAt"] == "2016-08-02T17:44:46.000Z"  # context.date, no offset: as UTC
    assert run["status"] == "passed"
    # No GPU in the context: a CPU benchmark.
    hardware = spec(slow, "ExecutionEnvironment")["hardware"]
    assert hardware == {"vendor": "none", "product": "no GPU", "architecture": "none"}
    protocol = spec(slow, "BenchmarkProtocol")
    assert protocol["harness"]["name"] == "google-benchmark"
    assert protocol["measurement"] == {"timer": "wall_clock", "primaryStatistic": "mean"}
    assert "release" in protocol["comparability"]["notes"]
    assert slow.facts is not None and slow.facts.median is None
    label = run_of(rows["BM_hasLabel"])["metadata"]["labels"]
    assert label == {"label": "a label"}

    complexity = rows["MyComplexityTest_BigO"]
    assert complexity.pointer == "/benchmarks/11"
    run = run_of(complexity)
    assert "timing" not in run["spec"]
    assert run["spec"]["measurements"] == [
        {
            "metric": "real_time",
            "unit": "ns",
            "statistic": "coefficient",
            "value": 6.478927528978978,
        },
        {
            "metric": "cpu_time",
            "unit": "ns",
            "statistic": "coefficient",
            "value": 4.2749856294592886,
        },
        {
            "metric": "fit_error",
            "unit": "fraction",
            "statistic": "rms",
            "value": 0.0045097802512472874,
        },
    ]
    assert run["metadata"]["labels"] == {"big_o": "N"}
    assert complexity.facts is not None and complexity.facts.metric == "real_time"


def test_googlecpp_output() -> None:
    outcomes = outcomes_of(GOOGLECPP.read_bytes())
    assert counts(outcomes) == {("ok", None): 2}
    first = outcomes[0]
    assert first.pointer == "/benchmarks/0"
    assert first.source_line == line_of(GOOGLECPP, "fib_10")
    run = run_of(first)["spec"]
    assert run["timing"]["latencyNs"] == {"mean": 215}  # 2.1498980114547953e+02 ns
    assert run["timing"]["samples"] == 3070566
    assert run["observedAt"] == "2019-11-29T21:26:59.000Z"
    assert run["sourceNative"]["externalId"] == "fib_10"
    assert first.facts is not None and first.facts.provider == "a.out"  # context.executable
    assert spec(first, "OperationSpec")["family"] == "fib-10"


def test_the_same_bytes_give_the_same_digests_and_gzip_reads_alike() -> None:
    for path in (TEST1, GOOGLECPP):
        data = path.read_bytes()
        first, again = outcomes_of(data), outcomes_of(data)
        assert [o.json_line() for o in again] == [o.json_line() for o in first]
        packed = outcomes_of(gzip.compress(data))
        assert [o.json_line() for o in packed] == [o.json_line() for o in first]
        assert [o.pointer for o in packed] == [o.pointer for o in first]


def test_other_formats_are_not_google_benchmark() -> None:
    others = [p for p in FORMATS.rglob("*") if p.is_file() and p.parent != SAMPLES]
    others += [
        Path(__file__).parents[2] / "data" / "liger" / "all_benchmark_data.csv",
        Path(__file__).parents[2] / "data" / "kernelindex" / "examples" / "benchmark-run.yaml",
    ]
    source = GoogleBenchmarkJson()
    for path in others:
        if path.suffix == ".md":
            continue
        assert source.recognize(path.name, path.read_bytes()) is not None, path
        assert source_of(path.name, path.read_bytes()).name != SOURCE, path
    bundle = b"apiVersion: kernelindex.dev/v1alpha1\nkind: BenchmarkRun\n"
    for data in (bundle, b'{"context": {}, "benchmarks": []}', b'{"a": 1}', b"[]", b""):
        assert source.recognize("x", data) is not None


# --- json_reporter.cc's other shapes ----------------------------------------------------------

CONTEXT_BLOCK = {
    "date": "2024-03-01T10:00:00+01:00",
    "host_name": "box",
    "executable": "/opt/bench/cuda_bench",
    "num_cpus": 16,
    "mhz_per_cpu": 3000,
    "cpu_scaling_enabled": False,
    "caches": [{"type": "Data", "level": 1, "size": 32768, "num_sharing": 2}],
    "load_avg": [0.1, 0.2, 0.3],
    "library_version": "v1.8.3",
    "library_build_type": "release",
    "json_schema_version": 1,
    "gpu_name": "NVIDIA H100 80GB HBM3",
}
NAME = "BM_copy<float>/64/repeats:2/manual_time"


def _row(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "run_name": name, "run_type": "iteration", "threads": 1, **fields}


def _aggregate(
    statistic: str, real: float, cpu: float, unit: str = "time", **more: Any
) -> dict[str, Any]:
    return {
        "name": f"{NAME}_{statistic}",
        "run_name": NAME,
        "run_type": "aggregate",
        "repetitions": 2,
        "threads": 1,
        "aggregate_name": statistic,
        "aggregate_unit": unit,
        "iterations": 2,
        "real_time": real,
        "cpu_time": cpu,
        "time_unit": "us",
        **more,
    }


ROWS: list[dict[str, Any]] = [
    _row(NAME, repetitions=2, repetition_index=0, iterations=100, real_time=1.5, cpu_time=2.0,
         time_unit="us", bytes_per_second=1.0e9),
    _row(NAME, repetitions=2, repetition_index=1, iterations=100, real_time=1.7, cpu_time=2.1,
         time_unit="us", bytes_per_second=1.1e9),
    _aggregate("mean", 1.6, 2.05, bytes_per_second=1.05e9),
    _aggregate("median", 1.6004, 2.05, bytes_per_second=1.05e9),
    _aggregate("stddev", 0.1414, 0.07, bytes_per_second=7.0e7),
    _aggregate("cv", 0.088, 0.034, "percentage", bytes_per_second=0.067),
    _row("BM_fail/8", repetitions=1, repetition_index=0, error_occurred=True,
         error_message="CUDA out of memory", iterations=0, real_time=0, cpu_time=0, time_unit="ns"),
    _row("BM_skip/8", repetitions=1, repetition_index=0, skipped=True, skip_message="needs sm_100",
         iterations=0, real_time=0, cpu_time=0, time_unit="ns"),
    _row("BM_gemm/m:128/n:256/threads:2", repetitions=1, repetition_index=0, threads=2,
         iterations=10, real_time=3.25, cpu_time=6.5, time_unit="ms", flops=1.2e12, label="tf32",
         allocs_per_iter=2.0, max_bytes_used=4096),
]  # fmt: skip


def _file(rows: list[dict[str, Any]], context: dict[str, Any] | None = None) -> bytes:
    return json.dumps({"context": context or CONTEXT_BLOCK, "benchmarks": rows}, indent=2).encode()


@pytest.fixture(scope="module")
def modern() -> list[RowOutcome]:
    return outcomes_of(_file(ROWS))


def test_repetitions_fold_into_one_run_read_from_the_median(modern: list[RowOutcome]) -> None:
    # 9 rows: 2 repetitions + 4 aggregates → 1 run; an error → a run; a skip → quarantined;
    # one plain row → a run.
    assert counts(modern) == {("ok", None): 3, ("quarantined", "skipped_state"): 1}
    assert [o.pointer for o in modern] == [
        "/benchmarks/3",
        "/benchmarks/6",
        "/benchmarks/7",
        "/benchmarks/8",
    ]
    copy_run = modern[0]
    run = run_of(copy_run)
    assert run["spec"]["sourceNative"]["externalId"] == NAME  # what every folded row carries
    assert run["spec"]["timing"] == {
        "primaryStatistic": "median",
        "latencyNs": {"median": 1600, "mean": 1600},  # 1.6004 us, 1.6 us
        "samples": 2,  # the two repetitions
    }
    measured = {(m["metric"], m["statistic"]): m for m in run["spec"]["measurements"]}
    assert (
        measured[("real_time", "stdev")]["value"] == 141
        and measured[("real_time", "stdev")]["unit"] == "ns"
    )
    assert measured[("real_time", "cv")] == {
        "metric": "real_time",
        "unit": "fraction",
        "statistic": "cv",
        "value": 0.088,
        "sampleCount": 2,
    }
    assert measured[("cpu_time", "median")]["value"] == 2050
    assert measured[("bytes_per_second", "mean")]["unit"] == "bytes_per_second"
    assert measured[("bytes_per_second", "cv")]["unit"] == "fraction"
    assert ("real_time", "median") not in measured  # it is the latency, not a measurement too
    protocol = spec(copy_run, "BenchmarkProtocol")
    assert protocol["measurement"] == {"timer": "manual", "primaryStatistic": "median"}
    assert protocol["harness"]["version"] == "v1.8.3"
    assert spec(copy_run, "WorkloadCase")["axes"] == {"arg0": 64}
    assert run["spec"]["observedAt"] == "2024-03-01T09:00:00.000Z"  # +01:00 → UTC
    hardware = spec(copy_run, "ExecutionEnvironment")["hardware"]
    assert (hardware["product"], hardware["architecture"]) == ("NVIDIA H100", "sm_90")
    assert copy_run.facts is not None and copy_run.facts.median == 1600
    assert copy_run.facts.provider == "cuda_bench"


def test_an_error_is_a_failed_run_and_a_skip_is_quarantined(modern: list[RowOutcome]) -> None:
    failed = run_of(modern[1])
    assert failed["spec"]["status"] == "runtime_error"
    assert "timing" not in failed["spec"] and "measurements" not in failed["spec"]
    assert failed["metadata"]["labels"] == {"error_message": "CUDA out of memory"}
    skipped = modern[2]
    assert (skipped.reason, skipped.detail) == ("skipped_state", "needs sm_100")
    assert json.loads(skipped.raw)["name"] == "BM_skip/8"


def test_named_arguments_threads_counters_and_memory(modern: list[RowOutcome]) -> None:
    gemm = modern[3]
    assert spec(gemm, "WorkloadCase")["axes"] == {"m": 128, "n": 256, "threads": 2}
    run = run_of(gemm)
    assert run["spec"]["timing"]["latencyNs"] == {"mean": 3_250_000}
    measured = {m["metric"]: m for m in run["spec"]["measurements"]}
    assert measured["flops"] == {
        "metric": "flops",
        "unit": "unspecified",
        "statistic": "value",
        "value": 1.2e12,
    }
    assert measured["allocations"]["statistic"] == "mean"
    assert measured["memory_used"] == {
        "metric": "memory_used",
        "unit": "bytes",
        "statistic": "maximum",
        "value": 4096,
    }
    assert run["metadata"]["labels"] == {"label": "tf32"}


def test_iteration_rows_without_aggregates_are_each_a_run() -> None:
    rows = [r for r in ROWS[:2]]
    outcomes = outcomes_of(_file(rows))
    assert counts(outcomes) == {("ok", None): 2}
    ids = [o.facts.external_id for o in outcomes if o.facts is not None]
    assert ids == [f"{NAME}#repetition:0", f"{NAME}#repetition:1"]
    assert [run_of(o)["spec"]["timing"]["latencyNs"] for o in outcomes] == [
        {"mean": 1500},
        {"mean": 1700},
    ]


def test_a_file_without_a_date_takes_the_received_time() -> None:
    context = {k: v for k, v in CONTEXT_BLOCK.items() if k not in ("date", "gpu_name")}
    outcomes = outcomes_of(_file(ROWS[-1:], context))
    assert run_of(outcomes[0])["spec"]["observedAt"] == "2026-01-01T00:00:00.000Z"
    hardware = spec(outcomes[0], "ExecutionEnvironment")["hardware"]
    assert hardware["product"] == "no GPU"
    none = outcomes_of(_file(ROWS[-1:], context), SourceContext())
    assert [(o.status, o.reason) for o in none] == [("quarantined", "missing_field")]


def test_digests_do_not_depend_on_order(modern: list[RowOutcome]) -> None:
    reordered = outcomes_of(_file(list(reversed(copy.deepcopy(ROWS)))))
    assert {o.run.digest for o in reordered if o.run} == {o.run.digest for o in modern if o.run}


# --- hostile input --------------------------------------------------------------------------


def test_one_bad_row_is_quarantined_and_its_neighbours_land() -> None:
    good = json.dumps(ROWS[-1])
    rows = [
        good,
        good.replace('"real_time": 3.25', '"real_time": NaN').replace("threads:2", "threads:3"),
        good.replace('"iterations": 10', '"iterations": 10, "iterations": 11').replace(
            "threads:2", "threads:4"
        ),
        good.replace('"real_time": 3.25', '"real_time": "fast"').replace("threads:2", "threads:5"),
        good.replace('"name": "BM_gemm/m:128/n:256/threads:2", ', ""),
        good.replace('"time_unit": "ms"', '"time_unit": "fortnights"').replace(
            "threads:2", "threads:6"
        ),
        good,  # the same run twice
        good.replace("threads:2", "threads:7"),
    ]
    text = (
        '{\n"context": '
        + json.dumps(CONTEXT_BLOCK)
        + ',\n"benchmarks": [\n'
        + ",\n".join(rows)
        + "\n]}\n"
    )
    outcomes = outcomes_of(text.encode())
    assert [(o.status, o.reason) for o in outcomes] == [
        ("ok", None),
        ("quarantined", "non_finite_number"),
        ("quarantined", "duplicate_key"),
        ("quarantined", "bad_value"),
        ("quarantined", "missing_field"),
        ("quarantined", "unknown_unit"),
        ("quarantined", "duplicate_external_id"),
        ("ok", None),
    ]
    assert [o.pointer for o in outcomes] == [f"/benchmarks/{i}" for i in range(8)]
    assert [o.source_line for o in outcomes] == list(range(4, 12))
    assert "NaN" in outcomes[1].raw and "threads:3" in outcomes[1].raw
    assert "fast" in (outcomes[3].detail or "")
    assert spec(outcomes[7], "WorkloadCase")["axes"]["threads"] == 7


def test_deep_nesting_is_one_clear_quarantine_row() -> None:
    data = b'{"context": {"num_cpus": 4}, "benchmarks": ' + b"[" * 10_000
    assert GoogleBenchmarkJson().recognize("x", data) is None
    outcomes = outcomes_of(data)
    assert [(o.status, o.reason) for o in outcomes] == [("quarantined", "too_deep")]
    plain = list(GoogleBenchmarkJson().outcomes(b"[" * 10_000, CONTEXT))
    assert [(o.status, o.reason) for o in plain] == [("quarantined", "too_deep")]


# --- earlier versions ---------------------------------------------------------------------

BEFORE_1_4 = SAMPLES / "gbench_test1_run1.before-v1.4.json"
RUN_TYPE_2018 = SAMPLES / "gbench_test3_run0.2018-run_type.json"


def test_a_file_before_run_type_is_one_run_per_row() -> None:
    document = json.loads(BEFORE_1_4.read_text())
    outcomes = outcomes_of(BEFORE_1_4.read_bytes())
    rows = document["benchmarks"]
    assert [o.status for o in outcomes] == ["ok"] * len(rows)
    for outcome, row in zip(outcomes, rows, strict=True):
        assert outcome.facts is not None
        assert outcome.facts.external_id == row["name"]
        # real_time: the mean time of one iteration, in the row's time unit
        assert outcome.facts.extra["mean"] == row["real_time"]
        assert outcome.facts.extra["samples"] == row["iterations"]
        assert outcome.facts.gpu == "no GPU"


def test_repetitions_written_as_rows_of_one_name_are_runs_not_duplicates() -> None:
    rows = json.loads(RUN_TYPE_2018.read_text())["benchmarks"]
    outcomes = outcomes_of(RUN_TYPE_2018.read_bytes())
    by_id = {o.facts.external_id: o for o in outcomes if o.facts is not None}
    repeated = [r for r in rows if r["name"] == "BM_Two"]
    assert len(repeated) == 2
    for k, row in enumerate(repeated):
        facts = by_id[f"BM_Two#repetition:{k}"].facts
        assert facts is not None and facts.extra["mean"] == row["real_time"]
    # an aggregate row that names no statistic keeps its numbers under none
    one = by_id["BM_One"]
    measured = spec(one, "BenchmarkRun")["measurements"]
    assert {(m["metric"], m["statistic"], m["value"]) for m in measured} == {
        ("real_time", "unspecified", 10), ("cpu_time", "unspecified", 100)}  # fmt: skip
    # two aggregates of one run name that name no statistic contradict: quarantined
    reasons = collections.Counter(o.reason for o in outcomes if o.status == "quarantined")
    assert reasons == {"duplicate_aggregate": 1}
    # and a repetition of their run name is not folded into them: it stays a run
    contradicted = {
        "context": {"date": "2018-09-01 10:00:00", "num_cpus": 4, "library_build_type": "release"},
        "benchmarks": [
            {"name": "short", "run_type": "aggregate", "real_time": 7, "time_unit": "ns"},
            {"name": "short", "run_type": "aggregate", "real_time": 4.5, "time_unit": "ns"},
            {"name": "short", "run_type": "iteration", "iterations": 1000, "real_time": 800,
             "time_unit": "ns"},
        ],
    }  # fmt: skip
    found = outcomes_of(json.dumps(contradicted).encode())
    assert [(o.status, o.reason) for o in found] == [
        ("quarantined", "duplicate_aggregate"), ("ok", None)]  # fmt: skip
    assert found[1].facts is not None and found[1].facts.extra["mean"] == 800


def test_an_aggregate_before_aggregate_name_takes_its_statistic_from_its_name() -> None:
    document = {
        "context": {"date": "2018-09-01 10:00:00", "num_cpus": 4, "library_build_type": "release"},
        "benchmarks": [
            {"name": "BM_a", "run_type": "iteration", "iterations": 10, "real_time": 4.0,
             "cpu_time": 4.0, "time_unit": "ns"},
            {"name": "BM_a", "run_type": "iteration", "iterations": 10, "real_time": 6.0,
             "cpu_time": 6.0, "time_unit": "ns"},
            {"name": "BM_a_mean", "run_type": "aggregate", "iterations": 2, "real_time": 5.0,
             "cpu_time": 5.0, "time_unit": "ns"},
            {"name": "BM_a_median", "run_type": "aggregate", "iterations": 2, "real_time": 5.0,
             "cpu_time": 5.0, "time_unit": "ns"},
        ],
    }  # fmt: skip
    (outcome,) = outcomes_of(json.dumps(document).encode())
    assert outcome.facts is not None
    assert (outcome.facts.median, outcome.facts.extra["mean"]) == (5, 5)
    assert outcome.facts.extra["samples"] == 2  # the two repetitions, folded

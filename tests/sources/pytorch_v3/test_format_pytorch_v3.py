"""PyTorch OSS benchmark v3 records (pytorch/test-infra): the real sample files, the metric-name
rule, what a record's runners, dependencies and upload metadata become, and hostile input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from pipelines.records import RowOutcome
from pipelines.sources import SourceContext, normalize_object, source_of
from pipelines.sources.measured import ObservationError
from pipelines.sources.pytorch_v3 import PyTorchBenchmarkV3, metric_of

FORMATS = Path(__file__).parents[2] / "data" / "formats"
SAMPLES = FORMATS / "pytorch-v3"
CONTEXT = SourceContext(received_at="2026-01-01T00:00:00Z")
SOURCE = "pytorch-benchmark-v3"

# Each sample file: (line, pointer, model name, instruction count, device's product).
EXPECTED: dict[str, list[tuple[int, str, str, int, str]]] = {
    "add_loop_eager.json": [(1, "/0", "add_loop_eager", 3086359081, "no GPU")],
    "add_loop_inductor_dynamic_gpu.json": [
        (1, "/0", "add_loop_inductor_dynamic_gpu", 40859830085, "unnamed cuda device")
    ],
    "json-each-row.json": [
        (1, "", "add_loop_eager", 3086359081, "no GPU"),
        (2, "", "add_loop_eager_dynamic", 5712213247, "no GPU"),
        (3, "/0", "add_loop_inductor_dynamic_gpu", 40859830085, "unnamed cuda device"),
    ],
}


def outcomes_of(data: bytes, context: SourceContext = CONTEXT) -> list[RowOutcome]:
    result = normalize_object("incoming/results.json", data, context=context)
    assert result.source == SOURCE
    return list(result.outcomes)


def specs(outcome: RowOutcome) -> dict[str, dict[str, Any]]:
    return {r.kind: r.manifest for r in outcome.records}


def digests(outcomes: list[RowOutcome]) -> list[str]:
    return [r.digest for o in outcomes for r in o.records]


@pytest.mark.parametrize("sample", sorted(EXPECTED))
def test_every_sample_record_is_a_run_with_its_instruction_count(sample: str) -> None:
    data = (SAMPLES / sample).read_bytes()
    outcomes = outcomes_of(data)
    assert [o.status for o in outcomes] == ["ok"] * len(EXPECTED[sample])
    for outcome, (line, pointer, model, count, product) in zip(
        outcomes, EXPECTED[sample], strict=True
    ):
        assert (outcome.source_line, outcome.pointer) == (line, pointer)
        manifests = specs(outcome)
        run = manifests["BenchmarkRun"]["spec"]
        # The unit is in the name: a count, with no statistic stated; not a latency.
        assert "timing" not in run
        assert run["measurements"] == [
            {
                "metric": "compile_time_instruction_count",
                "unit": "count",
                "statistic": "unspecified",
                "value": count,
            }
        ]
        assert run["observedAt"] == "2026-01-01T00:00:00.000Z"  # no timestamp: receipt time
        assert run["sourceNative"]["source"] == SOURCE
        assert run["sourceNative"]["benchmark"] == "pr_time_benchmarks"
        assert manifests["OperationSpec"]["metadata"]["name"] == model
        assert manifests["OperationSpec"]["metadata"]["description"] == "a loop over 100 add node"
        hardware = manifests["ExecutionEnvironment"]["spec"]["hardware"]
        assert hardware["product"] == product
        assert outcome.facts is not None
        assert (outcome.facts.metric, outcome.facts.unit) == (
            "compile_time_instruction_count",
            "count",
        )
        assert json.loads(outcome.raw)["model"]["name"] == model


def test_a_cuda_record_without_runners_names_no_gpu_model() -> None:
    data = (SAMPLES / "add_loop_inductor_dynamic_gpu.json").read_bytes()
    (outcome,) = outcomes_of(data)
    environment = specs(outcome)["ExecutionEnvironment"]
    assert environment["spec"]["hardware"] == {
        "vendor": "unspecified",
        "product": "unnamed cuda device",
        "architecture": "unspecified",
    }
    assert environment["metadata"]["labels"] == {"curation": "uncurated", "uncurated": "gpu"}
    run = specs(outcome)["BenchmarkRun"]
    assert run["metadata"]["labels"] == {
        "is_dynamic": "true",
        "device": "cuda",
        "curation": "uncurated",
        "uncurated": "gpu",
    }
    assert specs(outcome)["ImplementationRevision"]["metadata"]["labels"] == {
        "provider": "inductor"
    }


def test_one_record_is_one_run_whichever_layout_holds_it() -> None:
    array = outcomes_of((SAMPLES / "add_loop_eager.json").read_bytes())
    lines = outcomes_of((SAMPLES / "json-each-row.json").read_bytes())
    gpu = outcomes_of((SAMPLES / "add_loop_inductor_dynamic_gpu.json").read_bytes())
    assert digests(array) == digests(lines[:1])
    assert digests(gpu) == digests(lines[2:])
    # one object, not in an array
    record = json.loads((SAMPLES / "add_loop_eager.json").read_bytes())[0]
    single = outcomes_of(json.dumps(record, indent=2).encode())
    assert digests(single) == digests(array)
    assert single[0].pointer == ""


@pytest.mark.parametrize("sample", sorted(EXPECTED))
def test_same_bytes_and_their_gzip_give_the_same_runs(sample: str) -> None:
    data = (SAMPLES / sample).read_bytes()
    first, again = outcomes_of(data), outcomes_of(data)
    zipped = outcomes_of(gzip.compress(data))
    assert digests(first) == digests(again) == digests(zipped)
    assert [(o.source_line, o.pointer, o.status) for o in zipped] == [
        (o.source_line, o.pointer, o.status) for o in first
    ]
    elsewhere = normalize_object("other/name.bin", data, context=CONTEXT)
    assert digests(list(elsewhere.outcomes)) == digests(first)


def test_other_formats_are_not_v3_records() -> None:
    reader = PyTorchBenchmarkV3()
    for path in FORMATS.glob("*/*"):
        if path.parent.name == "pytorch-v3":
            continue
        data = path.read_bytes()
        assert reader.recognize("x.json", data) is not None, path
        assert source_of("x.json", data).name != SOURCE, path
    others = [
        b"kernel_name,kernel_provider,metric_name\nrms_norm,liger,speed\n",
        json.dumps({"apiVersion": "kernelindex.dev/v1alpha1", "kind": "BenchmarkRun"}).encode(),
        json.dumps({"results": [{"name": "x", "time": 1.0}]}).encode(),
        json.dumps([{"metric": {"name": "x"}}]).encode(),
        b"",
    ]
    for data in others:
        assert reader.recognize("x.json", data) is not None
    assert (
        reader.recognize("x", (SAMPLES / "schema.sql").read_bytes()) is not None
    )  # the table, not records


# --- the metric-name rule --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "extra", "metric", "unit", "statistic"),
    [
        ("latency_ms", {}, "latency", "ms", None),
        ("median_latency(ms)", {}, "latency", "ms", "median"),
        ("p50_latency_us", {}, "latency", "us", "median"),
        ("p99_latency_ms", {}, "latency", "ms", "p99"),
        ("avg_latency_ns", {}, "latency", "ns", "mean"),
        ("tokens_per_second", {}, "tokens_per_second", "per_second", None),
        ("compile_time_instruction_count", {}, "compile_time_instruction_count", "count", None),
        ("memory_bandwidth(GB/s)", {}, "memory_bandwidth", "gb_per_s", None),
        ("speedup", {}, "speedup", "x", None),
        ("compilation_time(s)", {}, "compilation_time", "s", None),
        ("peak_memory_gb", {}, "peak_memory", "gb", None),
        ("tflops-avg", {}, "tflops", "tflops", "mean"),
        ("latency", {"unit": "ms", "aggregation": "p50"}, "latency", "ms", "median"),
    ],
)
def test_the_metric_name_gives_its_unit_and_statistic(
    name: str, extra: dict[str, str], metric: str, unit: str, statistic: str | None
) -> None:
    named = metric_of(name, extra)
    assert (named.metric, named.unit, named.statistic) == (metric, unit, statistic)


@pytest.mark.parametrize("name", ["latency", "accuracy", "pass", "throughput"])
def test_a_metric_whose_name_states_no_unit_is_never_guessed(name: str) -> None:
    with pytest.raises(ObservationError) as caught:
        metric_of(name, {"aggregation": "p50"})
    assert caught.value.reason == "unknown_metric_unit"


# --- what a full record says -----------------------------------------------------------------

SHA = "0123456789abcdef0123456789abcdef01234567"


def record(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "benchmark": {
            "name": "vllm benchmark",
            "mode": "inference",
            "dtype": "bfloat16",
            "extra_info": {"tensor_parallel_size": 1, "use_cuda_graph": True},
        },
        "model": {"name": "meta-llama/Llama-3.1-8B", "type": "llm", "backend": "vllm"},
        "metric": {"name": "median_latency(ms)", "benchmark_values": [1.2345678]},
        "runners": [
            {
                "name": "gcp-h100-runner-1",
                "type": "linux.aws.h100",
                "gpu_info": "NVIDIA H100 80GB HBM3",
                "gpu_count": 1,
                "extra_info": {"cuda_version": "12.8"},
            }
        ],
        "dependencies": {
            "pytorch": {
                "repo": "pytorch/pytorch",
                "branch": "main",
                "sha": SHA,
                "version": "2.9.0",
            },
            "vllm": {
                "repo": "vllm-project/vllm",
                "branch": "main",
                "sha": SHA,
                "version": "0.10.1",
            },
            "triton": {"repo": "triton-lang/triton", "branch": "main", "sha": SHA},
        },
        "timestamp": 1754038800,
        "repo": "vllm-project/vllm",
        "head_sha": SHA,
    }
    for key, value in changes.items():
        base[key] = value
    return base


def test_a_record_with_runners_dependencies_and_upload_metadata() -> None:
    (outcome,) = outcomes_of(json.dumps([record()]).encode())
    assert outcome.status == "ok", outcome.detail
    manifests = specs(outcome)
    run = manifests["BenchmarkRun"]["spec"]
    assert run["timing"] == {"primaryStatistic": "median", "latencyNs": {"median": 1234568}}
    assert run["observedAt"] == "2025-08-01T09:00:00.000Z"
    assert manifests["BenchmarkRun"]["metadata"]["labels"] == {
        "mode": "inference",
        "use_cuda_graph": "true",
        "dtype": "bfloat16",
    }
    assert manifests["WorkloadCase"]["spec"]["axes"] == {"tensor_parallel_size": 1}
    environment = manifests["ExecutionEnvironment"]["spec"]
    assert environment["hardware"] == {
        "vendor": "nvidia",
        "product": "NVIDIA H100",
        "architecture": "sm_90",
        "formFactor": "80GB HBM3",
        "count": 1,
    }
    assert environment["software"] == {
        "cudaToolkit": "12.8",
        "framework": {"name": "pytorch", "version": "2.9.0"},
        "libraries": {"pytorch": "2.9.0", "triton_commit": SHA, "vllm": "0.10.1"},
    }
    assert manifests["SoftwareProject"]["spec"]["host"] == {
        "kind": "github",
        "id": "vllm-project/vllm",
    }
    revision = manifests["ImplementationRevision"]["spec"]["projectRevision"]
    assert revision == {
        "repository": "https://github.com/vllm-project/vllm",
        "commit": SHA,
        "version": "0.10.1",
    }
    protocol = manifests["BenchmarkProtocol"]["spec"]
    assert protocol["measurement"]["primaryStatistic"] == "median"
    assert protocol["comparability"]["family"] == "pytorch_v3_vllm_benchmark"


def test_several_values_of_an_unstated_statistic_are_samples() -> None:
    metric = {"name": "latency_ms", "benchmark_values": [1.0, 2.0, 6.0]}
    (outcome,) = outcomes_of(json.dumps(record(metric=metric)).encode())
    run = specs(outcome)["BenchmarkRun"]["spec"]
    assert "timing" not in run  # kindex states no latency statistic the file did not
    assert run["measurements"] == [
        {"metric": "latency", "unit": "ns", "statistic": s, "value": v, "sampleCount": 3}
        for s, v in (("minimum", 1e6), ("mean", 3e6), ("maximum", 6e6))
    ]


def test_several_values_of_a_stated_statistic_are_quarantined() -> None:
    metric = {"name": "median_latency(ms)", "benchmark_values": [1.0, 2.0]}
    (outcome,) = outcomes_of(json.dumps([record(metric=metric)]).encode())
    assert (outcome.status, outcome.reason, outcome.pointer) == (
        "quarantined",
        "ambiguous_values",
        "/0",
    )


def test_a_metric_without_a_unit_is_quarantined_and_its_neighbours_land() -> None:
    unknown = record(metric={"name": "latency", "benchmark_values": [0.01]})
    data = json.dumps([record(), unknown]).encode()
    ok, bad = outcomes_of(data)
    assert ok.status == "ok"
    assert (bad.status, bad.reason, bad.pointer) == (
        "quarantined",
        "unknown_metric_unit",
        "/1",
    )
    assert "'latency'" in (bad.detail or "")


def test_two_records_of_one_case_in_one_file() -> None:
    data = json.dumps([record(), record()]).encode()
    first, second = outcomes_of(data)
    assert first.status == "ok"
    assert (second.status, second.reason, second.pointer) == (
        "quarantined",
        "duplicate_external_id",
        "/1",
    )


def test_a_record_without_any_time_is_quarantined() -> None:
    plain = record()
    del plain["timestamp"]
    (outcome,) = outcomes_of(json.dumps(plain).encode(), SourceContext())
    assert (outcome.status, outcome.reason) == ("quarantined", "missing_field")


def test_a_repeated_record_without_a_time_is_one_run_per_second_received() -> None:
    """json-each-row.json repeats add_loop_eager.json's record, neither with a timestamp: in
    the same second received they are one run; a second apart, two runs of one externalId
    (docs/formats.md, Identity). Which it is in an ingest depends on when each file went up."""
    repeating = outcomes_of((SAMPLES / "json-each-row.json").read_bytes())[0]
    repeated = outcomes_of((SAMPLES / "add_loop_eager.json").read_bytes())
    assert digests([repeating]) == digests(repeated)
    apart = SourceContext(received_at="2026-01-01T00:00:01Z")
    (later,) = outcomes_of((SAMPLES / "add_loop_eager.json").read_bytes(), apart)
    assert later.run and repeating.run and later.run.digest != repeating.run.digest
    assert later.facts and repeating.facts
    assert later.facts.external_id == repeating.facts.external_id


# --- hostile input ---------------------------------------------------------------------------


def test_one_bad_record_is_quarantined_alone() -> None:
    good = json.dumps(record())
    other = json.dumps(record(model={"name": "other", "backend": "vllm"}))
    nan = json.dumps(record(metric={"name": "latency_ms", "benchmark_values": [float("nan")]}))
    duplicate = '{"metric": {"name": "latency_ms", "benchmark_values": [1]}, "metric": {}}'
    missing = json.dumps({"benchmark": {"name": "b"}, "model": {"name": "m"}})
    text_value = json.dumps(
        record(
            model={"name": "t", "backend": "b"},
            metric={"name": "latency_ms", "benchmark_values": ["fast"]},
        )
    )
    data = f"[{good},\n{nan},\n{duplicate},\n{missing},\n{text_value},\n{other}]".encode()
    outcomes = outcomes_of(data)
    summary = [(o.status, o.reason, o.pointer, o.source_line) for o in outcomes]
    assert summary == [
        ("ok", None, "/0", 1),
        ("quarantined", "non_finite_number", "/1", 2),
        ("quarantined", "duplicate_key", "/2", 3),
        ("quarantined", "missing_field", "/3", 4),
        ("quarantined", "bad_value", "/4", 5),
        ("ok", None, "/5", 6),
    ]
    assert "NaN" in outcomes[1].raw
    assert json.loads(outcomes[3].raw) == json.loads(missing)
    assert "'fast'" in (outcomes[4].detail or "")


def test_a_broken_json_line_is_quarantined_alone() -> None:
    lines = [
        json.dumps(record()),
        '{"metric": {"name": "latency_ms", "bench',
        json.dumps([record(model={"name": "m2"})]),
    ]
    outcomes = outcomes_of("\n".join(lines).encode())
    summary = [(o.status, o.reason, o.source_line, o.pointer) for o in outcomes]
    assert summary == [
        ("ok", None, 1, ""),
        ("quarantined", "json_syntax", 2, ""),
        ("ok", None, 3, "/0"),
    ]
    assert outcomes[1].raw.startswith('{"metric"')


def test_deep_nesting_is_one_clear_quarantine_row() -> None:
    head = b'[{"benchmark": {"name": "b"}, "model": {"name": "m"}, "metric": {"benchmark_values": '
    data = head + b"[" * 10_000 + b"]" * 10_000 + b"}}]"
    assert PyTorchBenchmarkV3().recognize("x", data) is None
    (outcome,) = outcomes_of(data)
    assert (outcome.status, outcome.reason) == ("quarantined", "too_deep")


@pytest.mark.parametrize(
    ("runners", "device", "product"),
    [
        ([{"name": "r", "gpu_info": ""}], "cuda", "unnamed cuda device"),
        ([{"name": "r", "cpu_info": "x86_64"}], None, "no GPU"),
        ([], None, "unspecified"),
        ([{"gpu_info": "NVIDIA B200"}], "cpu", "NVIDIA B200"),
    ],
)
def test_the_device_is_the_runners_gpu_else_the_stated_device(
    runners: list[dict[str, Any]], device: str | None, product: str
) -> None:
    benchmark: dict[str, Any] = {"name": "b", "extra_info": {}}
    if device:
        benchmark["extra_info"]["device"] = device
    (outcome,) = outcomes_of(json.dumps([record(runners=runners, benchmark=benchmark)]).encode())
    assert specs(outcome)["ExecutionEnvironment"]["spec"]["hardware"]["product"] == product


def test_a_zero_timestamp_is_no_time() -> None:
    (outcome,) = outcomes_of(json.dumps([record(timestamp=0)]).encode())
    assert specs(outcome)["BenchmarkRun"]["spec"]["observedAt"] == "2026-01-01T00:00:00.000Z"


# --- each producer's records -----------------------------------------------------------------

HELION = SAMPLES / "helion_h100_results.json"
TUPLES = SAMPLES / "add_loop_eager.2024-11-tuples.json"


def test_helion_values_are_one_run_per_input_each_a_ratio() -> None:
    records = json.loads(HELION.read_text())
    outcomes = outcomes_of(HELION.read_bytes())
    expected = [
        (i, r, index, value)
        for i, r in enumerate(records)
        for index, value in enumerate(r["metric"]["benchmark_values"])
    ]
    assert [o.status for o in outcomes] == ["ok"] * len(expected) and len(expected) == 107
    for outcome, (i, record, index, value) in zip(outcomes, expected, strict=True):
        facts = outcome.facts
        assert facts is not None and outcome.pointer == f"/{i}"
        # a speedup is a measurement in unit x, as written: never a latency
        assert (facts.metric, facts.unit) == (record["metric"]["name"], "x")
        spec = specs(outcome)["BenchmarkRun"]["spec"]
        assert "timing" not in spec
        assert spec["measurements"] == [
            {"metric": record["metric"]["name"], "unit": "x", "statistic": "unspecified",
             "value": value}
        ]  # fmt: skip
        assert facts.gpu == record["benchmark"]["extra_info"]["device"] == "NVIDIA H100"
        assert f"input_index{index}" in facts.case_key
        assert facts.external_id.endswith(f"[input_index={index}]")


def test_a_shape_names_each_input_and_a_zero_speedup_is_that_input_failed() -> None:
    record = {
        "benchmark": {"name": "Helion Benchmark", "extra_info": {"device": "NVIDIA B200"}},
        "model": {"name": "softmax"},
        "metric": {"name": "helion_speedup", "benchmark_values": [1.5, 0.0, 1.25]},
        "shape": ["(4096, 512)", "(4096, 1024)", "(4096, 2048)"],
    }
    outcomes = outcomes_of(json.dumps([record]).encode())
    assert [(o.status, o.reason) for o in outcomes] == [
        ("ok", None), ("quarantined", "measurement_failed"), ("ok", None)]  # fmt: skip
    assert outcomes[1].pointer == "/0/metric/benchmark_values/1"
    assert "input 1 (4096, 1024) failed" in (outcomes[1].detail or "")
    labels = specs(outcomes[2])["BenchmarkRun"]["metadata"]["labels"]
    assert labels["input_shape"] == "(4096, 2048)"


def test_the_first_uploads_tuples_as_arrays_read_by_the_tables_order() -> None:
    (record,) = json.loads(TUPLES.read_text())
    (outcome,) = outcomes_of(TUPLES.read_bytes())
    facts = outcome.facts
    assert facts is not None
    name, values = record["metric"]
    assert (facts.metric, facts.unit) == (name, "count")
    spec = specs(outcome)["BenchmarkRun"]["spec"]
    assert spec["measurements"][0]["value"] == values[0]
    assert facts.provider == record["model"][2] == "eager"
    assert facts.mode == "unspecified"  # benchmark.mode is "" in the tuple
    as_objects = {
        "benchmark": dict(
            zip(("name", "mode", "dtype", "extra_info"), record["benchmark"], strict=False)
        ),
        "model": dict(zip(("name", "type", "backend"), record["model"], strict=False)),
        "metric": dict(zip(("name", "benchmark_values"), record["metric"], strict=False)),
    }
    (same,) = outcomes_of(json.dumps([as_objects]).encode())
    assert same.run and outcome.run and same.run.digest == outcome.run.digest


def test_vllm_latency_is_in_seconds_as_its_benchmark_writes_it() -> None:
    record = {
        "benchmark": {"name": "vLLM benchmark", "extra_info": {"args": {"batch_size": 8}}},
        "model": {"name": "meta-llama/Llama-3.1-8B"},
        "metric": {"name": "latency", "benchmark_values": [1.25, 1.5]},
    }
    (outcome,) = outcomes_of(json.dumps([record]).encode())
    measurements = specs(outcome)["BenchmarkRun"]["spec"]["measurements"]
    assert {(m["statistic"], m["value"]) for m in measurements} == {
        ("minimum", 1.25e9), ("mean", 1.375e9), ("maximum", 1.5e9)}  # fmt: skip
    assert {m["unit"] for m in measurements} == {"ns"}
    other = {**record, "benchmark": {"name": "elsewhere"}}
    (unknown,) = outcomes_of(json.dumps([other]).encode())
    assert unknown.reason == "unknown_metric_unit"


@pytest.mark.parametrize(
    ("name", "benchmark", "expected"),
    [
        # torchao's llama generate.py (benchmark "TorchAO benchmark"): tokens/s, GB/s
        ("tok/s", "TorchAO benchmark", ("tok_per_second", "per_second", None)),
        ("mem/s", "TorchAO benchmark", ("mem_per_second", "gb_per_s", None)),
        ("img_s(avg)", "TorchAO benchmark", ("img_s", "per_second", "mean")),
        ("time_ms(avg)", "TorchAO benchmark", ("time", "ms", "mean")),
        # a slash rate is never seconds, whoever writes it
        ("tok/s", "elsewhere", ("tok_per_second", "per_second", None)),
        # ExecuTorch's names
        ("avg_inference_latency(ms)", "ExecuTorch", ("inference_latency", "ms", "mean")),
        ("token_per_sec", "ExecuTorch", ("token_per_sec", "per_second", None)),
        ("peak_inference_mem_usage(mb)", "ExecuTorch", ("peak_inference_mem_usage", "mb", None)),
    ],
)
def test_each_producers_metric_names(
    name: str, benchmark: str, expected: tuple[str, str, str | None]
) -> None:
    from pipelines.sources.pytorch_v3 import producer_of

    producer = producer_of({"benchmark": {"name": benchmark}})
    named = metric_of(name, {}, producer)
    assert (named.metric, named.unit, named.statistic) == expected


def test_a_torchao_record_as_its_generate_py_writes_it() -> None:
    record = {
        "benchmark": {"name": "TorchAO benchmark", "mode": "inference", "dtype": "int4wo-64",
                      "extra_info": {"device": "cuda", "arch": "NVIDIA H100 80GB HBM3"}},
        "model": {"name": "Llama-2-7b-chat-hf", "type": "model", "origins": ["pytorch"]},
        "metric": {"name": "tok/s", "benchmark_values": [182.5], "target_value": None},
    }  # fmt: skip
    (outcome,) = outcomes_of(json.dumps([record]).encode())
    assert outcome.facts is not None
    assert (outcome.facts.metric, outcome.facts.unit) == ("tok_per_second", "per_second")
    (measurement,) = specs(outcome)["BenchmarkRun"]["spec"]["measurements"]
    assert measurement["value"] == 182.5


def test_json_lines_whose_first_line_is_broken_keep_every_other_line() -> None:
    lines = (SAMPLES / "json-each-row.json").read_bytes()
    data = b'{"benchmark": {"name": "x"}, "metric": {"name": "a_ms", "benchmark_val\n' + lines
    assert source_of("x.json", data).name == SOURCE
    outcomes = outcomes_of(data)
    assert (outcomes[0].source_line, outcomes[0].reason) == (1, "json_syntax")
    plain = outcomes_of(lines)
    assert [o.source_line for o in outcomes[1:]] == [o.source_line + 1 for o in plain]
    assert [o.run.digest for o in outcomes[1:] if o.run] == [o.run.digest for o in plain if o.run]

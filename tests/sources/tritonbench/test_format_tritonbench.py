"""TritonBench `--output-json` (meta-pytorch/tritonbench): the nightly sample, a bare metric map,
aggregates that are not runs, hostile input, and what its v3 conversion becomes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from pipelines.records import RowOutcome
from pipelines.sources import SourceContext, normalize_object, source_of
from pipelines.sources.tritonbench import TritonBenchJson

FORMATS = Path(__file__).parents[2] / "data" / "formats"
SAMPLE = FORMATS / "tritonbench" / "SYNTHETIC_nightly_result.json"
CONTEXT = SourceContext(received_at="2026-01-01T00:00:00Z")
SOURCE = "tritonbench-json"
CASE = "tritonbench_gemm_fwd[x_(256, 256, 256)-{}]"
ATEN, TUTORIAL = CASE.format("aten_matmul"), CASE.format("triton_tutorial_matmul")
PYTORCH_SHA = "0123456789abcdef0123456789abcdef01234567"
TRITON_SHA = "89abcdef0123456789abcdef0123456789abcdef"
TRITONBENCH_SHA = "0efdc53db96523fa02f890015e81a4144eb7b369"


def outcomes_of(data: bytes, context: SourceContext = CONTEXT) -> list[RowOutcome]:
    result = normalize_object("incoming/result.json", data, context=context)
    assert result.source == SOURCE
    return list(result.outcomes)


def specs(outcome: RowOutcome) -> dict[str, dict[str, Any]]:
    return {r.kind: r.manifest for r in outcome.records}


def digests(outcomes: list[RowOutcome]) -> list[str]:
    return [r.digest for o in outcomes for r in o.records]


def pointer(key: str) -> str:
    return f"/metrics/{key}"


def test_the_nightly_sample_is_two_runs_and_five_aggregates() -> None:
    outcomes = outcomes_of(SAMPLE.read_bytes())
    summary = [(o.source_line, o.status, o.reason, o.pointer) for o in outcomes]
    assert summary == [
        (19, "quarantined", "aggregate_metric", pointer("tritonbench_gemm_fwd-pass")),
        (20, "ok", None, pointer(f"{ATEN}_latency")),
        (22, "ok", None, pointer(f"{TUTORIAL}_latency")),
        (
            25,
            "quarantined",
            "aggregate_metric",
            pointer("tritonbench_gemm_fwd[x_average-aten_matmul]_tflops"),
        ),
        (
            26,
            "quarantined",
            "aggregate_metric",
            pointer("tritonbench_gemm_fwd[aten_matmul]-tflops-avg"),
        ),
        (
            27,
            "quarantined",
            "aggregate_metric",
            pointer("tritonbench_gemm_fwd[triton_tutorial_matmul]-tflops-avg"),
        ),
        (
            28,
            "quarantined",
            "aggregate_metric",
            pointer("tritonbench_gemm_fwd[triton_tutorial_matmul]-speedup-avg"),
        ),
    ]
    assert json.loads(outcomes[0].raw) == {"tritonbench_gemm_fwd-pass": 1}


def test_a_run_folds_its_backends_metrics_with_latency_as_the_median() -> None:
    _, aten, tutorial, *_ = outcomes_of(SAMPLE.read_bytes())
    run = specs(aten)["BenchmarkRun"]
    assert run["spec"]["timing"] == {"primaryStatistic": "median", "latencyNs": {"median": 10208}}
    assert run["spec"]["measurements"] == [
        {"metric": "tflops", "unit": "tflops", "statistic": "derived", "value": 3.287}
    ]
    assert run["spec"]["observedAt"] == "2025-08-01T09:00:00.000Z"
    assert run["spec"]["sourceNative"] == {
        "source": "tritonbench",
        "benchmark": "gemm_fwd",
        "externalId": ATEN,
    }
    assert run["metadata"]["labels"] == {"mode": "fwd"}
    assert json.loads(aten.raw) == {f"{ATEN}_latency": "0.010208", f"{ATEN}_tflops": 3.287}

    tutorial_run = specs(tutorial)["BenchmarkRun"]["spec"]
    assert tutorial_run["timing"]["latencyNs"] == {"median": 11584}
    assert [(m["metric"], m["value"]) for m in tutorial_run["measurements"]] == [
        ("tflops", 2.897),
        ("speedup", 0.881),
    ]
    assert tutorial.facts is not None
    assert (tutorial.facts.metric, tutorial.facts.unit, tutorial.facts.median) == (
        "latency",
        "ns",
        11584,
    )


def test_the_input_tuple_is_the_gemm_case_and_the_device_is_curated() -> None:
    _, aten, tutorial, *_ = outcomes_of(SAMPLE.read_bytes())
    for outcome in (aten, tutorial):
        manifests = specs(outcome)
        assert manifests["WorkloadCase"]["spec"]["axes"] == {"k": 256, "m": 256, "n": 256}
        assert manifests["OperationSpec"]["spec"]["family"] == "gemm"
        environment = manifests["ExecutionEnvironment"]["spec"]
        assert environment["hardware"] == {
            "vendor": "nvidia",
            "product": "NVIDIA H100",
            "architecture": "sm_90",
        }
        assert environment["software"] == {
            "cudaToolkit": "12.8",
            "libraries": {"pytorch_commit": PYTORCH_SHA, "triton_commit": TRITON_SHA},
        }
        protocol = manifests["BenchmarkProtocol"]["spec"]
        assert protocol["harness"]["commit"] == TRITONBENCH_SHA
        assert protocol["measurement"]["primaryStatistic"] == "median"
    assert (
        specs(aten)["WorkloadCase"]["digest" if False else "spec"]
        == specs(tutorial)["WorkloadCase"]["spec"]
    )
    # aten_* is PyTorch's code; the tutorial kernel is TritonBench's
    assert specs(aten)["SoftwareProject"]["spec"]["name"] == "PyTorch"
    assert specs(aten)["ImplementationRevision"]["spec"]["projectRevision"]["commit"] == PYTORCH_SHA
    assert specs(tutorial)["SoftwareProject"]["spec"]["name"] == "TritonBench"
    assert (
        specs(tutorial)["ImplementationRevision"]["spec"]["projectRevision"]["commit"]
        == TRITONBENCH_SHA
    )


def test_a_bare_output_json_map_has_no_device_and_takes_the_receipt_time() -> None:
    metrics = json.loads(SAMPLE.read_bytes())["metrics"]
    data = json.dumps(metrics, indent=4).encode()
    outcomes = outcomes_of(data)
    assert [o.status for o in outcomes].count("ok") == 2
    run = next(o for o in outcomes if o.status == "ok")
    assert run.pointer == f"/{ATEN}_latency"
    assert run.source_line == 3
    manifests = specs(run)
    assert manifests["BenchmarkRun"]["spec"]["observedAt"] == "2026-01-01T00:00:00.000Z"
    assert manifests["ExecutionEnvironment"]["spec"]["hardware"]["product"] == "unspecified"
    # and with no receipt time either, each run says so
    (quiet,) = [o for o in outcomes_of(data, SourceContext()) if o.pointer == run.pointer]
    assert (quiet.status, quiet.reason) == ("quarantined", "missing_field")


def test_a_string_input_is_a_label_and_other_modes_are_split_off() -> None:
    metrics = {
        "tritonbench_flash_attention_fwd_bwd[x_llama-shape-7b-sdpa]_latency": "1.5",
        "tritonbench_layer_norm_bwd[x_4096-liger_layer_norm]_latency": 0.25,
        "tritonbench_custom[x_(1, 2)-impl]_gbps": 10,
    }
    attention, norm, custom = outcomes_of(json.dumps(metrics).encode())
    run = specs(attention)["BenchmarkRun"]
    assert run["metadata"]["labels"] == {"mode": "fwd_bwd", "input": "llama-shape-7b"}
    assert specs(attention)["OperationSpec"]["spec"]["family"] == "flash-attention"
    assert specs(norm)["WorkloadCase"]["spec"]["axes"] == {"x": 4096}
    assert specs(norm)["BenchmarkRun"]["spec"]["timing"]["latencyNs"] == {"median": 250000}
    assert specs(custom)["WorkloadCase"]["spec"]["axes"] == {"x0": 1, "x1": 2}
    assert "mode" not in specs(custom)["BenchmarkRun"]["metadata"].get("labels", {})
    assert specs(custom)["BenchmarkRun"]["spec"]["measurements"] == [
        {"metric": "gbps", "unit": "gb_per_s", "statistic": "derived", "value": 10}
    ]


def test_same_bytes_and_their_gzip_give_the_same_runs() -> None:
    data = SAMPLE.read_bytes()
    first, again, zipped = outcomes_of(data), outcomes_of(data), outcomes_of(gzip.compress(data))
    assert digests(first) == digests(again) == digests(zipped)
    assert [(o.source_line, o.pointer, o.reason) for o in zipped] == [
        (o.source_line, o.pointer, o.reason) for o in first
    ]
    # the received time plays no part when the file has its own
    later = outcomes_of(data, SourceContext(received_at="2030-01-01T00:00:00Z"))
    assert digests(later) == digests(first)


def test_other_formats_are_not_tritonbench() -> None:
    reader = TritonBenchJson()
    for path in FORMATS.glob("*/*"):
        if path.parent.name == "tritonbench":
            continue
        data = path.read_bytes()
        assert reader.recognize("x.json", data) is not None, path
        assert source_of("x.json", data).name != SOURCE, path
    others = [
        b"kernel_name,kernel_provider,metric_name\nrms_norm,liger,speed\n",
        json.dumps({"apiVersion": "kernelindex.dev/v1alpha1", "kind": "BenchmarkRun"}).encode(),
        json.dumps({"results": [{"name": "x", "time": 1.0}]}).encode(),
        json.dumps({"tritonbench": 1}).encode(),
        json.dumps(v3_conversion()).encode(),  # TritonBench's CI conversion is v3, not this
    ]
    for data in others:
        assert reader.recognize("x.json", data) is not None


# --- hostile input ---------------------------------------------------------------------------


def test_one_bad_case_is_quarantined_alone() -> None:
    text = "\n".join(
        [
            "{",
            f'  "{CASE.format("a")}_latency": "0.5",',
            f'  "{CASE.format("b")}_latency": NaN,',
            f'  "{CASE.format("c")}_latency": "CUDA OOM",',
            f'  "{CASE.format("d")}_latency": "0.1",',
            f'  "{CASE.format("d")}_latency": "0.2",',
            f'  "{CASE.format("e")}_compile_time": 12,',
            f'  "{CASE.format("f")}_latency": null,',
            '  "tritonbench_what": 1,',
            f'  "{CASE.format("g")}_latency": "0.25"',
            "}",
        ]
    )
    outcomes = outcomes_of(text.encode())
    summary = [(o.source_line, o.status, o.reason, o.pointer) for o in outcomes]
    assert summary == [
        (2, "ok", None, f"/{CASE.format('a')}_latency"),
        (3, "quarantined", "non_finite_number", f"/{CASE.format('b')}_latency"),
        (4, "quarantined", "bad_value", f"/{CASE.format('c')}_latency"),
        (5, "quarantined", "duplicate_key", f"/{CASE.format('d')}_latency"),
        (7, "quarantined", "unknown_metric_unit", f"/{CASE.format('e')}_compile_time"),
        (8, "quarantined", "missing_field", f"/{CASE.format('f')}_latency"),
        (9, "quarantined", "malformed_record", "/tritonbench_what"),
        (10, "ok", None, f"/{CASE.format('g')}_latency"),
    ]
    assert "CUDA OOM" in (outcomes[2].detail or "")
    assert "NaN" in outcomes[1].raw


def test_deep_nesting_is_one_clear_quarantine_row() -> None:
    data = b'{"tritonbench_gemm_fwd-pass": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    assert TritonBenchJson().recognize("x", data) is None
    (outcome,) = outcomes_of(data)
    assert (outcome.status, outcome.reason) == ("quarantined", "too_deep")


# --- the same measurement by way of TritonBench's v3 conversion -------------------------------


def v3_conversion() -> list[dict[str, Any]]:
    """What `.ci/test_infra/oss_ci_benchmark_v3.py` makes of the sample's per-input keys (its
    shape, written out here: the converter needs TritonBench installed)."""
    document = json.loads(SAMPLE.read_bytes())
    env = document["env"]
    records = []
    for backend in ("aten_matmul", "triton_tutorial_matmul"):
        for metric in ("latency", "tflops", "speedup"):
            key = f"{CASE.format(backend)}_{metric}"
            if key not in document["metrics"]:
                continue
            extra = {"input_shape": "(256, 256, 256)"}
            if metric == "latency":
                extra["aggregation"] = "p50"
            records.append(
                {
                    "benchmark": {
                        "name": "nightly",
                        "mode": "fwd",
                        "dtype": "unknown",
                        "extra_info": {},
                    },
                    "model": {"name": "gemm", "type": "tritonbench-oss", "backend": backend},
                    "metric": {
                        "name": metric,
                        "benchmark_values": [float(document["metrics"][key])],
                        "extra_info": extra,
                    },
                    "runners": [
                        {
                            "name": "gcp-h100-runner-1",
                            "gpu_count": 1,
                            "avail_gpu_mem_in_gb": 80,
                            "gpu_info": env["device"],
                            "extra_info": {"cuda_version": env["cuda_version"]},
                        }
                    ],
                    "dependencies": {
                        "tritonbench": {
                            "repo": "meta-pytorch/tritonbench",
                            "branch": "main",
                            "sha": env["tritonbench_commit"],
                        }
                    },
                }
            )
    return records


def test_the_v3_conversion_is_other_runs_with_the_same_latency() -> None:
    direct = outcomes_of(SAMPLE.read_bytes())
    lines = "\n".join(json.dumps(r) for r in v3_conversion()).encode()
    converted = list(normalize_object("v3.json", lines, context=CONTEXT).outcomes)
    assert [(o.status, o.reason) for o in converted] == [("ok", None)] * 5
    # `latency` names no unit: TritonBench's conversion (model type tritonbench-oss) writes
    # TritonBench's p50 in ms, as the direct file does
    latencies = [
        specs(o)["BenchmarkRun"]["spec"]["timing"]["latencyNs"]
        for o in converted
        if "timing" in specs(o)["BenchmarkRun"]["spec"]
    ]
    direct_latencies = [
        specs(o)["BenchmarkRun"]["spec"]["timing"]["latencyNs"]
        for o in direct
        if o.status == "ok" and "timing" in specs(o)["BenchmarkRun"]["spec"]
    ]
    assert latencies == direct_latencies and len(latencies) == 2
    # one TritonBench run (latency, tflops, speedup) is several v3 records, each its own run
    direct_runs = {o.records[0].digest for o in direct if o.status == "ok"}
    converted_runs = {o.records[0].digest for o in converted if o.status == "ok"}
    assert direct_runs.isdisjoint(converted_runs)
    # both name the same GPU
    gpus = {
        specs(o)["ExecutionEnvironment"]["spec"]["hardware"]["product"]
        for o in direct + converted
        if o.records
    }
    assert gpus == {"NVIDIA H100"}


def test_a_zero_the_conversion_wrote_for_an_error_is_a_failed_measurement() -> None:
    record = v3_conversion()[0]
    record["metric"]["benchmark_values"] = [0.0]  # the converter's value for "CUDA OOM"
    (outcome,) = normalize_object(
        "v3.json", json.dumps([record]).encode(), context=CONTEXT
    ).outcomes
    assert (outcome.status, outcome.reason) == ("quarantined", "measurement_failed")
    assert "tritonbench's mark of a measurement that failed" in (outcome.detail or "")


@pytest.mark.parametrize("key", ["tritonbench_gemm_fwd-pass", f"{ATEN}_latency"])
def test_recognized_by_content_whatever_its_name(key: str) -> None:
    data = json.dumps({key: 1}).encode()
    assert source_of("results/anything.csv", data).name == SOURCE

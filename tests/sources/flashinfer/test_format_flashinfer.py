"""FlashInfer-Trace: definitions, solutions and traces (tests/data/formats/flashinfer-trace)."""

from __future__ import annotations

import gzip
import json
import re
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipelines.curation import load
from pipelines.records import RowOutcome
from pipelines.records.canonical import manifest_digest
from pipelines.sources import SourceContext, normalize_object, source_of
from pipelines.sources.flashinfer import (
    AWAITING_DEFINITION,
    FlashInferTrace,
    operation_name,
    operation_of_definition,
    operation_of_manifest,
    trace_entries,
)
from pipelines.sources.measured import Observation, observation_outcome, operation_manifest

FORMATS = Path(__file__).parents[2] / "data" / "formats"
SAMPLES = FORMATS / "flashinfer-trace"
TRACES = SAMPLES / "gemm_n128_k2048.traces.jsonl"
DEFINITION = SAMPLES / "gemm_n128_k2048.definition.json"
SOLUTION = SAMPLES / "gpt-5_gemm_n128_k2048_cuda_optimized_r8_c0_high.solution.json"
RECEIVED = "2026-01-01T00:00:00Z"
SOURCE = FlashInferTrace()


def outcomes_of(data: bytes, context: SourceContext | None = None) -> list[RowOutcome]:
    result = normalize_object("x", data, context=context or SourceContext(received_at=RECEIVED))
    assert result.source == "flashinfer-trace"
    return list(result.outcomes)


def definition_manifest() -> dict[str, Any]:
    (outcome,) = outcomes_of(DEFINITION.read_bytes())
    (record,) = outcome.records
    return record.manifest


def knowing(*manifests: dict[str, Any], calls: Counter[str] | None = None) -> SourceContext:
    """A context whose index holds these OperationSpecs."""
    by_name = {m["metadata"]["name"]: m for m in manifests}

    def named(kind: str, name: str) -> dict[str, Any] | None:
        if calls is not None:
            calls[name] += 1
        return by_name.get(name) if kind == "OperationSpec" else None

    return SourceContext(manifest_named=named, received_at=RECEIVED)


def trace_lines() -> list[str]:
    return TRACES.read_text().splitlines()


def run_spec(outcome: RowOutcome) -> dict[str, Any]:
    assert outcome.run is not None and outcome.run.kind == "BenchmarkRun"
    return outcome.run.manifest["spec"]


def by_kind(outcome: RowOutcome) -> dict[str, dict[str, Any]]:
    return {r.kind: r.manifest for r in outcome.records}


# --- the shared samples ------------------------------------------------------------------------


def test_every_sample_is_this_source() -> None:
    for path in sorted(SAMPLES.iterdir()):
        assert source_of(path.name, path.read_bytes()).name == "flashinfer-trace", path


def test_other_formats_are_not_this_source() -> None:
    others = [p for p in FORMATS.glob("*/*") if p.parent.name != "flashinfer-trace"]
    assert len(others) >= 8
    for path in others:
        assert SOURCE.recognize(path.name, path.read_bytes()) is not None, path
    liger = next((Path(__file__).parents[2] / "data" / "liger").rglob("*.csv"))
    assert SOURCE.recognize(liger.name, liger.read_bytes()) is not None
    bundle = json.dumps({"operations": [definition_manifest()]}).encode()
    assert SOURCE.recognize("b.json", bundle) is not None
    assert SOURCE.recognize("m.json", json.dumps(definition_manifest()).encode()) is not None
    for text in ('{"a": 1}', "[1, 2]", '{"definition": "x"}\n{"definition": "y"}\n', ""):
        assert SOURCE.recognize("r.json", text.encode()) is not None


def test_definition_is_one_operation_spec() -> None:
    (outcome,) = outcomes_of(DEFINITION.read_bytes())
    assert (outcome.status, outcome.source_line, outcome.pointer) == ("ok", 1, "")
    assert [r.kind for r in outcome.records] == ["OperationSpec"]
    manifest = outcome.records[0].manifest
    assert manifest["metadata"]["name"] == operation_name("gemm_n128_k2048")
    assert manifest["metadata"]["name"] == "flashinfer-gemm_n128_k2048"
    assert manifest["metadata"]["labels"] == {"status": "verified", "model": "qwen3-30b-a3b"}
    spec = manifest["spec"]
    assert spec["family"] == "gemm"
    assert spec["axes"] == {
        "m": {"role": "variable", "type": "integer"},
        "n": {"role": "constant", "type": "integer", "value": 128},
        "k": {"role": "constant", "type": "integer", "value": 2048},
    }
    assert spec["inputs"][1] == {"name": "b", "tensor": {"shape": ["n", "k"], "dtype": "fp16"}}
    assert spec["outputs"] == [{"name": "c", "tensor": {"shape": ["m", "n"], "dtype": "fp16"}}]
    assert spec["reference"] == {"language": "python"}
    assert outcome.facts is None  # no run


def test_traces_wait_for_their_definition() -> None:
    outcomes = outcomes_of(TRACES.read_bytes())
    assert len(outcomes) == 25
    assert Counter((o.status, o.reason) for o in outcomes) == {
        ("quarantined", AWAITING_DEFINITION): 25
    }
    assert {o.detail for o in outcomes} == {"waits for definition gemm_n128_k2048"}
    assert [o.source_line for o in outcomes] == list(range(1, 26))
    assert {o.pointer for o in outcomes} == {""}
    assert json.loads(outcomes[0].raw)["workload"]["uuid"] == (
        "6ba7c7de-dc5a-48d2-8ada-1382feb5ceac"
    )


def test_traces_with_their_definition() -> None:
    outcomes = outcomes_of(TRACES.read_bytes(), knowing(definition_manifest()))
    assert Counter((o.status, o.reason) for o in outcomes) == {("ok", None): 25}
    statuses = Counter(run_spec(o)["status"] for o in outcomes)
    assert statuses == {"passed": 22, "incorrect_numerical": 3}

    first = outcomes[0]
    assert (first.source_line, first.pointer) == (1, "")
    spec = run_spec(first)
    # 0.09216000139713287 ms, 0.01706666685640812 ms: integer ns, half up
    assert spec["timing"] == {"primaryStatistic": "mean", "latencyNs": {"mean": 92160}}
    assert spec["measurements"] == [
        {"metric": "reference_latency", "unit": "ns", "statistic": "mean", "value": 17067},
        {
            "metric": "speedup",
            "unit": "ratio",
            "statistic": "ratio_of_means",
            "value": 0.18518518443662987,
        },
    ]
    assert spec["correctness"] == {
        "comparator": "allclose",
        "maximumAbsoluteError": 0.0,
        "maximumRelativeError": 0.0,
    }
    assert spec["observedAt"] == "2026-03-17T14:19:52.543Z"
    assert spec["sourceNative"]["externalId"] == (
        "gemm_n128_k2048/gpt-5_gemm_n128_k2048_cuda_optimized_r8_c0_high/"
        "6ba7c7de-dc5a-48d2-8ada-1382feb5ceac"
    )
    kinds = by_kind(first)
    assert kinds["WorkloadCase"]["spec"]["axes"] == {"k": 2048, "m": 6, "n": 128}
    assert kinds["WorkloadCase"]["spec"]["tensors"]["c"] == {"shape": [6, 128], "dtype": "fp16"}
    assert kinds["OperationSpec"] == definition_manifest()
    hardware = kinds["ExecutionEnvironment"]["spec"]["hardware"]
    assert (hardware["product"], hardware["architecture"]) == ("NVIDIA A800", "sm_80")
    assert kinds["ExecutionEnvironment"]["spec"]["software"] == {
        "cudaToolkit": "13.0",
        "framework": {"name": "pytorch", "version": "2.9.1+cu130"},
        "libraries": {"triton": "3.5.1"},
    }
    measurement = kinds["BenchmarkProtocol"]["spec"]["measurement"]
    assert measurement["primaryStatistic"] == "mean"
    assert (
        "mean over trials of each trial's median"
        in (kinds["BenchmarkProtocol"]["spec"]["comparability"]["notes"])
    )
    assert first.facts is not None and first.facts.median is None  # a mean, not a median
    assert first.facts.extra["mean"] == 92160

    failed = [o for o in outcomes if run_spec(o)["status"] == "incorrect_numerical"]
    assert [o.source_line for o in failed] == [
        i + 1 for i, t in enumerate(trace_lines()) if "INCORRECT_NUMERICAL" in t
    ]
    spec = run_spec(failed[0])
    assert "timing" not in spec and "measurements" not in spec
    assert spec["correctness"] == {
        "comparator": "allclose",
        "maximumAbsoluteError": 0.125,
        "maximumRelativeError": 1277.6507568359375,
    }
    assert len({run_spec(o)["sourceNative"]["externalId"] for o in outcomes}) == 25


def test_solution_states_the_implementation_the_runs_reference() -> None:
    (waiting,) = outcomes_of(SOLUTION.read_bytes())
    assert (waiting.status, waiting.reason, waiting.detail) == (
        "quarantined",
        AWAITING_DEFINITION,
        "waits for definition gemm_n128_k2048",
    )
    context = knowing(definition_manifest())
    (outcome,) = outcomes_of(SOLUTION.read_bytes(), context)
    assert outcome.status == "ok"
    assert [r.kind for r in outcome.records] == ["ImplementationRevision", "SoftwareProject"]
    runs = outcomes_of(TRACES.read_bytes(), context)
    assert {run_spec(o)["implementationDigest"] for o in runs} == {outcome.records[0].digest}


# --- identity and order ------------------------------------------------------------------------


@pytest.mark.parametrize("path", [TRACES, DEFINITION, SOLUTION])
def test_same_bytes_same_digests_and_gzip(path: Path) -> None:
    context = knowing(definition_manifest())
    data = path.read_bytes()

    def digests(outcomes: list[RowOutcome]) -> list[tuple[str, ...]]:
        return [(o.status, o.reason or "", *(r.digest for r in o.records)) for o in outcomes]

    once = digests(outcomes_of(data, context))
    assert once == digests(outcomes_of(data, context))
    assert once == digests(outcomes_of(gzip.compress(data), context))


def test_operation_round_trips_through_its_manifest() -> None:
    curation = load()
    manifest = definition_manifest()
    stored = json.loads(json.dumps(manifest, sort_keys=True))  # as an index may give it back
    rebuilt = operation_manifest(operation_of_manifest(stored), curation)
    assert rebuilt == manifest
    assert manifest_digest(rebuilt) == manifest_digest(manifest)

    # scalars, a dtype the curation does not map, a zero axis, tags that are not labels
    definition = {
        "name": "Odd Kernel.v2",
        "op_type": "Fused MoE",
        "tags": ["status:verified", "fp8", "Bad Key:x", "model:a", "model:b"],
        "axes": {"T": {"type": "var"}, "H": {"type": "const", "value": 0}},
        "inputs": {
            "X": {"shape": ["T", "H"], "dtype": "float8_e4m3"},
            "scale": {"shape": None, "dtype": "float32"},
        },
        "outputs": {"Y": {"shape": ["T"], "dtype": "bfloat16"}},
        "reference": "def run(X, scale):\n    return X",
    }
    operation = operation_of_definition(definition)
    assert operation.labels == {"status": "verified", "model": "a,b"}
    manifest = operation_manifest(operation, curation)
    assert manifest["spec"]["inputs"][1] == {"name": "scale", "scalar": {"dtype": "fp32"}}
    stored = json.loads(json.dumps(manifest, sort_keys=True))
    assert operation_manifest(operation_of_manifest(stored), curation) == manifest


def test_runs_are_the_same_however_the_definition_arrived() -> None:
    curation = load()
    data = TRACES.read_bytes()
    direct = operation_of_definition(json.loads(DEFINITION.read_text()))

    def run_digests(entries: list[Any]) -> list[str]:
        outcomes = [
            e if isinstance(e, RowOutcome) else observation_outcome(e, curation) for e in entries
        ]
        return [o.records[0].digest for o in outcomes]

    from_file = run_digests(list(trace_entries(data, lambda name: direct)))
    via_index = [o.records[0].digest for o in outcomes_of(data, knowing(definition_manifest()))]
    stored = json.loads(json.dumps(definition_manifest(), sort_keys=True))
    via_stored = [o.records[0].digest for o in outcomes_of(data, knowing(stored))]
    assert len(set(from_file)) == 25
    assert from_file == via_index == via_stored
    assert all(isinstance(e, Observation) for e in trace_entries(data, lambda name: direct))


def test_version_names_the_definitions_resolved(tmp_path: Path) -> None:
    data = TRACES.read_bytes()
    base = SOURCE.parser_version()
    assert SOURCE.version_of(data, SourceContext()) == f"{base}+defs-none"
    calls: Counter[str] = Counter()
    context = knowing(definition_manifest(), calls=calls)
    resolved = SOURCE.version_of(data, context)
    assert resolved.startswith(f"{base}+defs-") and resolved != f"{base}+defs-none"
    assert calls == {"flashinfer-gemm_n128_k2048": 1}  # once a file, not once a line
    assert SOURCE.version_of(SOLUTION.read_bytes(), context) == resolved
    assert SOURCE.version_of(DEFINITION.read_bytes(), SourceContext()) == base

    calls.clear()
    content = SOURCE.record_set(data, "sha256:" + "0" * 64, context, tmp_path)
    assert calls == {"flashinfer-gemm_n128_k2048": 1}  # shared by the version and the records
    assert set(content.tables["lineage"].column("parser_version").to_pylist()) == {resolved}
    assert content.tables["lineage"].num_rows == 25
    waiting = SOURCE.record_set(data, "sha256:" + "0" * 64, SourceContext(), tmp_path)
    quarantine = waiting.tables["quarantine"]
    assert quarantine.num_rows == 25
    assert set(quarantine.column("parser_version").to_pylist()) == {f"{base}+defs-none"}


# --- other traces the format allows ------------------------------------------------------------


def first_trace() -> dict[str, Any]:
    return json.loads(trace_lines()[0])


def test_error_statuses_and_non_finite_errors() -> None:
    runtime = first_trace()
    runtime["evaluation"].update(status="RUNTIME_ERROR", correctness=None, performance=None)
    nan = first_trace()
    nan["workload"]["uuid"] = "nan-errors"
    nan["evaluation"].update(status="INCORRECT_NUMERICAL", performance=None)
    nan["evaluation"]["correctness"] = {"max_relative_error": "NaN", "max_absolute_error": "NaN"}
    unknown = first_trace()
    unknown["evaluation"]["status"] = "EXPLODED"
    data = "\n".join(json.dumps(t) for t in (runtime, nan, unknown)).encode()
    first, second, third = outcomes_of(data, knowing(definition_manifest()))
    assert run_spec(first)["status"] == "runtime_error"
    assert "correctness" not in run_spec(first) and "timing" not in run_spec(first)
    assert run_spec(second)["status"] == "incorrect_numerical"
    assert run_spec(second)["correctness"] == {"comparator": "allclose"}
    labels = second.records[0].manifest["metadata"]["labels"]
    assert labels["max_relative_error"] == "NaN"
    assert (third.status, third.reason, third.source_line) == ("quarantined", "bad_value", 3)


def test_workload_lines_are_workload_cases() -> None:
    workload = {"definition": "gemm_n128_k2048", "workload": first_trace()["workload"]}
    workload.update(solution=None, evaluation=None)
    data = (json.dumps(workload) + "\n").encode()
    (waiting,) = outcomes_of(data)
    assert waiting.reason == AWAITING_DEFINITION
    (outcome,) = outcomes_of(data, knowing(definition_manifest()))
    assert outcome.status == "ok" and outcome.facts is None
    assert [r.kind for r in outcome.records] == ["WorkloadCase"]
    runs = outcomes_of(TRACES.read_bytes(), knowing(definition_manifest()))
    assert outcome.records[0].digest == run_spec(runs[0])["workloadDigest"]


# --- hostile input -----------------------------------------------------------------------------


def test_bad_lines_are_quarantined_alone() -> None:
    lines = trace_lines()
    bad = {
        2: re.sub(r'"max_relative_error":[0-9.e-]+', '"max_relative_error":NaN', lines[1]),
        4: lines[3].replace('{"definition":', '{"solution":"twice","definition":', 1),
        6: lines[5].replace('"timestamp"', '"time"'),
        9: lines[8].replace('"latency_ms":', '"latency_ms":"fast","x":'),
        10: '{"definition":"gemm_n128_k2048","workload":' + "[" * 10_000 + "]" * 10_000 + "}",
        12: lines[11][: len(lines[11]) // 2],
    }
    # a duplicate key: the line says "solution" twice
    assert bad[4].count('"solution"') == 2
    text = "\n".join(bad.get(i + 1, line) for i, line in enumerate(lines)).encode()
    outcomes = outcomes_of(text, knowing(definition_manifest()))
    assert len(outcomes) == 25
    quarantined = {o.source_line: (o.reason, o.pointer) for o in outcomes if o.status != "ok"}
    assert quarantined == {
        2: ("non_finite_number", ""),
        4: ("duplicate_key", ""),
        6: ("missing_field", ""),
        9: ("bad_value", ""),
        10: ("too_deep", ""),
        12: ("json_syntax", ""),
    }
    by_line = {o.source_line: o for o in outcomes}
    assert "fast" in by_line[9].raw and "NaN" in by_line[2].raw
    assert by_line[10].raw.startswith('{"definition"')
    assert sum(o.status == "ok" for o in outcomes) == 19


def test_deep_definition_is_one_quarantine_row() -> None:
    deep = (
        '{"name": "x", "op_type": "gemm", "axes": {"M": {"type": "var"}}, '
        '"inputs": {"A": {"shape": ["M"], "dtype": "float16"}}, "junk": '
        + "[" * 10_000
        + "]" * 10_000
        + "}"
    ).encode()
    (outcome,) = outcomes_of(deep)
    assert (outcome.status, outcome.reason) == ("quarantined", "too_deep")


def test_definition_with_missing_fields_is_quarantined() -> None:
    document = json.loads(DEFINITION.read_text())
    document["axes"]["N"] = {"type": "const", "value": "128"}
    (outcome,) = outcomes_of(json.dumps(document, indent=2).encode())
    assert (outcome.status, outcome.reason, outcome.pointer) == ("quarantined", "bad_value", "")
    assert '"128"' in outcome.raw


# --- a large file --------------------------------------------------------------------------------


def test_a_large_traces_file_streams(tmp_path: Path) -> None:
    lines = trace_lines()
    padding = "x" * 100_000  # a long build log, as real traces carry
    big = tmp_path / "big.jsonl"
    with big.open("w") as out:
        for i in range(200):
            trace = json.loads(lines[i % len(lines)])
            trace["workload"]["uuid"] = f"uuid-{i}"
            trace["evaluation"]["log"] = padding
            out.write(json.dumps(trace) + "\n")
    data = big.read_bytes()
    assert len(data) > 20_000_000
    context = knowing(definition_manifest())
    tracemalloc.start()
    try:
        count = passed = 0
        for outcome in SOURCE.outcomes(data, context):  # consumed one at a time, kept by none
            count += 1
            passed += outcome.status == "ok"
            del outcome
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (count, passed) == (200, 200)
    assert peak < 2_000_000, peak  # a few lines' worth, not the file's


def test_an_unreadable_indexed_definition_is_said_not_raised() -> None:
    broken = {"metadata": {"name": operation_name("gemm_n128_k2048")}, "spec": {}}
    context = knowing(broken)
    data = TRACES.read_bytes()
    outcomes = outcomes_of(data, context)
    assert Counter(o.reason for o in outcomes) == {"invalid_definition": 25}
    assert SOURCE.version_of(data, context) == f"{SOURCE.parser_version()}+defs-none"


# --- the 2025 dataset schema ----------------------------------------------------------------

AUG_TRACES = SAMPLES / "gemm_n_4096_k_4096.2025-08.traces.excerpt.jsonl"
AUG_DEFINITION = SAMPLES / "gemm_n_4096_k_4096.2025-08.definition.json"
JUL_TRACES = SAMPLES / "gemm_m_dynamic_n_4096_k_4096.2025-07.traces.excerpt.jsonl"
JUL_DEFINITION = SAMPLES / "gemm_m_dynamic_n_4096_k_4096.2025-07.definition.json"
DEFINITIONS_LIST = SAMPLES / "rmsnorm.2025-07.definitions-list.json"


def defined_by(path: Path) -> SourceContext:
    manifests = [r.manifest for o in outcomes_of(path.read_bytes()) for r in o.records]
    return knowing(*manifests)


def test_a_2025_trace_without_workload_uuid_is_a_run() -> None:
    traces = [json.loads(line) for line in AUG_TRACES.read_text().splitlines()]
    outcomes = outcomes_of(AUG_TRACES.read_bytes(), defined_by(AUG_DEFINITION))
    assert [o.status for o in outcomes] == ["ok"] * len(traces)
    ids = set()
    for outcome, trace in zip(outcomes, traces, strict=True):
        evaluation = trace["evaluation"]
        facts = outcome.facts
        assert facts is not None
        assert "uuid" not in trace["workload"]
        assert facts.gpu == evaluation["environment"]["device"]
        latency = evaluation["performance"]["latency_ms"]
        assert facts.extra["mean"] == round(latency * 1e6)
        assert facts.extra["primary_statistic"] == "mean" and facts.median is None
        assert f"-m{trace['workload']['axes']['M']}-" in facts.case_key
        ids.add(facts.external_id)
    # the workload is named by what it holds: distinct workloads, distinct runs
    assert len(ids) == len({json.dumps(t["workload"], sort_keys=True) for t in traces})


def test_july_2025_device_name_infinity_and_incorrect() -> None:
    traces = [json.loads(line) for line in JUL_TRACES.read_text().splitlines()]
    outcomes = outcomes_of(JUL_TRACES.read_bytes(), defined_by(JUL_DEFINITION))
    assert [o.status for o in outcomes] == ["ok"] * len(traces)
    for outcome, trace in zip(outcomes, traces, strict=True):
        evaluation = trace["evaluation"]
        facts = outcome.facts
        assert facts is not None
        assert evaluation["environment"]["device"] == "cuda:0"
        assert facts.gpu == evaluation["environment"]["libs"]["device_name"]
        spec = next(r.manifest for r in outcome.records if r.kind == "BenchmarkRun")["spec"]
        if evaluation["status"] == "INCORRECT":
            # Infinity was the evaluator's "not measured": no latency, the errors it did measure
            assert facts.extra["status"] == "incorrect_numerical"
            assert "timing" not in spec
            labels = next(r.manifest for r in outcome.records if r.kind == "BenchmarkRun")
            assert labels["metadata"]["labels"]["flashinfer_status"] == "INCORRECT"
            errors = evaluation["correctness"]
            assert spec["correctness"]["maximumAbsoluteError"] == errors["max_absolute_error"]
        else:
            assert facts.extra["status"] == "passed"
            latency = evaluation["performance"]["latency_ms"]
            assert spec["timing"]["latencyNs"] == {"mean": round(latency * 1e6)}


def test_infinity_in_a_passed_trace_is_still_quarantined() -> None:
    trace = json.loads(JUL_TRACES.read_text().splitlines()[0])
    assert trace["evaluation"]["status"] == "PASSED"
    text = json.dumps(trace).replace(
        '"latency_ms": ' + json.dumps(trace["evaluation"]["performance"]["latency_ms"]),
        '"latency_ms": Infinity',
    )
    (outcome,) = outcomes_of(text.encode(), defined_by(JUL_DEFINITION))
    assert outcome.reason == "non_finite_number"


def test_a_list_of_definitions_is_each_an_operation() -> None:
    document = json.loads(DEFINITIONS_LIST.read_text())
    outcomes = outcomes_of(DEFINITIONS_LIST.read_bytes())
    assert [o.pointer for o in outcomes] == [f"/{i}" for i in range(len(document))]
    for outcome, definition in zip(outcomes, document, strict=True):
        (record,) = outcome.records
        assert record.kind == "OperationSpec"
        assert record.manifest["metadata"]["name"] == operation_name(definition["name"])


def test_a_traces_file_whose_first_line_is_broken_is_still_traces() -> None:
    data = b'{"definition": "gemm_n128_k2048", "workl\n' + TRACES.read_bytes()
    assert source_of("x", data).name == "flashinfer-trace"
    outcomes = outcomes_of(data, knowing(definition_manifest()))
    assert (outcomes[0].status, outcomes[0].reason) == ("quarantined", "json_syntax")
    assert [o.status for o in outcomes[1:]] == [o.status for o in outcomes_of(
        TRACES.read_bytes(), knowing(definition_manifest()))]  # fmt: skip

"""nvbench JSON (pipelines/sources/nvbench): the real sample file NVIDIA/nvbench keeps as its
reference output, read into runs and quarantine rows."""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from pipelines.records import RowOutcome
from pipelines.sources import SourceContext, normalize_object, source_of
from pipelines.sources.nvbench import NvbenchJson

FORMATS = Path(__file__).parents[2] / "data" / "formats"
SAMPLE = FORMATS / "nvbench" / "test_ref.json"
CONTEXT = SourceContext(received_at="2026-01-01T00:00:00Z")
SOURCE = NvbenchJson.name


def outcomes_of(data: bytes, context: SourceContext = CONTEXT) -> list[RowOutcome]:
    result = normalize_object("any/key.json", data, context=context)
    assert result.source == SOURCE
    return list(result.outcomes)


def spec(outcome: RowOutcome, kind: str) -> dict[str, Any]:
    return next(r.manifest for r in outcome.records if r.kind == kind)["spec"]


def counts(outcomes: list[RowOutcome]) -> collections.Counter[tuple[str, str | None]]:
    return collections.Counter((o.status, o.reason) for o in outcomes)


@pytest.fixture(scope="module")
def sample() -> list[RowOutcome]:
    return outcomes_of(SAMPLE.read_bytes())


def test_every_state_is_a_run_or_a_skipped_state(sample: list[RowOutcome]) -> None:
    # 126 states: 88 measured, 38 skipped by copy_type_conversion_sweep (19 per device).
    assert counts(sample) == {("ok", None): 88, ("quarantined", "skipped_state"): 38}
    for outcome in sample:
        if outcome.status == "ok":
            assert outcome.run is not None and outcome.run.kind == "BenchmarkRun"
            assert len(outcome.records) == 7
        else:
            assert outcome.reason and outcome.detail and not outcome.records
    pointers = [o.pointer for o in sample]
    assert len(set(pointers)) == 126 and pointers[0] == "/benchmarks/0/states/0"
    ids = [spec(o, "BenchmarkRun")["sourceNative"]["externalId"] for o in sample if o.records]
    assert len(set(ids)) == 88


def _line_of_state(text: str, bench: str, state: str) -> int:
    """The line of the `{` that opens the named state (the line after which its name sits)."""
    at = text.index(f'"name": "{bench}"')
    at = text.index(f'"name": "{state}"', at)
    return text.count("\n", 0, text.rindex("{", 0, at)) + 1


def test_the_first_state_as_the_file_says(sample: list[RowOutcome]) -> None:
    text = SAMPLE.read_text()
    first = sample[0]
    assert first.source_line == _line_of_state(text, "simple", "Device=0")
    run = spec(first, "BenchmarkRun")
    # nv/cold/time/gpu/mean "0.0010034715849794225" s; nv/cold/sample_size "499".
    assert run["timing"] == {
        "primaryStatistic": "mean",
        "latencyNs": {"mean": 1003472},
        "samples": 499,
    }
    assert run["status"] == "passed"
    assert run["observedAt"] == "2026-01-01T00:00:00.000Z"  # the file records no time
    assert run["sourceNative"] == {
        "source": "nvbench",
        "benchmark": "simple",
        "externalId": "simple/Device=0",
    }
    measured = {(m["metric"], m["statistic"]): (m["unit"], m["value"]) for m in run["measurements"]}
    assert measured[("cold_time_cpu", "mean")] == ("ns", 1009446)  # 0.0010094458717434867 s
    assert measured[("cold_time_gpu", "stdev_relative")] == ("fraction", 0.0005782350585973689)
    assert measured[("batch_time_gpu", "mean")] == ("ns", 1001476)
    assert measured[("batch_sample_size", "count")] == ("count", 524)
    assert measured[("cold_walltime", "total")] == ("ns", 514350710)
    hardware = spec(first, "ExecutionEnvironment")["hardware"]
    assert hardware == {
        "vendor": "nvidia",
        "product": "NVIDIA Quadro GV100",
        "architecture": "sm_70",
        "memoryBytes": 34086060032,
    }
    protocol = spec(first, "BenchmarkProtocol")
    assert protocol["harness"] == {
        "name": "nvbench",
        "version": "0.1.0",
        "repository": "https://github.com/NVIDIA/nvbench",
        "commit": "348acbd6eb752a87e15c28fe1ad1cb827eaaadec",
    }
    assert protocol["measurement"] == {"timer": "cuda_events", "primaryStatistic": "mean"}
    implementation = spec(first, "ImplementationRevision")
    assert implementation["callable"] == {"language": "cuda"}
    assert spec(first, "SoftwareProject") == {"name": "unspecified"}
    assert first.facts is not None
    assert first.facts.provider == "nvbench.example.axes"  # meta.argv[0]
    assert first.facts.median is None  # nvbench reports a mean: never called a median
    assert first.facts.extra["mean"] == 1003472


def test_device_one_is_the_gp100(sample: list[RowOutcome]) -> None:
    second = sample[1]
    assert second.pointer == "/benchmarks/0/states/1"
    hardware = spec(second, "ExecutionEnvironment")["hardware"]
    assert hardware["product"] == "NVIDIA Quadro GP100"
    assert hardware["architecture"] == "sm_60"
    assert hardware["memoryBytes"] == 17069309952


def test_integer_axes_are_the_case_and_bandwidth_a_measurement(sample: list[RowOutcome]) -> None:
    by_id = {o.facts.external_id: o for o in sample if o.facts is not None}
    grid = by_id["copy_sweep_grid_shape/Device=0 BlockSize=2^8 NumBlocks=2^6"]
    assert spec(grid, "WorkloadCase")["axes"] == {"blocksize": 256, "numblocks": 64}
    assert spec(grid, "OperationSpec")["axes"] == {
        "blocksize": {"role": "variable", "type": "integer"},
        "numblocks": {"role": "variable", "type": "integer"},
    }
    units = {m["metric"]: m["unit"] for m in spec(grid, "BenchmarkRun")["measurements"]}
    assert units["cold_bw_global_bytes_per_second"] == "bytes_per_second"
    assert units["cold_bw_item_rate"] == "items_per_second"
    assert units["cold_bw_global_utilization"] == "fraction"
    conversion = by_id["copy_type_conversion_sweep/Device=0 In=I8 Out=I16"]
    units = {m["metric"]: m["unit"] for m in spec(conversion, "BenchmarkRun")["measurements"]}
    assert units["element_count_items"] == "count"
    assert units["gmem_reads_insize"] == "bytes"


def test_float_and_type_axes_are_labels(sample: list[RowOutcome]) -> None:
    by_id = {o.facts.external_id: o for o in sample if o.facts is not None}
    floats = by_id["single_float64_axis/Device=0 Duration=0.0001"]
    run = next(r.manifest for r in floats.records if r.kind == "BenchmarkRun")
    assert run["metadata"]["labels"] == {"duration": "0.0001"}
    assert spec(floats, "WorkloadCase")["axes"] == {}
    types = by_id["copy_type_conversion_sweep/Device=1 In=I8 Out=I16"]
    run = next(r.manifest for r in types.records if r.kind == "BenchmarkRun")
    assert run["metadata"]["labels"] == {"in": "I8", "out": "I16"}
    # Each type pair is its own series: the case key holds the settings that are not sizes.
    other = by_id["copy_type_conversion_sweep/Device=1 In=I8 Out=I32"]
    assert types.facts is not None and other.facts is not None
    assert (types.facts.case_key, other.facts.case_key) == ("in=I8-out=I16", "in=I8-out=I32")


def test_a_skipped_state_is_quarantined_with_its_reason(sample: list[RowOutcome]) -> None:
    skipped = [o for o in sample if o.status == "quarantined"]
    first = skipped[0]
    assert first.pointer == "/benchmarks/4/states/0"
    assert first.detail == "Not a conversion: InputType == OutputType."
    assert json.loads(first.raw)["is_skipped"] is True
    text = SAMPLE.read_text()
    assert first.source_line == _line_of_state(
        text, "copy_type_conversion_sweep", "Device=0 In=I8 Out=I8"
    )
    reasons = collections.Counter(o.detail for o in skipped)
    assert reasons == {
        "Not a conversion: InputType == OutputType.": 12,
        "Narrowing conversion: sizeof(InputType) > sizeof(OutputType).": 26,
    }


def test_the_same_bytes_give_the_same_digests_and_gzip_reads_alike(
    sample: list[RowOutcome],
) -> None:
    data = SAMPLE.read_bytes()
    again = outcomes_of(data)
    assert [o.json_line() for o in again] == [o.json_line() for o in sample]
    packed = outcomes_of(gzip.compress(data))
    assert [o.json_line() for o in packed] == [o.json_line() for o in sample]
    assert [(o.pointer, o.source_line) for o in packed] == [
        (o.pointer, o.source_line) for o in sample
    ]


def test_digests_do_not_depend_on_order() -> None:
    document = json.loads(SAMPLE.read_text())
    document["benchmarks"].reverse()
    for bench in document["benchmarks"]:
        bench["states"].reverse()
    reordered = outcomes_of(json.dumps(document, indent=1).encode())
    original = outcomes_of(SAMPLE.read_bytes())
    digests = {o.run.digest for o in original if o.run is not None}
    assert {o.run.digest for o in reordered if o.run is not None} == digests


def test_other_formats_are_not_nvbench() -> None:
    others = [p for p in FORMATS.rglob("*") if p.is_file() and p.parent.name != "nvbench"]
    others += [
        Path(__file__).parents[2] / "data" / "liger" / "all_benchmark_data.csv",
        Path(__file__).parents[2] / "data" / "kernelindex" / "examples" / "benchmark-run.yaml",
    ]
    source = NvbenchJson()
    for path in others:
        if path.suffix in (".md",):
            continue
        assert source.recognize(path.name, path.read_bytes()) is not None, path
        assert source_of(path.name, path.read_bytes()).name != SOURCE, path
    bundle = b"apiVersion: kernelindex.dev/v1alpha1\nkind: BenchmarkRun\n"
    for data in (bundle, b'{"benchmarks": [], "devices": []}', b'{"a": 1}', b"[]", b""):
        assert source.recognize("x", data) is not None


# --- hostile input --------------------------------------------------------------------------

DEVICE = '{"id": 0, "name": "Quadro GV100", "sm_version": 700, "ptx_version": 700}'


def _summary(tag: str, value: str, kind: str = "float64") -> str:
    data = f'[{{"name": "value", "type": "{kind}", "value": {value}}}]'
    return f'{{"tag": "{tag}", "hint": "duration", "data": {data}}}'


def _state(name: str, gpu_mean: str, extra: str = "") -> str:
    summaries = ", ".join(
        [
            _summary("nv/cold/sample_size", '"10"', "int64"),
            _summary("nv/cold/time/gpu/mean", gpu_mean),
        ]
    )
    return (
        f'{{"name": "{name}", "device": 0, "axis_values": [{{"name": "N", "type": "int64", '
        f'"value": "{len(name)}"}}], {extra} "summaries": [{summaries}], "is_skipped": false}}'
    )


def _document(states: list[str]) -> bytes:
    return (
        '{\n"meta": {"argv": ["./bench"], "version": {"nvbench": {"string": "0.1.0"}}},\n'
        f'"devices": [{DEVICE}],\n'
        '"benchmarks": [{"name": "b", "axes": [{"name": "N", "type": "int64"}], "states": [\n'
        + ",\n".join(states)
        + "\n]}]}\n"
    ).encode()


def test_one_bad_state_is_quarantined_and_its_neighbours_land() -> None:
    data = _document(
        [
            _state("Device=0 N=1", '"0.001"'),
            _state("Device=0 N=22", "NaN"),
            _state("Device=0 N=333", '"0.002"', '"device": 0,'),  # a duplicate key
            _state("Device=0 N=4444", '"fast"'),
            '{"name": "Device=0 N=5", "device": 0, "summaries": [], "is_skipped": false}',
            _state("Device=0 N=666666", '"0.003"').replace('"device": 0', '"device": 7'),
            _state("Device=0 N=7777777", '"0.004"'),
            _state("Device=0 N=1", '"0.005"'),  # the same state twice
        ]
    )
    outcomes = outcomes_of(data)
    assert [(o.status, o.reason) for o in outcomes] == [
        ("ok", None),
        ("quarantined", "non_finite_number"),
        ("quarantined", "duplicate_key"),
        ("quarantined", "bad_value"),
        ("quarantined", "missing_field"),
        ("quarantined", "missing_field"),
        ("ok", None),
        ("quarantined", "duplicate_external_id"),
    ]
    assert [o.pointer for o in outcomes] == [f"/benchmarks/0/states/{i}" for i in range(8)]
    assert [o.source_line for o in outcomes] == list(range(5, 13))
    assert "NaN" in outcomes[1].raw and "N=22" in outcomes[1].raw
    assert "fast" in (outcomes[3].detail or "") and "N=4444" in outcomes[3].raw
    assert "device 7" in (outcomes[5].detail or "")
    assert spec(outcomes[6], "WorkloadCase")["axes"] == {"n": len("Device=0 N=7777777")}
    assert spec(outcomes[6], "BenchmarkRun")["timing"]["latencyNs"] == {"mean": 4000000}
    # An unknown GPU keeps its name and the architecture nvbench states.
    assert spec(outcomes[0], "ExecutionEnvironment")["hardware"]["architecture"] == "sm_70"


def test_an_unknown_gpu_keeps_the_architecture_nvbench_states() -> None:
    data = _document([_state("Device=0 N=1", '"0.001"')]).replace(
        b'"Quadro GV100", "sm_version": 700', b'"Some Future GPU", "sm_version": 1000'
    )
    (outcome,) = outcomes_of(data)
    hardware = spec(outcome, "ExecutionEnvironment")["hardware"]
    assert hardware == {
        "vendor": "unspecified",
        "product": "Some Future GPU",
        "architecture": "sm_100",
    }


def test_without_a_received_time_a_state_says_so() -> None:
    outcomes = outcomes_of(_document([_state("Device=0 N=1", '"0.001"')]), SourceContext())
    assert [(o.status, o.reason) for o in outcomes] == [("quarantined", "missing_field")]


def test_deep_nesting_is_one_clear_quarantine_row() -> None:
    data = b'{"devices": [{"sm_version": 700, "ptx_version": 700}], "benchmarks": ' + b"[" * 10_000
    assert NvbenchJson().recognize("x", data) is None
    outcomes = outcomes_of(data)
    assert [(o.status, o.reason) for o in outcomes] == [("quarantined", "too_deep")]
    plain = list(NvbenchJson().outcomes(b"[" * 10_000, CONTEXT))
    assert [(o.status, o.reason) for o in plain] == [("quarantined", "too_deep")]


def test_not_an_object_with_benchmarks_is_one_row() -> None:
    outcomes = list(NvbenchJson().outcomes(b'{"devices": []}', CONTEXT))
    assert [(o.status, o.reason) for o in outcomes] == [("quarantined", "malformed_record")]


# --- the 2021 layouts ---------------------------------------------------------------------

JUNE_2021 = FORMATS / "nvbench" / "nvbench.example.exec_tag_sync.2021-12.json"
MARCH_2021 = FORMATS / "nvbench" / "test.2021-03-layout.excerpt.json"


def _june_states() -> list[tuple[str, str, dict[str, Any]]]:
    document = json.loads(JUNE_2021.read_text())
    return [(b["name"], key, s) for b in document["benchmarks"] for key, s in b["states"].items()]


def test_june_2021_states_and_summaries_keyed_by_name() -> None:
    outcomes = outcomes_of(JUNE_2021.read_bytes())
    states = _june_states()
    assert [o.status for o in outcomes] == ["ok"] * len(states) and states
    for outcome, (bench, key, state) in zip(outcomes, states, strict=True):
        summaries = state["summaries"]
        gpu_mean = float(summaries["Average GPU Time (Cold)"]["value"]["value"])  # seconds
        samples = int(summaries["Number of Samples (Cold)"]["value"]["value"])
        facts = outcome.facts
        assert facts is not None
        assert outcome.pointer == f"/benchmarks/0/states/{key}"
        assert facts.external_id == f"{bench}/{key}"
        assert (facts.metric, facts.unit, facts.extra["primary_statistic"]) == (
            "latency",
            "ns",
            "mean",
        )
        assert facts.extra["mean"] == round(gpu_mean * 1e9)
        assert facts.median is None
        assert facts.extra["samples"] == samples
        devices = {d["id"]: d["name"] for d in json.loads(JUNE_2021.read_text())["devices"]}
        assert facts.gpu == devices[state["device"]]
        noise = float(summaries["GPU Relative Standard Deviation (Cold)"]["value"]["value"])
        measured = {(m["metric"], m["statistic"]): m for m in spec(outcome, "BenchmarkRun")[
            "measurements"]}  # fmt: skip
        assert measured["cold_time_gpu", "stdev_relative"]["value"] == noise
        assert measured["cold_time_gpu", "stdev_relative"]["unit"] == "fraction"


def test_march_2021_summaries_named_without_tag() -> None:
    outcomes = outcomes_of(MARCH_2021.read_bytes())
    document = json.loads(MARCH_2021.read_text())
    states = document["benchmarks"][0]["states"]
    assert counts(outcomes) == {("ok", None): 3, ("quarantined", "skipped_state"): 1}
    assert outcomes[0].detail == states[0]["skip_reason"]
    for outcome, state in zip(outcomes[1:], states[1:], strict=True):
        named = {
            s["name"]: {v["name"]: v["value"] for v in s["values"]} for s in state["summaries"]
        }
        facts = outcome.facts
        assert facts is not None
        assert facts.extra["mean"] == round(named["Average GPU Time (Cold)"]["value"] * 1e9)
        assert facts.extra["samples"] == named["Number of Samples (Cold)"]["value"]
        assert facts.gpu == document["devices"][0]["name"]
        axes = {a["name"]: a["value"] for a in state["axis_values"]}
        assert f"elements{axes['Elements']}" in facts.case_key


def test_a_2021_state_and_its_1_0_form_are_one_run() -> None:
    """A display name is read as the tag nvbench renamed it to: the same state in both
    layouts states the same latency."""
    state_2021 = {"device": 0, "summaries": {
        "Average GPU Time (Cold)": {"hint": {"type": "string", "value": "duration"},
                                    "value": {"type": "float64", "value": "0.00025"}},
        "Number of Samples (Cold)": {"hint": {"type": "string", "value": "sample_size"},
                                     "value": {"type": "int64", "value": "100"}}}}  # fmt: skip
    state_1_0 = {"name": "s", "device": 0, "summaries": [
        {"tag": "nv/cold/time/gpu/mean", "hint": "duration",
         "data": [{"name": "value", "type": "float64", "value": "0.00025"}]},
        {"tag": "nv/cold/sample_size", "hint": "sample_size",
         "data": [{"name": "value", "type": "int64", "value": "100"}]}]}  # fmt: skip
    old = f'{{"devices": [{DEVICE}], "benchmarks": [{{"name": "b", "states": {{"s": '
    old += json.dumps(state_2021) + "}}]}"
    new = f'{{"devices": [{DEVICE}], "benchmarks": [{{"name": "b", "states": ['
    new += json.dumps(state_1_0) + "]}]}"
    (a,), (b,) = outcomes_of(old.encode()), outcomes_of(new.encode())
    assert spec(a, "BenchmarkRun")["timing"] == spec(b, "BenchmarkRun")["timing"]
    assert spec(a, "BenchmarkRun")["timing"]["latencyNs"] == {"mean": 250_000}

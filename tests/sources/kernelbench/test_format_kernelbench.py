"""KernelBench timing JSON across its history (tests/data/formats/kernelbench/): failed (`null`)
problems, any level name, a mean alone. Values are checked against the files themselves."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from pipelines.records import RowOutcome
from pipelines.sources import SourceContext, closest_format, normalize_object, source_of
from pipelines.sources.kernelbench import MEASUREMENT_FAILED

DATA = Path(__file__).parents[2] / "data" / "formats" / "kernelbench"
CONTEXT = SourceContext(received_at="2026-01-01T00:00:00Z")
FAILED_FIRST = DATA / "L4_GCP_baseline_time_torch_compile_inductor_max-autotune.json"
LEVEL_TK = DATA / "tk_baseline_time.json"
ALL_FAILED = DATA / "L40S_babel_level5_baseline_time_torch_compile_inductor_max-autotune.json"
MEAN_ONLY = DATA / "A6000_babel_new_baseline_time_torch.json"


def outcomes_of(path: Path) -> list[RowOutcome]:
    result = normalize_object(path.name, path.read_bytes(), context=CONTEXT)
    assert result.source == "kernelbench-timing"
    return list(result.outcomes)


def problems(path: Path) -> list[tuple[str, str, Any]]:
    document = json.loads(path.read_text())
    return [(level, p, t) for level, ps in document.items() for p, t in ps.items()]


@pytest.mark.parametrize("path", [FAILED_FIRST, LEVEL_TK, ALL_FAILED, MEAN_ONLY])
def test_each_problem_is_a_run_or_its_failure_in_file_order(path: Path) -> None:
    outcomes = outcomes_of(path)
    expected = problems(path)
    assert [o.pointer for o in outcomes] == [f"/{level}/{p}" for level, p, _ in expected]
    for outcome, (level, problem, timing) in zip(outcomes, expected, strict=True):
        if timing is None:
            assert (outcome.status, outcome.reason) == ("quarantined", MEASUREMENT_FAILED)
            assert f"problem {problem} of {level} failed" in (outcome.detail or "")
        else:
            assert outcome.status == "ok", outcome.detail
            assert outcome.facts is not None
            assert outcome.facts.external_id == f"{level}/{problem}"


def test_a_failed_first_problem_does_not_hide_the_level() -> None:
    outcomes = outcomes_of(FAILED_FIRST)
    timed = [(level, p, t) for level, p, t in problems(FAILED_FIRST) if t is not None]
    runs = [o for o in outcomes if o.status == "ok"]
    assert len(runs) == len(timed) > 0
    for run, (level, problem, timing) in zip(runs, timed, strict=True):
        facts = run.facts
        assert facts is not None
        assert facts.external_id == f"{level}/{problem}"
        # ms → integer ns, the mean as the mean: never called a median
        assert facts.extra["mean"] == round(timing["mean"] * 1e6)
        assert facts.extra["min"] == round(timing["min"] * 1e6)
        assert facts.extra["max"] == round(timing["max"] * 1e6)
        assert facts.median is None and facts.extra["primary_statistic"] == "mean"
        assert (facts.metric, facts.unit) == ("latency", "ns")
        assert facts.gpu == timing["hardware"] == "NVIDIA L4"
        assert facts.extra["samples"] == timing["num_trials"]
        spec = run.records[0].manifest["spec"]
        assert spec["timing"]["latencyNs"]["mean"] == facts.extra["mean"]


def test_any_level_name_is_a_level() -> None:
    outcomes = outcomes_of(LEVEL_TK)
    assert {o.status for o in outcomes} == {"ok"}
    assert all(o.pointer.startswith("/level_tk/") for o in outcomes)
    operation = outcomes[0].records[1].manifest
    assert operation["kind"] == "OperationSpec"
    assert operation["metadata"]["labels"]["kernelbench_level"] == "level_tk"


def test_a_file_whose_every_problem_failed_is_read_as_kernelbench() -> None:
    outcomes = outcomes_of(ALL_FAILED)
    assert outcomes and {o.reason for o in outcomes} == {MEASUREMENT_FAILED}


def test_a_mean_alone_keeps_its_unit_and_gpu_unstated() -> None:
    outcomes = outcomes_of(MEAN_ONLY)
    timed = [(level, p, t) for level, p, t in problems(MEAN_ONLY) if t is not None]
    runs = [o for o in outcomes if o.status == "ok"]
    assert len(runs) == len(timed)
    for run, (_, _, timing) in zip(runs, timed, strict=True):
        assert run.facts is not None
        assert (run.facts.metric, run.facts.unit) == ("mean_time", "unspecified")
        assert run.facts.gpu == "unspecified"
        spec = run.records[0].manifest["spec"]
        assert "timing" not in spec  # no latency is claimed from a number of unknown unit
        assert spec["measurements"] == [
            {"metric": "mean_time", "unit": "unspecified", "statistic": "mean",
             "value": timing["mean"]}
        ]  # fmt: skip


def test_recognition_reads_the_whole_start_not_the_first_problem() -> None:
    data = FAILED_FIRST.read_bytes()
    assert source_of("x.json", data).name == "kernelbench-timing"
    assert source_of("x.json.gz", gzip.compress(data)).name == "kernelbench-timing"


def test_a_kernelbench_like_file_without_timings_names_what_it_lacks() -> None:
    data = json.dumps({"level1": {"1_a.py": {"elapsed": 2.0}}}).encode()
    (outcome,) = normalize_object("x.json", data, context=CONTEXT).outcomes
    assert outcome.reason == "unrecognized_format"
    assert "KernelBench timing JSON: no problem with a mean or num_trials in any level" in (
        outcome.detail or ""
    )
    assert closest_format(data).startswith("KernelBench timing JSON")

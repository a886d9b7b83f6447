"""KernelBench timing JSON (`results/timing/<hardware>/baseline_time_*.json`): the times of its
reference PyTorch programs, by level and problem file.

    {"level1": {"1_Square_matrix_multiplication_.py": {"mean": 2.66, "std": 0.0199,
      "min": 2.65, "max": 2.86, "num_trials": 100, "hardware": "NVIDIA H100 80GB HBM3",
      "device": "cuda:0"}, ...}, "level2": {...}}

One run per problem. Times are in milliseconds (KernelBench's `timing.py` times each trial with
CUDA events); the hardware is per entry. The file records no time of its own, nor which build of
the programs ran (eager or compiled: only its file name says), nor any software version.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import partial
from typing import Any

from pipelines.sources.json_input import JsonInputError, escape, head_text, raw_text, read_document
from pipelines.sources.measured import (
    Entry,
    Environment,
    Implementation,
    Measurement,
    Observation,
    ObservationError,
    Operation,
    Project,
    Protocol,
    number,
    observe,
    quarantined,
    to_ns,
    utc_instant,
)
from pipelines.sources.source import HarnessSource, SourceContext

SOURCE = "kernelbench"
REPOSITORY = "https://github.com/ScalingIntelligence/KernelBench"
_LEVEL = re.compile(r"^level\d+$")
_SNIFF = re.compile(r'"level\d+"\s*:\s*\{\s*"[^"]+\.py"\s*:\s*\{[^{}]*"num_trials"')

PROJECT = Project("KernelBench", REPOSITORY, "library")
PROTOCOL = Protocol(
    harness="KernelBench",
    repository=REPOSITORY,
    timer="cuda_events",
    primary_statistic="mean",
    family="kernelbench_timing",
    notes=(
        "KernelBench's timing: each trial timed with CUDA events after warm-up, in ms; mean, "
        "std, min and max over num_trials."
    ),
)


class KernelBenchTiming(HarnessSource):
    name = "kernelbench-timing"
    format_version = "kindex-kernelbench/1"

    def recognize(self, key: str, data: bytes) -> str | None:
        if _SNIFF.search(head_text(data)):
            return None
        return "not KernelBench timing JSON (no level of problem files with num_trials)"

    def entries(self, data: bytes, context: SourceContext) -> Iterator[Entry]:
        document = read_document(data)
        if not isinstance(document, dict):
            raise JsonInputError("malformed_record", "KernelBench timing is an object of levels")
        for level, problems in document.items():
            if not _LEVEL.match(level) or not isinstance(problems, dict):
                detail = f"{level!r} is not a level of problem files"
                yield quarantined(
                    1, f"/{escape(level)}", raw_text(problems), "malformed_record", detail
                )
                continue
            line = getattr(problems, "line", None) or 1
            for problem, timing in problems.items():
                pointer = f"/{escape(level)}/{escape(problem)}"
                yield from observe(
                    timing,
                    line,
                    pointer,
                    partial(_observation, level, problem, context=context),
                )


def _observation(level: str, problem: str, timing: Any, *, context: SourceContext) -> Observation:
    if not isinstance(timing, dict):
        raise ObservationError("malformed_record", "a problem's timing is an object")
    name = problem.removesuffix(".py")
    family = re.sub(r"^\d+_", "", name).strip("_") or name
    hardware = timing.get("hardware")
    if not isinstance(hardware, str) or not hardware.strip():
        raise ObservationError("missing_field", "no hardware")
    received = context.received_time()
    if received is None:
        raise ObservationError("missing_field", "no time: the file records none")
    latency = {
        "mean": to_ns(number(timing["mean"], "mean"), "ms"),
        "minimum": to_ns(number(timing["min"], "min"), "ms"),
        "maximum": to_ns(number(timing["max"], "max"), "ms"),
    }
    measurements: tuple[Measurement, ...] = ()
    if "std" in timing:
        std = to_ns(number(timing["std"], "std"), "ms")
        measurements = (Measurement("latency", "ns", "stdev", std),)
    trials = timing.get("num_trials")
    samples = int(trials) if isinstance(trials, int) and trials > 0 else None
    return Observation(
        source=SOURCE,
        external_id=f"{level}/{problem}",
        operation=Operation(
            name=f"kernelbench-{level}-{name}",
            family=family,
            title=f"KernelBench {level} {name}",
            labels={"kernelbench_level": level},
        ),
        workload_axes={},
        implementation=Implementation("pytorch-reference", PROJECT, language="python"),
        protocol=PROTOCOL,
        environment=Environment(gpu=hardware),
        observed_at=utc_instant(received),
        latency_ns=latency,
        samples=samples,
        measurements=measurements,
        benchmark=level,
    )

"""KernelBench timing JSON (`results/timing/<hardware>/baseline_time_*.json`): the times of its
reference PyTorch programs, by level and problem file.

    {"level1": {"1_Square_matrix_multiplication_.py": {"mean": 2.66, "std": 0.0199,
      "min": 2.65, "max": 2.86, "num_trials": 100, "hardware": "NVIDIA H100 80GB HBM3",
      "device": "cuda:0"}, ...}, "level2": {...}}

One run per problem. Times are in milliseconds (KernelBench's `timing.py` times each trial with
CUDA events); the hardware is per entry. The file records no time of its own, nor which build of
the programs ran (eager or compiled: only its file name says), nor any software version.

Every layout its history holds is read (`results/timing/*/`, 101 file versions):
- a level is any key whose value is an object of problem files (`level1`, `level_tk`);
- a problem whose measurement failed is `null` (`generate_baseline_time.py` stores what
  `measure_ref_program_time` returns, None on an error): a quarantine row `measurement_failed`;
  the rest of the level are runs;
- a problem with its `mean` alone (no `num_trials`, `hardware` nor spread: a fork's file) is a
  run whose number keeps its unit and GPU unstated (`unspecified`): it is a measurement
  `mean_time` in unit `unspecified`, never a latency, since the file does not say ms.
Recognition reads the file's start as a whole, never only its first problem.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import partial
from typing import Any

from pipelines.records.rules import UNSPECIFIED, Reason
from pipelines.sources.json_input import (
    Marks,
    escape,
    raw_text,
)
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
# What the start of a timing file shows, each anywhere in it (a level's first problem may
# have failed, its timing `null`): a problem file keyed in an object, and a timing's mean or
# trial count.
_PROBLEM = re.compile(r'"[^"\\]+\.py"\s*:\s*(?:\{|null\b)')
_PROBLEM_TIMED = re.compile(r'"[^"\\]+\.py"\s*:\s*\{')
_TIMING = re.compile(r'"(?:num_trials|mean)"\s*:\s*-?[\d.]')
MEASUREMENT_FAILED = Reason.MEASUREMENT_FAILED
MARKS = Marks.of(
    (_PROBLEM.pattern, "no level holds a problem file"),
    (_TIMING.pattern, "no problem with a mean or num_trials in any level"),
    (r'"num_trials"\s*:', "no num_trials"),
    (r'"hardware"\s*:', "no hardware"),
)

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
    format_version = "kindex-kernelbench/2"

    title = "KernelBench timing JSON"
    marks = MARKS
    shape = "not a JSON object of levels"

    def shows(self, head: str) -> bool:
        return self.lacks(head) is None

    def lacks(self, head: str) -> str | None:
        """What the start of a file lacks to be a timing file; None when it is one."""
        if not head.startswith("{"):
            return self.shape
        if not _PROBLEM.search(head):
            return "no level holds a problem file (`<n>_<name>.py`)"
        if not _TIMING.search(head) and _PROBLEM_TIMED.search(head):
            # problems with objects, none timed (a file whose every problem failed is null
            # throughout, and is KernelBench's)
            return "no problem with a mean or num_trials in any level"
        return None

    def entries(self, data: bytes, context: SourceContext) -> Iterator[Entry]:
        document = self.json_object(data)
        for level, problems in document.items():
            if not isinstance(problems, dict):
                detail = f"{level!r} is not a level of problem files"
                yield quarantined(
                    1, f"/{escape(level)}", raw_text(problems), Reason.MALFORMED_RECORD, detail
                )
                continue
            line = getattr(problems, "line", None) or 1
            for problem, timing in problems.items():
                pointer = f"/{escape(level)}/{escape(problem)}"
                if timing is None:
                    detail = (
                        f"problem {problem} of {level} failed: KernelBench wrote null, its "
                        "timing of the reference program raised an error"
                    )
                    yield quarantined(line, pointer, "null", MEASUREMENT_FAILED, detail)
                    continue
                yield from observe(
                    timing,
                    line,
                    pointer,
                    partial(_observation, level, problem, context=context),
                )


def _observation(level: str, problem: str, timing: Any, *, context: SourceContext) -> Observation:
    if not isinstance(timing, dict):
        detail = f"a problem's timing is an object, not {type(timing).__name__}"
        raise ObservationError(Reason.MALFORMED_RECORD, detail)
    received = context.received_time()
    if received is None:
        raise ObservationError(Reason.MISSING_FIELD, "no time: the file records none")
    if _mean_only(timing):
        return _mean_only_observation(level, problem, timing, received)
    hardware = timing.get("hardware")
    if not isinstance(hardware, str) or not hardware.strip():
        raise ObservationError(Reason.MISSING_FIELD, "no hardware")
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
    return _run(
        level,
        problem,
        received,
        PROTOCOL,
        Environment(gpu=hardware),
        latency_ns=latency,
        samples=samples,
        measurements=measurements,
    )


def _run(
    level: str,
    problem: str,
    received: str,
    protocol: Protocol,
    environment: Environment,
    **measured: Any,
) -> Observation:
    """A problem's run: what every layout of the file says alike, and its numbers."""
    return Observation(
        source=SOURCE,
        external_id=f"{level}/{problem}",
        operation=_operation(level, problem),
        workload_axes={},
        implementation=IMPLEMENTATION,
        protocol=protocol,
        environment=environment,
        observed_at=utc_instant(received),
        benchmark=level,
        **measured,
    )


IMPLEMENTATION = Implementation("pytorch-reference", PROJECT, language="python")


def _operation(level: str, problem: str) -> Operation:
    name = problem.removesuffix(".py")
    family = re.sub(r"^\d+_", "", name).strip("_") or name
    return Operation(
        name=f"kernelbench-{level}-{name}",
        family=family,
        title=f"KernelBench {level} {name}",
        labels={"kernelbench_level": level},
    )


def _mean_only(timing: dict[str, Any]) -> bool:
    return set(timing) == {"mean"}


# A mean with no unit, trial count or device: nothing says what timed it or in what unit.
MEAN_ONLY_PROTOCOL = Protocol(
    harness="KernelBench",
    repository=REPOSITORY,
    timer=UNSPECIFIED,
    primary_statistic="mean",
    family="kernelbench_mean_only",
    notes=(
        "A KernelBench-layout timing file whose problems hold a mean alone: no unit, trial "
        "count, spread or hardware (not what KernelBench's timing.py writes). The mean is kept "
        "as written, its unit unspecified."
    ),
)


def _mean_only_observation(
    level: str, problem: str, timing: dict[str, Any], received: str
) -> Observation:
    mean = number(timing["mean"], "mean")
    return _run(
        level,
        problem,
        received,
        MEAN_ONLY_PROTOCOL,
        Environment(gpu=UNSPECIFIED),
        measurements=(Measurement("mean_time", UNSPECIFIED, "mean", mean),),
    )

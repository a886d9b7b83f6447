"""The rules of the Liger source, each stated once: what a row's texts mean.

Read top to bottom: the limits and the quarantine reasons; numbers (parsing, JavaScript
rounding, the unit and scale of a metric); timestamps; a provider's role; the externalId and the
names of a run; and how the x value, the config and the kernel name bind a kernel's axes.

Where a rule has a column-wise form (numbers, timestamps, names), that form is the rule a batch
applies (pipelines/sources/liger/columnar.py); a scalar form beside it reads only the odd texts the
column-wise check leaves. Curated knowledge (units, roles, kernels) is read from
`pipelines/curation`, never restated here.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Literal, NamedTuple

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.curation import ABSENT, Binding, Curation, ExpressionError, Kernel
from pipelines.curation.gaps import Gap, gap_labels
from pipelines.records.rules import (
    MAX_SAFE_INTEGER,
    NAME_LIMIT,
    Reason,
    half_up_columns,
    slug,
)

SOURCE = "liger-kernel-bench"  # sourceNative.source of every run
STATUS = "passed"  # spec.status of every run: the CSV lists only benchmarks that ran
ORIGIN: Literal["reported"] = (
    "reported"  # a run the CSV reports, as opposed to one a worker measured
)
# A real field is under 300 characters; a longer one than this is garbage or an attack, and would
# ride every record and index row of its run (README: `field_too_large`).
FIELD_LIMIT = 2**20


# --- quarantine reasons: the one enum of every source, pipelines/records/rules.py --------


class Uncurated(Exception):
    """A config shape (x and config) that binds no curated axes: not a quarantine reason, the
    row becomes an uncurated run (model.Normalizer.workload; pipelines/curation/gaps.py)."""


class RowRejected(Exception):
    """A row the normalizer cannot turn into records; becomes a quarantine outcome."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = Reason(reason)
        self.detail = detail


def record_rejection(
    fields: list[str] | None, error: str | None, width: int, size: int | None = None
) -> RowRejected | None:
    """Why a CSV record is no row of its file (not CSV, not UTF-8, not as many fields as the
    header, a field over FIELD_LIMIT), or None. `size`, the record's raw length where known,
    bounds every field's: a record no longer than FIELD_LIMIT needs no field measured."""
    if fields is None or error is not None:
        detail = error or Reason.UNPARSEABLE_ROW
        return RowRejected(Reason(detail.split(":", 1)[0]), detail)
    if len(fields) != width:
        return RowRejected(
            Reason.WRONG_COLUMN_COUNT, f"expected {width} fields, found {len(fields)}"
        )
    if size is not None and size <= FIELD_LIMIT or max(map(len, fields)) <= FIELD_LIMIT:
        return None
    longest = max(range(len(fields)), key=lambda i: len(fields[i]))
    return RowRejected(
        Reason.FIELD_TOO_LARGE,
        f"field {longest + 1} holds {len(fields[longest])} characters,"
        f" over the limit of {FIELD_LIMIT}",
    )


# --- names -----------------------------------------------------------------------------------
# --- numbers ---------------------------------------------------------------------------------
# What the column-wise number check accepts: digits with an optional fraction. Anything else
# ("1e-05", " 1", "+1", "nan") is read by parse_positive and its full grammar.
PLAIN_DECIMAL = r"^[0-9]+(\.[0-9]+)?$"
# JavaScript's Number() grammar for decimal literals, without its leniencies Python adds
# (underscores, "nan", "infinity").
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def positive_numbers(texts: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """A column of number texts: which are plain, finite, positive decimals (a mask), and their
    values where plain (the other texts are read one by one, by parse_positive)."""
    plain = pc.match_substring_regex(texts, PLAIN_DECIMAL)
    values = pc.cast(pc.if_else(plain, texts, "1"), pa.float64()).to_numpy()
    return pc.and_(plain, pa.array(np.isfinite(values) & (values > 0))), values


def parse_positive(text: str, column: str) -> float:
    """One number text, by JavaScript's grammar: a finite positive number, or RowRejected."""
    if not _NUMBER.fullmatch(text.strip()):
        raise RowRejected(Reason.BAD_NUMBER, f"{column} is not a number: {text[:80]!r}")
    value = float(text)
    if not math.isfinite(value):
        raise RowRejected(Reason.BAD_NUMBER, f"{column} is out of range: {text[:80]!r}")
    if value <= 0:
        raise RowRejected(Reason.NON_POSITIVE_VALUE, f"{column} must be positive, got {text!r}")
    return value


# --- what a row measured -----------------------------------------------------------------------
class Statistics(NamedTuple):
    """The statistics a layout's value columns hold, in column order. The first is the run's
    primary statistic (what the file measured: never another one renamed); an `optional` one a
    row may leave empty, and it may be zero (a spread, not a time)."""

    names: tuple[str, ...]
    columns: tuple[str, ...]  # the header's value columns, as named
    native: tuple[str, ...]  # what sourceNative names each after the unit (ms_50, mb_mean)
    optional: frozenset[str] = frozenset()

    @property
    def primary(self) -> str:
        return self.names[0]

    def native_names(self, unit: str, names: Sequence[str]) -> tuple[str, ...]:
        """The sourceNative metric names of some of its statistics (a row's own numbers)."""
        return tuple(f"{unit.lower()}_{self.native[self.names.index(n)]}" for n in names)


# Liger's benchmark scripts since September 2024: do_bench's quantiles [0.5, 0.2, 0.8].
QUANTILES = Statistics(
    ("median", "p20", "p80"), ("y_value_50", "y_value_20", "y_value_80"), ("50", "20", "80")
)
# Liger 0.1.x-0.2.x (2024): the mean of do_bench(return_mode="mean"), which gives no spread, and
# of peak memory over its iterations, with their (population) standard deviation.
MEAN_STD = Statistics(
    ("mean", "std"), ("y_value_mean", "y_value_std"), ("mean", "std"), frozenset({"std"})
)
# The first benchmark script (August 2024): do_bench's median alone (its quantiles' first).
MEDIAN = Statistics(("median",), ("y_value",), ("value",))


class CsvLayout(NamedTuple):
    """A layout of Liger's benchmark CSV, recognized by its header: the statistics its value
    columns hold, the columns it names otherwise than today's header (today's name, its
    own), whether it has liger_version, and whether it writes a timestamp as seconds since
    the Unix epoch (time.time()) rather than Liger's 'YYYY-MM-DD HH:MM:SS'."""

    name: str
    statistics: Statistics
    renamed: tuple[tuple[str, str], ...] = ()
    versioned: bool = True
    epoch: bool = False


# The first whose columns a header has all of is the file's; today's first.
LAYOUTS = (
    CsvLayout("quantiles", QUANTILES),
    CsvLayout("mean-std", MEAN_STD),
    CsvLayout(
        "median-epoch",
        MEDIAN,
        renamed=(("extra_benchmark_config_str", "extra_benchmark_config"),),
        versioned=False,
        epoch=True,
    ),
)


def spread_numbers(texts: pa.Array) -> tuple[pa.Array, pa.Array, np.ndarray]:
    """A column of optional spread texts: which are empty (absent), which are plain finite
    non-negative decimals (a mask), and their values where plain (NaN where absent)."""
    empty = pc.equal(pc.utf8_trim_whitespace(texts), "")
    plain = pc.match_substring_regex(texts, PLAIN_DECIMAL)
    values = pc.cast(pc.if_else(plain, texts, "0"), pa.float64()).to_numpy().copy()
    values[empty.to_numpy(zero_copy_only=False)] = np.nan
    return empty, pc.and_(plain, pa.array(np.isfinite(values))), values


def parse_spread(text: str, column: str) -> float | None:
    """One optional spread text, by JavaScript's grammar: None when empty, else a finite
    number at least zero, or RowRejected."""
    if not text.strip():
        return None
    if not _NUMBER.fullmatch(text.strip()):
        raise RowRejected(Reason.BAD_NUMBER, f"{column} is not a number: {text[:80]!r}")
    value = float(text)
    if not math.isfinite(value):
        raise RowRejected(Reason.BAD_NUMBER, f"{column} is out of range: {text[:80]!r}")
    if value < 0:
        raise RowRejected(Reason.NON_POSITIVE_VALUE, f"{column} must not be negative, got {text!r}")
    return value


def stored_values(native: np.ndarray, scale: np.ndarray | float) -> np.ndarray:
    """A row's numbers in the stored unit (integer ns or bytes), as floats: its native numbers
    times its metric's scale, rounded as JavaScript does. A value past 2**53 - 1 (104 days in
    ns, 8 PiB) is garbage, and RFC 8785 has no exact form for it: see `safe_columns`."""
    return half_up_columns(native * scale)


class MetricKind(NamedTuple):
    """How a row's metric is stored: as the curated metric `kind` (speed or memory) whose
    units hold the row's unit, scaled by `scale`; `uncurated` when the metric's name is not
    that kind's (a metric the curation lacks, stored under its own protocol)."""

    kind: str
    scale: float
    uncurated: bool


def metric_kind(curation: Curation, metric: str, unit: str) -> MetricKind:
    """A row's metric and unit (protocols.yaml's `units`): a curated metric in one of its units;
    a metric the curation lacks in a unit the curated metrics that have it store alike (ms:
    integer ns), stored as the first of them; else RowRejected, since no rule converts the
    number."""
    scale = curation.units.get(metric, {}).get(unit)
    if scale is not None:
        return MetricKind(metric, scale, False)
    owners = [kind for kind, units in curation.units.items() if unit in units]
    stored = {stored_metric(is_memory(kind)) for kind in owners}
    if metric not in curation.units and len(stored) == 1:
        return MetricKind(owners[0], curation.units[owners[0]][unit], True)
    known = ", ".join(f"{m}/{u}" for m, units in curation.units.items() for u in units)
    raise RowRejected(
        Reason.UNKNOWN_METRIC,
        f"metric {metric!r} in {unit!r}: no curated unit converts it (expected one of {known})",
    )


def named_metric(metric: str, kind: str, uncurated: bool) -> str | None:
    """The metric a run's externalId, names and protocol carry: none for speed and memory (the
    reference importer's forms; memory's own tail aside), else its name (speed_graph, or a
    metric the curation lacks)."""
    return metric if uncurated or kind not in ("speed", "memory") else None


def gaps_of(curation: Curation, kernel: str, provider: str, mode: str, gpu: str) -> list[Gap]:
    """What the curation lacks of a series' names (a provider counts as curated only for the
    kernels it implements): each a curation gap, never a quarantine (gaps.py)."""
    gaps = []
    if kernel not in curation.kernels:
        gaps.append(Gap.KERNEL)
    entry = curation.providers.get(provider)
    if entry is None or not entry.implements(kernel):
        gaps.append(Gap.PROVIDER)
    if mode not in curation.passes:
        gaps.append(Gap.MODE)
    if gpu not in curation.gpus:
        gaps.append(Gap.GPU)
    return gaps


def is_memory(kind: str) -> bool:
    """Whether a metric kind's runs are memory runs (their own protocol and externalIds)."""
    return kind == "memory"


def stored_metric(memory: bool) -> tuple[Literal["latency", "memory"], Literal["ns", "bytes"]]:
    """The metric and unit a run stores its numbers in (`stored_values`)."""
    return ("memory", "bytes") if memory else ("latency", "ns")


# --- timestamps ------------------------------------------------------------------------------
# Liger's own form, in ASCII digits: what the column-wise reading cuts apart.
PLAIN_TIMESTAMP = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}:[0-9]{2}$"
_TIMESTAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})")


class Stamp(NamedTuple):
    """A timestamp as a run writes it."""

    observed_at: str  # ISO 8601 UTC, milliseconds
    observed_at_json: str
    form: str  # as externalIds write it
    slug: str  # slug(form), as names write it


def stamps(texts: pa.Array) -> list[Stamp | RowRejected]:
    """The Stamp of each (distinct) timestamp text, or why it is not a time. Texts in Liger's
    form with a day of month up to 28 (a valid date in every month) are cut apart column-wise:
    their parts are ASCII digits, which neither slugs nor JSON change. The rest are read by
    parse_timestamp."""
    plain = pc.match_substring_regex(texts, PLAIN_TIMESTAMP).to_numpy(zero_copy_only=False)
    parseable = pc.if_else(pa.array(plain), texts, "0001-01-01 00:00:00")

    def part(start: int, stop: int) -> pa.Array:
        return pc.utf8_slice_codeunits(parseable, start, stop)

    year, month, day, hour, minute, second = (
        pc.cast(part(start, start + size), pa.int64()).to_numpy()
        for start, size in ((0, 4), (5, 2), (8, 2), (11, 2), (14, 2), (17, 2))
    )
    simple = plain & (year >= 1) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= 28)
    simple &= (hour <= 23) & (minute <= 59) & (second <= 59)
    date, clock = part(0, 10), part(11, 19)
    observed = pc.binary_join_element_wise(date, "T", clock, ".000Z", "").to_pylist()
    form = pc.binary_join_element_wise(
        date, part(11, 13), part(14, 16), part(17, 19), "-"
    ).to_pylist()
    return [
        Stamp(observed[i], f'"{observed[i]}"', form[i], form[i]) if simple[i] else _stamp(text)
        for i, text in enumerate(texts.to_pylist())
    ]


def _stamp(text: str) -> Stamp | RowRejected:
    try:
        observed, form = parse_timestamp(text)
    except RowRejected as rejected:
        return rejected
    return Stamp(observed, orjson.dumps(observed).decode(), form, slug(form))


def epoch_stamps(texts: pa.Array) -> list[Stamp | RowRejected]:
    """The Stamp of each (distinct) text of seconds since the Unix epoch, or why it is none."""
    return [_epoch_stamp(text) for text in texts.to_pylist()]


_EPOCH = re.compile(r"\d{1,11}(\.\d+)?")


def _epoch_stamp(text: str) -> Stamp | RowRejected:
    """Seconds since the Unix epoch as a UTC time: observedAt to the millisecond (the rest
    cut off), the externalId's form of its whole second, as Liger's timestamps write it."""
    if not _EPOCH.fullmatch(text.strip()):
        return RowRejected(
            Reason.BAD_TIMESTAMP, f"timestamp is not seconds since the epoch: {text[:80]!r}"
        )
    whole, _, fraction = text.strip().partition(".")
    try:
        moment = datetime.fromtimestamp(int(whole), UTC)
    except (OverflowError, OSError, ValueError) as error:
        return RowRejected(Reason.BAD_TIMESTAMP, f"timestamp {text!r}: {error}")
    second = moment.strftime("%Y-%m-%dT%H:%M:%S")
    observed = f"{second}.{(fraction + '000')[:3]}Z"
    form = moment.strftime("%Y-%m-%d-%H-%M-%S")
    return Stamp(observed, orjson.dumps(observed).decode(), form, slug(form))


@lru_cache(maxsize=1024)  # a benchmark script stamps all rows of one run alike
def parse_timestamp(text: str) -> tuple[str, str]:
    """Liger's naive timestamp, read as UTC: (observedAt, the form used in externalIds)."""
    match = _TIMESTAMP.fullmatch(text.strip())
    if not match:
        raise RowRejected(
            Reason.BAD_TIMESTAMP, f"timestamp is not 'YYYY-MM-DD HH:MM:SS': {text[:80]!r}"
        )
    year, month, day, hour, minute, second = match.groups()
    try:
        datetime(int(year), int(month), int(day), int(hour), int(minute), int(second))
    except ValueError as error:
        raise RowRejected(Reason.BAD_TIMESTAMP, f"timestamp {text!r}: {error}") from None
    observed = f"{year}-{month}-{day}T{hour}:{minute}:{second}.000Z"
    return observed, f"{year}-{month}-{day}-{hour}-{minute}-{second}"


# --- a provider's role -----------------------------------------------------------------------
def is_baseline(curation: Curation, provider: str, kernel: str) -> bool:
    """Whether a provider is a baseline of a kernel (providers.yaml `baseline: <rank>`); one
    not curated for the kernel never is."""
    entry = curation.providers.get(provider)
    return entry is not None and entry.implements(kernel) and entry.baseline


# --- a run's externalId and names --------------------------------------------------------------
def _metric_part(memory: bool, metric: str | None) -> str:
    """What sets a run of another metric apart from a speed run: `memory`, or the name of a
    metric the curation lacks (`metric`, None when curated)."""
    return metric if metric is not None else "memory" if memory else ""


def external_id_parts(
    kernel: str, mode: str, provider: str, gpu: str, memory: bool, metric: str | None = None
) -> tuple[str, str]:
    """A run's externalId is `head + case_key + "/" + stamp form + tail`: its series, its
    workload's case key and its timestamp form."""
    part = _metric_part(memory, metric)
    return f"{kernel}/{mode}/{provider}/{slug(gpu)}/", f"/{part}" if part else ""


def run_name_parts(
    kernel: str, mode: str, provider: str, gpu: str, memory: bool, metric: str | None = None
) -> tuple[str, ...]:
    """The constant parts of a series' run names; a run's name is the slug of these parts, its
    case key and its stamp form joined by hyphens (`joined_slugs`), cut at SHORT_LIMIT."""
    part = _metric_part(memory, metric)
    return ("liger", kernel, f"{mode}-{part}" if part else mode, provider, gpu)


def run_labels(version: str, gaps: Iterable[Gap]) -> dict[str, str]:
    """A run's metadata.labels: the Liger version that measured it, and what the curation lacks
    for it (gaps.py: `runs` are filtered on it; a later curation turns it curated on backfill)."""
    labels = gap_labels(gaps)
    return {**labels, "liger_version": version} if version else labels


def run_gaps(
    series: Sequence[Any],
    series_ids: np.ndarray,
    workloads: Sequence[Any],
    workload_ids: np.ndarray,
) -> tuple[list[tuple[Gap, ...]], np.ndarray]:
    """What the curation lacks for each run, column-wise: the distinct gap sets (of its
    series' names, and of its workload's config shape) and each run's index among them."""
    uncurated = np.array([w.uncurated for w in workloads], dtype=np.int64)
    combined = series_ids.astype(np.int64) * 2 + uncurated[workload_ids]
    distinct, codes = np.unique(combined, return_inverse=True)
    gap_sets = [
        (*series[int(c) // 2].gaps, *((Gap.CONFIG,) if c % 2 else ())) for c in distinct.tolist()
    ]
    return gap_sets, codes.reshape(-1)


def run_title(
    kernel_title: str, provider: str, mode: str, memory: bool, metric: str | None = None
) -> str:
    part = _metric_part(memory, metric)
    return f"{kernel_title} · {provider} · {mode}" + (f" · {part}" if part else "")


def implementation_name(kernel: str, provider: str) -> str:
    return f"liger-bench-{slug(kernel)}-{slug(provider)}"[:NAME_LIMIT]


def environment_name(gpu: str) -> str:
    return f"liger-bench-{slug(gpu)}"[:NAME_LIMIT]


def protocol_name(
    mode: str, memory: bool, metric: str | None = None, statistic: str = QUANTILES.primary
) -> str:
    """A protocol's name: what it measures and, where its primary statistic is not Liger's
    median of today, that statistic (`liger-bench-do-bench-mean-forward`)."""
    measure = slug(metric) if metric is not None else "memory" if memory else "do-bench"
    if statistic != QUANTILES.primary:
        measure = f"{measure}-{slug(statistic)}"
    return f"liger-bench-{measure}-{slug(mode)}"[:NAME_LIMIT]


def case_key(sorted_axes: Iterable[tuple[str, str]], dtype: str) -> str:
    """A workload's case key: each axis name and its size, in sorted order, then the dtype."""
    return "-".join(f"{name}{size}" for name, size in sorted_axes) + f"-{dtype}"


def workload_title(kernel_title: str, axes: Iterable[tuple[str, str]], dtype: str) -> str:
    """A workload's title: its axes in binding order."""
    bound = ", ".join(f"{name}={size}" for name, size in axes)
    return f"{kernel_title} · {bound} · {dtype}"


# --- how x, the config and the kernel name bind a kernel's axes -----------------------------------
# What an x value that names a configuration may be (it rides the run's externalId and name).
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")


def kernel_of(curation: Curation, kernel: str, config_text: str) -> str:
    """The curated kernel a row's kernel name and config name: the name itself, unless
    `kernelNames` in kernels.yaml renames it or lets a config key pick the kernel."""
    variant = curation.kernel_names.get(kernel)
    if variant is None:
        return kernel
    key, kernels = variant
    if key is None:  # a rename
        return kernels[None]
    config = parse_config(config_text)
    if key not in config and ABSENT in kernels:
        return kernels[ABSENT]
    value = config.get(key)
    picked = next((k for v, k in kernels.items() if v == value and type(v) is type(value)), None)
    # A value no one curated: the kernel as the file names it, uncurated (gaps.py).
    return kernel if picked is None else picked


def parse_config(text: str) -> dict[str, Any]:
    def reject_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        config = json.loads(text, parse_constant=reject_constant)
    except ValueError as error:
        raise RowRejected(Reason.BAD_CONFIG_JSON, f"extra_benchmark_config_str: {error}") from None
    if not isinstance(config, dict):
        raise RowRejected(Reason.BAD_CONFIG_JSON, "extra_benchmark_config_str is not a JSON object")
    return config


def binding_of(
    kernel: Kernel, x_name: str, config: dict[str, Any]
) -> tuple[Binding, dict[str, Any]]:
    """x_name's binding and the config under the binding's key names, once the config is
    checked to hold nothing else."""
    binding = kernel.bindings.get(x_name)
    if binding is None:
        raise Uncurated(
            f"{kernel.name} has no curated binding for x_name {x_name!r}",
        )
    if binding.defaults:
        config = {**binding.defaults, **config}
    if binding.aliases:
        config = dict(config)
        for written, bound in binding.aliases.items():
            if written in config:
                if bound in config:
                    raise Uncurated(
                        f"{kernel.name}/{x_name}: config has both {written} and {bound}",
                    )
                config[bound] = config.pop(written)
    scalar_keys = frozenset().union(*(e.names for e in kernel.scalars.values()))
    allowed = binding.config_keys | scalar_keys | {"dtype"}
    _check_config_keys(kernel.name, x_name, allowed, binding.require, config)
    return binding, config


def is_integer(value: Any) -> bool:
    return type(value) is int or (type(value) is float and value.is_integer())


def _check_config_keys(
    kernel: str,
    x_name: str,
    allowed: frozenset[str],
    require: dict[str, Any],
    config: dict[str, Any],
) -> None:
    unexpected = sorted(set(config) - allowed)
    if unexpected:
        raise Uncurated(
            f"{kernel}/{x_name}: unexpected config key(s) {unexpected}",
        )
    for key, expected in require.items():
        value = config.get(key)
        if (
            value != expected
            or type(value) is not type(expected)
            and not (is_integer(value) and is_integer(expected))
        ):
            raise Uncurated(
                f"{kernel}/{x_name}: config {key}={value!r}, curated for {expected!r}",
            )


def positive_integer(text: str, column: str) -> int:
    value = parse_positive(text, column)
    if not value.is_integer():
        raise Uncurated(f"{column} {text!r} is not an integer size")
    return int(value)


def axis_value(axis: str, value: Any) -> int:
    if not is_integer(value) or value <= 0:
        raise Uncurated(f"axis {axis} is not a positive integer: {value!r}")
    if value > MAX_SAFE_INTEGER:  # a JSON number past 2**53 - 1 has no exact canonical form
        raise Uncurated(
            f"axis {axis} is past 2**53 - 1 ({int(value).bit_length()} bits)",
        )
    return int(value)


def scalars_of(kernel: Kernel, config: dict[str, Any]) -> dict[str, float | int]:
    try:
        return {name: _scalar(name, expr.evaluate(config)) for name, expr in kernel.scalars.items()}
    except (ExpressionError, TypeError) as error:
        raise Uncurated(f"{kernel.name}: {error}") from None


def _scalar(name: str, value: Any) -> float | int:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise Uncurated(f"scalar {name} is not a number: {value!r}")
    if type(value) is int and abs(value) > MAX_SAFE_INTEGER:
        raise Uncurated(
            f"scalar {name} is past 2**53 - 1 ({value.bit_length()} bits)",
        )
    number: float | int = value
    return number


def sizes_of(kernel: Kernel, axes: dict[str, int]) -> dict[str, int]:
    """The axes and the derived axes."""
    sizes: dict[str, int] = dict(axes)
    try:
        for axis, expression in kernel.derived_axes.items():
            sizes[axis] = axis_value(axis, expression.evaluate(sizes))
    except (ExpressionError, ZeroDivisionError) as error:
        raise Uncurated(f"{kernel.name}: {error}") from None
    return sizes

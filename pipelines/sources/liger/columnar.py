"""Step 3: a batch of Liger CSV records normalized column by column: the one way rows are read
and runs are made. A row alone is a batch of one.

Python runs once per distinct series, workload, timestamp and version of a batch (or per odd
number text), and Arrow's C++ kernels do the per-row work: checking the numbers, rounding
(pipelines/sources/liger/rules.py), and filling each run's canonical JSON from its series'
template. Only hashing stays a per-row Python call. A row that a rule rejects is quarantined
with the reason of the first rule it fails, in the order a row is read: its record, kernel,
series, numbers, timestamp, workload, stored values. tests/liger_oracle.py builds runs the plain
way, row by row, and the tests hold the two to the same bytes. Duplicate externalIds are the
file's rule (`quarantine_duplicates`). A batch may hold the records of several small files one
after another (`files_batches`): each row knows its file, and the file's rule is each file's.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import islice
from typing import Any, BinaryIO, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.records import Record, RowOutcome
from pipelines.records.canonical import canonical_json, number_text
from pipelines.records.rules import SHORT_LIMIT, Reason, joined_slugs, safe_columns
from pipelines.sources.liger.model import (
    Layout,
    Normalizer,
    Series,
    Template,
    Workload,
    json_string,
    references,
    shared_normalizer,
)
from pipelines.sources.liger.read import CsvRecord, LigerCsv, open_liger_csv
from pipelines.sources.liger.rules import (
    CsvLayout,
    RowRejected,
    Stamp,
    epoch_stamps,
    parse_positive,
    parse_spread,
    positive_numbers,
    record_rejection,
    run_gaps,
    run_labels,
    spread_numbers,
    stamps,
    stored_values,
)
from pipelines.sources.seen_keys import SeenKeys, digests_of

# Where Arrow's float formatting is ECMAScript's (tests/sources/liger/test_liger_columnar.py);
# numbers outside it are formatted by canonical.number_text.
ARROW_FLOAT_TEXT = (1e-6, 1e10)

Value = TypeVar("Value")


@dataclass(slots=True)
class Runs:
    """The runs of a batch, column by column (row order kept): what their rows say, by
    dictionary codes into distinct values, and then (`_assemble`) the runs themselves."""

    positions: list[int]  # each run's index in the batch
    series: list[Series]  # each run's series, by index in series_ids
    series_ids: np.ndarray
    workloads: list[Workload]
    workload_ids: np.ndarray
    stamps: list[Stamp]  # by stamp_ids
    stamp_ids: np.ndarray
    stats: list[np.ndarray]  # the rows' own numbers, by the layout's statistics (NaN: absent)
    values: np.ndarray  # int64 of those in ns or bytes, one row per run (-1: absent)
    versions: list[str]  # liger_version stripped, by version_ids
    version_ids: np.ndarray
    lines: pa.Array = field(default_factory=lambda: pa.array([], pa.int64()))  # source lines
    external_ids: pa.Array = field(default_factory=lambda: pa.array([], pa.string()))
    digests: pa.Array = field(default_factory=lambda: pa.array([], pa.string()))  # "sha256:…"
    manifests: pa.Array = field(default_factory=lambda: pa.array([], pa.string()))  # sorted keys


@dataclass(slots=True)
class Batch:
    """A batch's outcomes: its runs as columns, every quarantined row as a RowOutcome."""

    records: Sequence[CsvRecord]
    runs: Runs | None
    others: dict[int, RowOutcome]  # by index in the batch
    files: np.ndarray  # each record's file, by index among the files read together

    @property
    def size(self) -> int:
        return len(self.records)


def normalize_batch(
    records: Sequence[CsvRecord],
    layout: Layout,
    normalizer: Normalizer,
    files: np.ndarray | None = None,
) -> Batch:
    """A batch's runs and quarantines; duplicate externalIds are the caller's. `files` says
    which file each record is of (all of one file when None): no rule here looks past a row."""
    if files is None:
        files = np.zeros(len(records), dtype=np.int32)
    others: dict[int, RowOutcome] = {}
    kept: list[int] = []
    for i, record in enumerate(records):
        rejected = record_rejection(record.fields, record.error, layout.width, len(record.raw))
        if rejected is None:
            kept.append(i)
        else:
            others[i] = quarantined(record, rejected)
    if not kept:
        return Batch(records, None, others, files)
    # The kept records have layout.width fields each: Arrow takes all their texts in one
    # conversion, row after row, and each column is every width-th text from its index on.
    texts = pa.array([records[i].fields for i in kept], pa.list_(pa.string())).flatten()
    starts = np.arange(len(kept), dtype=np.int64) * layout.width
    absent = pa.repeat(pa.scalar("", pa.string()), len(kept))  # a column the layout lacks
    columns = [texts.take(pa.array(starts + at)) if at >= 0 else absent for at in layout.indices]
    lines = np.array([records[i].line for i in kept], dtype=np.int64)
    runs, rejections = _read(columns, layout.csv, normalizer)
    for i, rejected in rejections.items():
        others[kept[i]] = quarantined(records[kept[i]], rejected)
    if runs is not None:
        runs.lines = pa.array(lines[runs.positions])
        runs.positions = [kept[i] for i in runs.positions]
        _assemble(runs)
    return Batch(records, runs, others, files)


def quarantined(record: CsvRecord, rejected: RowRejected) -> RowOutcome:
    return RowOutcome(record.line, "quarantined", record.raw, rejected.reason, rejected.detail)


class _Failures:
    """Each row's first rejection, rules applied in a row's reading order."""

    def __init__(self, size: int) -> None:
        self.first: dict[int, RowRejected] = {}
        self.failed = np.zeros(size, dtype=bool)

    def add(self, built: Sequence[Any], codes: np.ndarray) -> None:
        """Rows whose distinct value (built[code]) is a RowRejected fail, unless they did."""
        bad = np.array([isinstance(b, RowRejected) for b in built], dtype=bool)
        if bad.any():
            for row in np.flatnonzero(bad[codes] & ~self.failed).tolist():
                self.set(row, built[codes[row]])

    def set(self, row: int, rejected: RowRejected) -> None:
        if not self.failed[row]:
            self.failed[row] = True
            self.first[row] = rejected


def _read(
    columns: list[pa.Array], layout: CsvLayout, normalizer: Normalizer
) -> tuple[Runs | None, dict[int, RowRejected]]:
    """What each row's texts say, each by its rule, column-wise; the rows that fail a rule by
    the first rule they fail."""
    statistics = layout.statistics
    width = len(statistics.names)
    kernel, provider, mode, metric, unit, x_name, x_value = columns[:7]
    values_texts = columns[7 : 7 + width]
    config, gpu, timestamp, version = columns[7 + width :]
    failures = _Failures(len(kernel))
    if normalizer.curation.kernel_names:
        kernel = _curated_kernel_names(kernel, config, normalizer, failures)
    # The numbers are read before the series (which statistics a row holds is part of its
    # series), but a row's rules are applied in its order: the series' before the numbers'.
    number_failures = _Failures(len(kernel))
    stats, optional = [], []
    for name, texts, column in zip(statistics.names, values_texts, statistics.columns, strict=True):
        if name in statistics.optional:
            values, held = _spreads(texts, column, number_failures)
            optional.append((name, held))
        else:
            values = _numbers(texts, column, number_failures)
        stats.append(values)

    def series_of(key: tuple[Any, ...]) -> Series | RowRejected:
        absent = {name for (name, _), held in zip(optional, key[6:], strict=True) if not held}
        present = tuple(n for n in statistics.names if n not in absent)
        return _attempt(normalizer.series, *key[:6], statistics, present)

    series, series_ids = _encode(
        [kernel, provider, mode, gpu, metric, unit, *(held for _, held in optional)], series_of
    )
    failures.add(series, series_ids)
    for row, rejected in sorted(number_failures.first.items()):
        failures.set(row, rejected)
    first_stamps, stamp_ids = _distinct([timestamp])
    stamp_list = (epoch_stamps if layout.epoch else stamps)(timestamp.take(first_stamps))
    failures.add(stamp_list, stamp_ids)
    workloads, workload_ids = _encode(
        [kernel, x_name, x_value, config], lambda k: _attempt(normalizer.workload, *k)
    )
    failures.add(workloads, workload_ids)
    versions, version_ids = _encode([version], lambda k: k[0].strip())
    scale = np.array([s.scale if isinstance(s, Series) else 1.0 for s in series])[series_ids]
    with np.errstate(invalid="ignore"):  # an absent statistic is NaN, and stays NaN
        rounded = stored_values(np.stack(stats, axis=1), scale[:, None])
    for row in np.flatnonzero(~safe_columns(rounded) & ~failures.failed).tolist():
        largest = max(float(s[row]) for s in stats if not np.isnan(s[row]))
        failures.set(row, RowRejected(Reason.BAD_NUMBER, f"value out of range: {largest!r}"))
    index = np.flatnonzero(~failures.failed)
    if not len(index):
        return None, failures.first
    series, series_ids = _used(series, series_ids[index])
    workloads, workload_ids = _used(workloads, workload_ids[index])
    stamp_list, stamp_ids = _used(stamp_list, stamp_ids[index])
    versions, version_ids = _used(versions, version_ids[index])
    runs = Runs(
        positions=index.tolist(),
        series=series,  # type: ignore[arg-type]  # the rows kept have a Series
        series_ids=series_ids,
        workloads=workloads,  # type: ignore[arg-type]
        workload_ids=workload_ids,
        stamps=stamp_list,  # type: ignore[arg-type]
        stamp_ids=stamp_ids,
        stats=[s[index] for s in stats],
        values=np.nan_to_num(rounded[index], nan=-1).astype(np.int64),
        versions=versions,
        version_ids=version_ids,
    )
    return runs, failures.first


def _used(values: list[Value], codes: np.ndarray) -> tuple[list[Value], np.ndarray]:
    """The values some code names, and the codes renumbered among them."""
    used, codes = np.unique(codes, return_inverse=True)
    return [values[i] for i in used.tolist()], codes.reshape(-1)


def _attempt(build: Callable[..., Value], *args: Any) -> Value | RowRejected:
    try:
        return build(*args)
    except RowRejected as rejected:
        return rejected


def _numbers(texts: pa.Array, column: str, failures: _Failures) -> np.ndarray:
    """A column of number texts as floats: plain decimals column-wise, other texts one by one
    (rules.parse_positive); a text that is no positive number fails its row."""
    plain, values = positive_numbers(texts)
    odd = np.flatnonzero(~plain.to_numpy(zero_copy_only=False))
    if not len(odd):
        return values
    values = values.copy()
    parsed: dict[str, float | RowRejected] = {}
    for row, text in zip(odd.tolist(), texts.take(pa.array(odd)).to_pylist(), strict=True):
        if text not in parsed:
            parsed[text] = _attempt(parse_positive, text, column)
        value = parsed[text]
        if isinstance(value, RowRejected):
            failures.set(row, value)
        else:
            values[row] = value
    return values


def _spreads(texts: pa.Array, column: str, failures: _Failures) -> tuple[np.ndarray, pa.Array]:
    """A column of optional spread texts as floats (NaN where empty) and which rows hold one:
    plain decimals column-wise, other texts one by one (rules.parse_spread)."""
    empty, plain, values = spread_numbers(texts)
    odd = np.flatnonzero(~pc.or_(plain, empty).to_numpy(zero_copy_only=False))
    for row, text in zip(odd.tolist(), texts.take(pa.array(odd)).to_pylist(), strict=True):
        value = _attempt(parse_spread, text, column)
        if isinstance(value, RowRejected):
            failures.set(row, value)
        else:
            values[row] = np.nan if value is None else value
    return values, pc.invert(empty)


def _curated_kernel_names(
    kernel: pa.Array, config: pa.Array, normalizer: Normalizer, failures: _Failures
) -> pa.Array:
    """The kernel column with each name a config picks among (kernelNames) replaced by the
    picked kernel; a row whose config picks none fails."""
    variants = pa.array(list(normalizer.curation.kernel_names), pa.string())
    picks = pc.is_in(kernel, value_set=variants).to_numpy(zero_copy_only=False)
    if not picks.any():
        return kernel
    rows = np.flatnonzero(picks)
    names, codes = _encode(
        [kernel.take(pa.array(rows)), config.take(pa.array(rows))],
        lambda k: _attempt(normalizer.kernel_of, k[0], k[1]),
    )
    texts = kernel.to_pylist()
    for row, code in zip(rows.tolist(), codes.tolist(), strict=True):
        name = names[code]
        if isinstance(name, RowRejected):
            failures.set(row, name)
        else:
            texts[row] = name
    return pa.array(texts, pa.string())


def _encode(
    columns: Sequence[pa.Array], build: Callable[[tuple[Any, ...]], Value]
) -> tuple[list[Value], np.ndarray]:
    """Dictionary-encode the rows of `columns`: the value built once per distinct row (in order
    of first appearance), and each row's index among them."""
    first_rows, codes = _distinct(columns)
    keys = zip(*(column.take(first_rows).to_pylist() for column in columns), strict=True)
    return [build(k) for k in keys], codes


def _distinct(columns: Sequence[pa.Array]) -> tuple[pa.Array, np.ndarray]:
    """The first row of each distinct row of `columns` (in order of first appearance), and each
    row's index among them. Arrow encodes each column; NumPy numbers each row's combination of
    codes."""
    combined, combinations = np.zeros(len(columns[0]), dtype=np.int64), 1
    for column in columns:
        encoded = pc.dictionary_encode(column)
        size = len(encoded.dictionary)
        if combinations * size >= 2**62:  # renumber the combinations seen so far, densely
            combined = np.unique(combined, return_inverse=True)[1]
            combinations = int(combined.max()) + 1
        combined = combined * size + encoded.indices.to_numpy().astype(np.int64)
        combinations *= size
    _, first, codes = np.unique(combined, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return pa.array(first[order]), rank[codes]


def _assemble(rows: Runs) -> None:
    """Fill each run's template holes column by column, then digest every identity."""
    by_series = _Lookup(rows.series_ids)
    by_workload = _Lookup(rows.workload_ids)
    by_stamp = _Lookup(rows.stamp_ids)
    templates = [s.run_template for s in rows.series]

    case_key = by_workload([w.case_key for w in rows.workloads])
    external_ids = pc.binary_join_element_wise(
        by_series([t.external_id_head for t in templates]),
        case_key,
        "/",
        by_stamp([s.form for s in rows.stamps]),
        by_series([t.external_id_tail for t in templates]),
        "",
    )
    names = joined_slugs(
        [
            by_series([t.name_head for t in templates]),
            by_workload([w.case_slug for w in rows.workloads]),
            by_stamp([s.slug for s in rows.stamps]),
        ]
    )
    # The rows' labels: by version and what the curation lacks of their series and workload.
    gap_sets, gap_codes = run_gaps(rows.series, rows.series_ids, rows.workloads, rows.workload_ids)
    label_codes = rows.version_ids * len(gap_sets) + gap_codes
    labels = [run_labels(v, gaps) for v in rows.versions for gaps in gap_sets]
    # A layout's i-th statistic fills v<i> (stored) and s<i> (as written); a run whose row left
    # an optional one empty has a template without those holes (model.Series.run_template).
    holes: dict[str, pa.Array] = {}
    for i, stat in enumerate(rows.stats):
        holes[f"v{i}"] = pa.array(rows.values[:, i]).cast(pa.string())
        holes[f"s{i}"] = _number_texts(stat)
    holes |= {
        "observed_at": by_stamp([s.observed_at_json for s in rows.stamps]),
        "external_id": _json_strings(external_ids, _plain_external_ids(rows, templates)),
        "workload": by_workload([json_string(w.record.digest) for w in rows.workloads]),
        # slugs are ASCII: cutting code units is cutting characters, and nothing is escaped
        "name": pc.binary_join_element_wise(
            '"', pc.utf8_slice_codeunits(names, 0, SHORT_LIMIT), '"', ""
        ),
        "labels": _Lookup(label_codes)([canonical_json(label).decode() for label in labels]),
    }
    labelled = np.array([bool(label) for label in labels])[label_codes]
    codes = rows.series_ids
    metadata = _fill(codes * 2 + labelled, [m for t in templates for m in t.metadata], holes)
    holes["metadata"] = metadata
    manifests = _fill(codes, [t.manifest for t in templates], holes)
    rows.external_ids = external_ids
    rows.digests = _run_digests(manifests, metadata, codes, templates)
    rows.manifests = manifests


class _Lookup:
    """Per-row values from per-distinct values, by the rows' dictionary codes."""

    def __init__(self, codes: np.ndarray) -> None:
        self.codes = pa.array(codes)

    def __call__(self, values: Sequence[Any]) -> pa.Array:
        return pc.take(pa.array(values, pa.string()), self.codes)


def _fill(codes: np.ndarray, templates: Sequence[Template], holes: dict[str, pa.Array]) -> pa.Array:
    """Each row's template (`templates[code]`) with its holes filled. The rows whose templates
    have one order of holes are filled in one column-wise join; a latency run lists its values
    in another order than a memory run, so a batch may have a few such groups."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for code in np.unique(codes).tolist():
        groups.setdefault(templates[code].holes, []).append(code)
    if len(groups) == 1:
        ((order, _),) = groups.items()
        return _join(codes, templates, order, holes)
    parts, at = [], []
    for order, users in groups.items():
        rows = np.flatnonzero(np.isin(codes, users))
        taken = pa.array(rows)
        parts.append(_join(codes[rows], templates, order, {h: holes[h].take(taken) for h in order}))
        at.append(rows)
    return pa.concat_arrays(parts).take(pa.array(np.argsort(np.concatenate(at))))


def _join(
    codes: np.ndarray, templates: Sequence[Template], order: tuple[str, ...], holes: dict[str, Any]
) -> pa.Array:
    """Rows whose templates share `order`: their pieces and holes, joined. A literal piece
    that all rows share is passed once rather than copied to every row."""
    used = np.unique(codes).tolist()
    row_codes = pa.array(codes)
    if not order:  # (joining only literals would give a scalar)
        return pc.take(pa.array([t.pieces[0] for t in templates], pa.string()), row_codes)
    joined: list[Any] = []
    for i, hole in enumerate((*order, None)):
        literals = {templates[code].pieces[i] for code in used}
        if len(literals) == 1:
            joined.append(literals.pop())
        else:
            by_code = [t.pieces[i] if t.holes == order else "" for t in templates]
            joined.append(pc.take(pa.array(by_code, pa.string()), row_codes))
        if hole is not None:
            joined.append(holes[hole])
    return pc.binary_join_element_wise(*joined, "")


def _number_texts(numbers: np.ndarray) -> pa.Array:
    texts = pa.array(numbers).cast(pa.string())
    low, high = ARROW_FLOAT_TEXT
    # (NaN, an absent statistic, is in no template: it is neither odd nor written.)
    odd = np.flatnonzero((numbers < low) | (numbers >= high) | (numbers == np.floor(numbers)))
    if not len(odd):
        return texts
    patched = texts.to_pylist()
    for i in odd:
        patched[i] = number_text(float(numbers[i]))
    return pa.array(patched, pa.string())


def _json_strings(texts: pa.Array, plain: bool) -> pa.Array:
    """JSON string literals of texts; when not all are known `plain` (nothing to escape), the
    texts that need escaping are escaped one by one (rare)."""
    if plain or pc.all(pc.match_substring_regex(texts, r'^[^"\\\x00-\x1f]*$')).as_py():
        return pc.binary_join_element_wise('"', texts, '"', "")
    return pa.array([json_string(v) for v in texts.to_pylist()], pa.string())


_JSON_ESCAPED = re.compile(r'["\\\x00-\x1f]')  # what a JSON string escapes


def _plain_external_ids(rows: Runs, templates: Sequence[Any]) -> bool:
    """Whether no run's externalId has a character JSON escapes: judged on the distinct parts
    it is joined from (series head and tail, case key, stamp), not on every run."""
    parts = [
        *(t.external_id_head + t.external_id_tail for t in templates),
        *(w.case_key for w in rows.workloads),
        *(s.form for s in rows.stamps),
    ]
    return not any(_JSON_ESCAPED.search(part) for part in parts)


def _offsets(strings: pa.Array) -> list[int]:
    """Where each string of an Arrow string array starts in its data buffer, and the end."""
    start = strings.offset
    offsets: list[int] = np.frombuffer(strings.buffers()[1], dtype=np.int32)[
        start : start + len(strings) + 1
    ].tolist()
    return offsets


def utf8_slices(strings: pa.Array) -> Iterator[memoryview]:
    """The UTF-8 bytes of each string of an Arrow string array, without copying them."""
    offsets = _offsets(strings)
    data = memoryview(strings.buffers()[2] or b"")
    return map(data.__getitem__, map(slice, offsets[:-1], offsets[1:]))


def _run_digests(
    manifests: pa.Array, metadata: pa.Array, codes: np.ndarray, templates: Sequence[Any]
) -> pa.Array:
    """Each run's digest: the sha256 of its canonical identity, which is its template's
    identity_head and then its manifest's bytes after the metadata (model.RunTemplate), hashed
    where they lie rather than copied into an identity of their own."""
    heads = {t.identity_head: hashlib.sha256(t.identity_head) for t in templates}
    started = [heads[t.identity_head] for t in templates]
    leads = np.array([t.metadata_lead for t in templates], dtype=np.int64)
    offsets = np.array(_offsets(manifests), dtype=np.int64)
    skip = leads[codes] + pc.binary_length(metadata).to_numpy().astype(np.int64)
    data = memoryview(manifests.buffers()[2] or b"")
    hexes = []
    for code, start, end in zip(
        codes.tolist(), (offsets[:-1] + skip).tolist(), offsets[1:].tolist(), strict=True
    ):
        digest = started[code].copy()
        digest.update(data[start:end])
        hexes.append(digest.hexdigest())
    return pc.binary_join_element_wise("sha256:", pa.array(hexes, pa.string()), "")


# --- a whole file, batch by batch -----------------------------------------------------------
BATCH_ROWS = 4096


def normalized_batches(
    stream: Iterable[bytes], normalizer: Normalizer | None = None, rows: int = BATCH_ROWS
) -> Iterator[Batch]:
    """The batches of a Liger CSV (binary lines: a file opened "rb"), in order, with the file's
    rule applied: a later row with an externalId already seen is quarantined (first one wins).
    Raises NotLigerCsv at once when the header is not Liger's."""
    return batches_of(open_liger_csv(stream), normalizer, rows, SeenKeys())


def batches_of(
    csv_file: LigerCsv, normalizer: Normalizer | None, rows: int, seen: SeenKeys
) -> Iterator[Batch]:
    """The batches of an opened CSV (or of a part of one: `seen` holds the externalIds of the
    parts before it that the caller knows of)."""
    return files_batches([csv_file], normalizer, rows, seen)


def files_batches(
    csv_files: Sequence[LigerCsv], normalizer: Normalizer | None, rows: int, seen: SeenKeys
) -> Iterator[Batch]:
    """The batches of opened CSVs of one header, read one after another: a batch may end inside
    a file and hold the starts of the next ones, so that many small files pay a batch's fixed
    cost together. A file alone is a list of one."""
    assert len({f.columns for f in csv_files}) <= 1, "one header per call"
    if not csv_files:
        return
    layout = Layout.of(csv_files[0].columns)
    normalizer = normalizer or shared_normalizer()
    for records, files in _records_of(csv_files, rows):
        batch = normalize_batch(records, layout, normalizer, files)
        quarantine_duplicates(batch, seen)
        yield batch


def _records_of(
    csv_files: Sequence[LigerCsv], rows: int
) -> Iterator[tuple[list[CsvRecord], np.ndarray]]:
    """The files' records in batches of `rows` (the last one shorter), with each one's file."""
    records: list[CsvRecord] = []
    files: list[np.ndarray] = []
    for index, csv_file in enumerate(csv_files):
        while chunk := list(islice(csv_file.records, rows - len(records))):
            records += chunk
            files.append(np.full(len(chunk), index, dtype=np.int32))
            if len(records) == rows:
                yield records, np.concatenate(files)
                records, files = [], []
    if records:
        yield records, np.concatenate(files)


def batch_outcomes(batch: Batch) -> Iterator[RowOutcome]:
    """A batch's outcomes as RowOutcomes, in input order: a run's records are its manifest as
    the batch wrote it and its series' and workload's shared records."""
    runs = batch.runs
    at = {} if runs is None else {p: i for i, p in enumerate(runs.positions)}
    for position in range(batch.size):
        other = batch.others.get(position)
        if other is not None:
            yield other
            continue
        assert runs is not None
        i = at[position]
        series = runs.series[runs.series_ids[i]]
        workload = runs.workloads[runs.workload_ids[i]]
        stamp = runs.stamps[runs.stamp_ids[i]]
        run = Record(
            "BenchmarkRun", runs.digests[i].as_py(), manifest_json=runs.manifests[i].as_py()
        )
        facts = series.facts(
            present_values(series, runs.values[i]),
            stamp.observed_at,
            runs.external_ids[i].as_py(),
            workload,
            runs.versions[runs.version_ids[i]],
        )
        record = batch.records[position]
        yield RowOutcome(
            record.line,
            "ok",
            record.raw,
            records=[run, *references(series, workload)],
            facts=facts,
        )


def present_values(series: Series, values: np.ndarray) -> list[int]:
    """A run's stored values of the statistics its row holds, in its layout's order."""
    names = series.statistics.names
    return [int(values[names.index(name)]) for name in series.present]


def quarantine_duplicates(batch: Batch, seen: SeenKeys) -> None:
    """Quarantine each run whose externalId an earlier row of its file had. A run's key is its
    file's index and its externalId: a run in two files of one batch is no duplicate."""
    runs = batch.runs
    if runs is None:
        return
    files = batch.files[runs.positions].tolist()
    first = seen.first_times_of_digests(digests_of(utf8_slices(runs.external_ids), files))
    for i in np.flatnonzero(~first).tolist():
        position = runs.positions[i]
        record = batch.records[position]
        batch.others[position] = duplicate(record.line, record.raw, runs.external_ids[i].as_py())


def duplicate(line: int, raw: str, external_id: str) -> RowOutcome:
    """The outcome of a row whose run has the externalId of an earlier row of its file."""
    detail = f"externalId {external_id} already appeared earlier in this file (first one wins)"
    return RowOutcome(line, "quarantined", raw, Reason.DUPLICATE_EXTERNAL_ID, detail)


def write_json_lines(batch: Batch, out: BinaryIO) -> None:
    """Write a batch's `kindex normalize` lines, in input order, as RowOutcome.json_line writes
    them. A run's line is its own part (line number, digest, run manifest) and then its
    series' and workload's shared records, written from the same bytes every time: os.writev
    gathers them, so the ~5 KB of shared records per line are never copied in this process."""
    parts = _line_parts(batch)
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):  # io.BytesIO and the like
        out.write(b"".join(parts))
        return
    out.flush()
    for start in range(0, len(parts), IOV_MAX):
        _writev_all(fd, parts[start : start + IOV_MAX])


IOV_MAX = 1024  # os.writev's limit on Linux


def _line_parts(batch: Batch) -> list[bytes | memoryview]:
    runs = batch.runs
    run_parts = [] if runs is None else _run_line_parts(runs)
    if not batch.others:  # every row a run, in order
        return run_parts
    at = {} if runs is None else {p: i for i, p in enumerate(runs.positions)}
    parts: list[bytes | memoryview] = []
    for position in range(batch.size):
        other = batch.others.get(position)
        if other is not None:
            parts.append(other.json_line())
        else:
            i = at[position]
            parts += run_parts[RUN_PARTS * i : RUN_PARTS * (i + 1)]
    return parts


RUN_PARTS = 4  # a run's line: its own part, then its series' and workload's records


@lru_cache(maxsize=1)
def _line_template() -> tuple[Template, bytes, bytes]:
    """RowOutcome.json_line of a run's row as a template over its source line, run digest and
    run manifest, the run's record left open; what closes the run's record; what closes the
    line after the records it references."""
    mark = 987654321987654321
    run = Record("BenchmarkRun", "@@digest@@", manifest_json="@@manifest@@")
    line = RowOutcome(mark, "ok", "", records=[run]).json_line().decode()
    line = line.replace(str(mark), "@@line@@", 1)
    run_close = run.json_bytes.decode().split("@@manifest@@")[1]
    pieces = re.split(r"@@(line|digest|manifest)@@", line)
    assert pieces[-1].startswith(run_close)
    holed = Template((*pieces[0:-1:2], run_close), tuple(pieces[1::2]))
    return holed, b",", pieces[-1][len(run_close) :].encode()


def _run_line_parts(runs: Runs) -> list[bytes | memoryview]:
    """Each run's line as RUN_PARTS parts, one run after another."""
    template, comma, close = _line_template()
    holes = {
        "line": runs.lines.cast(pa.string()),
        "digest": runs.digests,
        "manifest": runs.manifests,
    }
    heads = _join(np.zeros(len(runs.positions), np.int64), [template], template.holes, holes)
    before = [comma + s.references_json[0] + comma for s in runs.series]
    after = [comma + s.references_json[1] + close for s in runs.series]
    workload = [w.record.json_bytes for w in runs.workloads]
    series_ids, workload_ids = runs.series_ids.tolist(), runs.workload_ids.tolist()
    parts: list[bytes | memoryview] = [b""] * (RUN_PARTS * len(series_ids))
    parts[0::RUN_PARTS] = list(utf8_slices(heads))
    parts[1::RUN_PARTS] = list(map(before.__getitem__, series_ids))
    parts[2::RUN_PARTS] = list(map(workload.__getitem__, workload_ids))
    parts[3::RUN_PARTS] = list(map(after.__getitem__, series_ids))
    return parts


def _writev_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    written = os.writev(fd, parts)
    total = sum(map(len, parts))
    if written < total:  # a signal or a full pipe cut the write short: finish it plainly
        rest = b"".join(bytes(p) for p in parts)[written:]
        while rest:
            rest = rest[os.write(fd, rest) :]


def count_outcomes(batch: Batch, counts: Counter[str]) -> None:
    """Add a batch's outcomes to counts by "ok:<metric>" and "quarantined:<reason>"."""
    runs = batch.runs
    if runs is not None:
        memory = np.array([s.memory for s in runs.series])[runs.series_ids]
        kept = np.array([p not in batch.others for p in runs.positions], dtype=bool)
        counts["ok:memory"] += int((memory & kept).sum())
        counts["ok:latency"] += int((~memory & kept).sum())
    for outcome in batch.others.values():
        counts[f"quarantined:{outcome.reason}"] += 1

"""Step 3: a batch of Liger CSV records normalized column by column: the only way runs are made.

Python runs once per distinct series, workload, timestamp and version of a batch, and Arrow's
C++ kernels do the per-row work: checking the numbers, rounding (pipelines/sources/liger/rules.py),
and
splicing each run's canonical JSON from its series' template. Only hashing stays a per-row Python
call. A batch comes as CsvRecords or, from whole lines Arrow parsed, as columns
(read.RecordColumns).

A row is read column-wise when it is plain: well-formed, numbers in plain decimal form, a known
series, workload and timestamp. Any other row is read alone (`normalize.read_record`, by the
same rules' scalar forms), and becomes a quarantine or joins the batch's runs; one row alone is a
batch of one (`assemble_run`). tests/liger_oracle.py builds runs the plain way and the tests hold
the two to the same bytes. Duplicate externalIds are the file's rule (`quarantine_duplicates`).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import lru_cache
from itertools import islice
from typing import Any, BinaryIO, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.intake.seen_keys import SeenKeys, digests_of
from pipelines.records import Record, RowOutcome, RunFacts
from pipelines.records.canonical import number_text
from pipelines.sources.liger.normalize import (
    Layout,
    Normalizer,
    RowRead,
    Series,
    Workload,
    duplicate_outcome,
    json_string,
    read_record,
    shared_normalizer,
    version_json,
)
from pipelines.sources.liger.read import CsvRecord, LigerCsv, RecordColumns, open_liger_csv
from pipelines.sources.liger.rules import (
    FIELD_LIMIT,
    NAME_LIMIT,
    RowRejected,
    Stamp,
    in_range,
    positive_numbers,
    stamps,
    stored_values,
)

# Where Arrow's float formatting is ECMAScript's (tests/test_liger_columnar.py); numbers outside
# it are formatted by canonical.number_text.
ARROW_FLOAT_TEXT = (1e-6, 1e10)

Value = TypeVar("Value")


@dataclass(slots=True)
class PlainRuns:
    """The runs of a batch's plain rows, column by column (row order kept)."""

    positions: list[int]  # each run's index in the batch
    lines: pa.Array  # int64 source lines
    external_ids: pa.Array
    digests: pa.Array  # "sha256:<hex>"
    manifests: pa.Array  # each run's manifest as JSON (sorted keys)
    series: list[Series | None]  # each run's series, by index in series_ids
    series_ids: np.ndarray
    workloads: list[Workload | None]
    workload_ids: np.ndarray
    values: np.ndarray  # int64 (median, p20, p80) in ns or bytes, one row per run
    stamps: list[Stamp | None]  # by stamp_ids
    stamp_ids: np.ndarray
    versions: list[str]  # liger_version stripped, by version_ids
    version_ids: np.ndarray


@dataclass(slots=True)
class Batch:
    """A batch's outcomes: its plain rows as columns, every other row as a RowOutcome."""

    size: int
    runs: PlainRuns | None
    others: dict[int, RowOutcome]  # by index in the batch
    run_lines: list[bytes | memoryview] | None = None  # the runs' line parts, once built


def normalize_batch(
    records: Sequence[CsvRecord] | RecordColumns, layout: Layout, normalizer: Normalizer
) -> Batch:
    """A batch's runs and quarantines. The rows the columns cannot read (odd numbers or
    timestamps, names that slug to nothing, malformed records) are read one by one
    (`normalize.read_record`); every run, of either kind, is then assembled column-wise."""
    candidates, columns, lines = _candidate_columns(records, layout)
    plain, rows = _plain_rows(len(records), candidates, columns, lines, normalizer)
    others: dict[int, RowOutcome] = {}
    read: list[tuple[int, int, RowRead]] = []
    for i in np.flatnonzero(~plain).tolist():
        row = read_record(records[i], layout, normalizer)
        if isinstance(row, RowOutcome):
            others[i] = row
        else:
            read.append((i, records[i].line, row))
    if read:
        rows = _read_rows(read) if rows is None else _joined(rows, _read_rows(read))
    return Batch(len(records), None if rows is None else _assemble(rows), others)


def assemble_run(row: RowRead) -> tuple[Record, RunFacts]:
    """One row's run: a batch of one."""
    runs = _assemble(_read_rows([(0, 0, row)]))
    run = Record("BenchmarkRun", runs.digests[0].as_py(), manifest_json=runs.manifests[0].as_py())
    facts = row.series.facts(
        row.values, row.stamp.observed_at, runs.external_ids[0].as_py(), row.workload, row.version
    )
    return run, facts


def _read_rows(read: Sequence[tuple[int, int, RowRead]]) -> _Rows:
    """Rows read one by one, as the columns of a batch (shared series and workloads once)."""
    each_series: list[Series | None] = [r.series for _, _, r in read]
    each_workload: list[Workload | None] = [r.workload for _, _, r in read]
    each_stamp: list[Stamp | None] = [r.stamp for _, _, r in read]
    series, series_ids = _codes(each_series)
    workloads, workload_ids = _codes(each_workload)
    stamp_list, stamp_ids = _codes(each_stamp)
    versions, version_ids = _codes([r.version for _, _, r in read])
    stats = np.array([r.stats for _, _, r in read], dtype=np.float64).reshape(-1, 3)
    return _Rows(
        positions=[position for position, _, _ in read],
        lines=pa.array([line for _, line, _ in read], pa.int64()),
        series=series,
        series_ids=series_ids,
        workloads=workloads,
        workload_ids=workload_ids,
        stamps=stamp_list,
        stamp_ids=stamp_ids,
        stats=[stats[:, 0], stats[:, 1], stats[:, 2]],
        values=np.array([r.values for _, _, r in read], dtype=np.int64).reshape(-1, 3),
        versions=versions,
        version_ids=version_ids,
    )


def _codes(values: Sequence[Value]) -> tuple[list[Value], np.ndarray]:
    """Distinct values (by identity: the normalizer's caches share them) and each one's code."""
    index: dict[int, int] = {}
    distinct: list[Value] = []
    codes = np.empty(len(values), dtype=np.int64)
    for i, value in enumerate(values):
        code = index.setdefault(id(value), len(distinct))
        if code == len(distinct):
            distinct.append(value)
        codes[i] = code
    return distinct, codes


def _joined(a: _Rows, b: _Rows) -> _Rows:
    """Two sets of rows as one, in batch order."""
    positions = np.array(a.positions + b.positions, dtype=np.int64)
    order = np.argsort(positions, kind="stable")

    def ids(a_ids: np.ndarray, b_ids: np.ndarray, a_values: Sequence[Any]) -> np.ndarray:
        return np.concatenate([a_ids, b_ids + len(a_values)])[order]

    lines = np.concatenate([a.lines.to_numpy(), b.lines.to_numpy()])
    return _Rows(
        positions=positions[order].tolist(),
        lines=pa.array(lines[order]),
        series=[*a.series, *b.series],
        series_ids=ids(a.series_ids, b.series_ids, a.series),
        workloads=[*a.workloads, *b.workloads],
        workload_ids=ids(a.workload_ids, b.workload_ids, a.workloads),
        stamps=[*a.stamps, *b.stamps],
        stamp_ids=ids(a.stamp_ids, b.stamp_ids, a.stamps),
        stats=[np.concatenate([x, y])[order] for x, y in zip(a.stats, b.stats, strict=True)],
        values=np.concatenate([a.values, b.values])[order],
        versions=[*a.versions, *b.versions],
        version_ids=ids(a.version_ids, b.version_ids, a.versions),
    )


def _candidate_columns(
    records: Sequence[CsvRecord] | RecordColumns, layout: Layout
) -> tuple[np.ndarray, list[pa.Array], np.ndarray]:
    """The records that may be plain (well-formed, of the header's width), their ROW_COLUMNS
    texts as string columns, and their source lines."""
    if isinstance(records, RecordColumns):
        every = np.arange(len(records), dtype=np.int64)
        fitting = _all(pc.less_equal(pc.utf8_length(c), FIELD_LIMIT) for c in records.columns)
        if not pc.all(fitting).as_py():  # a row with a field past the limit takes the row path
            kept = np.flatnonzero(fitting.to_numpy(zero_copy_only=False))
            columns = [records.columns[i].take(pa.array(kept)) for i in layout.indices]
            return kept, columns, records.first_line + kept
        return every, [records.columns[i] for i in layout.indices], records.first_line + every
    candidates = [
        i
        for i, r in enumerate(records)
        if r.error is None
        and r.fields is not None
        and len(r.fields) == layout.width
        and max(map(len, r.fields)) <= FIELD_LIMIT
    ]
    picked = [layout.pick(records[i].fields or []) for i in candidates]
    columns = [pa.array(column, pa.string()) for column in zip(*picked, strict=True)]
    lines = np.array([records[i].line for i in candidates], dtype=np.int64)
    return np.array(candidates, dtype=np.int64), columns, lines


def _encode(
    columns: Sequence[pa.Array], build: Callable[[tuple[Any, ...]], Value | None]
) -> tuple[list[Value | None], np.ndarray]:
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


def _plain_rows(
    size: int,
    candidates: np.ndarray,
    columns: list[pa.Array],
    lines: np.ndarray,
    normalizer: Normalizer,
) -> tuple[np.ndarray, _Rows | None]:
    """Which of `size` records are plain (a mask), and their rows."""
    plain = np.zeros(size, dtype=bool)
    if not len(candidates):
        return plain, None
    (kernel, provider, mode, metric, unit, x_name, x_value, median, p20, p80,
     config, gpu, timestamp, version) = columns  # fmt: skip
    if normalizer.curation.kernel_names:
        kernel = _curated_kernel_names(kernel, config, normalizer)

    series, series_ids = _encode(
        [kernel, provider, mode, gpu, metric, unit],
        lambda k: _known(lambda: normalizer.series(*k)),
    )
    kernels = normalizer.curation.kernels
    workloads, workload_ids = _encode(
        [kernel, x_name, x_value, config],
        lambda k: _known(lambda: normalizer.workload(*k)) if k[0] in kernels else None,
    )
    first_stamps, stamp_ids = _distinct([timestamp])
    stamp_list = stamps(timestamp.take(first_stamps))
    versions, version_ids = _encode([version], lambda k: k[0].strip())
    numbers = [positive_numbers(t) for t in (median, p20, p80)]
    numeric = _all(plain for plain, _ in numbers)
    stats = [values for _, values in numbers]

    good_series = np.array([s is not None and _nameable(s) for s in series])[series_ids]
    good_workload = np.array([w is not None and bool(w.case_slug) for w in workloads])[workload_ids]
    good_stamp = np.array([s is not None and bool(s.slug) for s in stamp_list])[stamp_ids]
    scale = np.array([s.scale if s is not None else 1.0 for s in series])[series_ids]
    rounded = stored_values(np.stack(stats, axis=1), scale[:, None])
    keep = (
        numeric.to_numpy(zero_copy_only=False)
        & good_series
        & good_workload
        & good_stamp
        & in_range(rounded)
    )
    rows = np.flatnonzero(keep)
    if not len(rows):
        return plain, None
    plain[candidates[rows]] = True
    return plain, (
        _Rows(
            positions=candidates[rows].tolist(),
            lines=pa.array(lines[rows]),
            series=series,
            series_ids=series_ids[rows],
            workloads=workloads,
            workload_ids=workload_ids[rows],
            stamps=stamp_list,
            stamp_ids=stamp_ids[rows],
            stats=[s[rows] for s in stats],
            values=rounded[rows].astype(np.int64),
            versions=versions,  # type: ignore[arg-type]  # strip() never gives None
            version_ids=version_ids[rows],
        )
    )


def _curated_kernel_names(kernel: pa.Array, config: pa.Array, normalizer: Normalizer) -> pa.Array:
    """The kernel column with each name a config picks among (kernelNames) replaced by the
    picked kernel; a row whose config picks none keeps its name, which no series knows, and so
    takes the row path (which says why)."""
    variants = pa.array(list(normalizer.curation.kernel_names), pa.string())
    picks = pc.is_in(kernel, value_set=variants).to_numpy(zero_copy_only=False)
    if not picks.any():
        return kernel
    rows = np.flatnonzero(picks)
    names, codes = _encode(
        [kernel.take(pa.array(rows)), config.take(pa.array(rows))],
        lambda k: _known(lambda: normalizer.kernel_of(k[0], k[1])),
    )
    texts = kernel.to_pylist()
    for row, code in zip(rows.tolist(), codes.tolist(), strict=True):
        texts[row] = names[code] if names[code] is not None else texts[row]
    return pa.array(texts, pa.string())


@dataclass(slots=True)
class _Rows:
    positions: list[int]
    lines: pa.Array
    series: list[Series | None]  # None: not a known series (its rows are not plain)
    series_ids: np.ndarray
    workloads: list[Workload | None]
    workload_ids: np.ndarray
    stamps: list[Stamp | None]
    stamp_ids: np.ndarray
    stats: list[np.ndarray]
    values: np.ndarray
    versions: list[str]  # stripped
    version_ids: np.ndarray


def _assemble(rows: _Rows) -> PlainRuns:
    """Fill each run's template holes column by column, then digest every identity."""
    by_series = _Lookup(rows.series_ids)
    by_workload = _Lookup(rows.workload_ids)
    by_stamp = _Lookup(rows.stamp_ids)
    by_version = _Lookup(rows.version_ids)
    templates = [s.run_template if s is not None else None for s in rows.series]

    stamp = by_stamp([s.form if s else "" for s in rows.stamps])
    case_key = by_workload([w.case_key if w else "" for w in rows.workloads])
    external_ids = pc.binary_join_element_wise(
        by_series([t.external_id_head if t else "" for t in templates]),
        case_key,
        "/",
        stamp,
        by_series([t.external_id_tail if t else "" for t in templates]),
        "",
    )
    holes: dict[str, pa.Array] = {
        "v0": pa.array(rows.values[:, 0]).cast(pa.string()),
        "v1": pa.array(rows.values[:, 1]).cast(pa.string()),
        "v2": pa.array(rows.values[:, 2]).cast(pa.string()),
        "s0": _number_texts(rows.stats[0]),
        "s1": _number_texts(rows.stats[1]),
        "s2": _number_texts(rows.stats[2]),
        "observed_at": by_stamp([s.observed_at_json if s else "" for s in rows.stamps]),
        "external_id": _json_strings(external_ids, _plain_external_ids(rows, templates)),
        "workload": by_workload([w.digest_json if w else "" for w in rows.workloads]),
        "name": _name_json(by_series, by_workload, by_stamp, templates, rows),
        "version": by_version([version_json(v) for v in rows.versions]),
    }
    codes = rows.series_ids
    labelled = np.array([bool(v) for v in rows.versions])[rows.version_ids]
    metadata = _fill(
        codes * 2 + labelled,
        [m for t in templates for m in ((t.unlabelled, t.labelled) if t else ("", ""))],
        holes,
    )
    holes["metadata"] = metadata
    manifests = _fill(codes, [t.full_manifest if t else "" for t in templates], holes)
    return PlainRuns(
        positions=rows.positions,
        lines=rows.lines,
        external_ids=external_ids,
        digests=_run_digests(manifests, metadata, codes, templates),
        manifests=manifests,
        series=rows.series,
        series_ids=rows.series_ids,
        workloads=rows.workloads,
        workload_ids=rows.workload_ids,
        values=rows.values,
        stamps=rows.stamps,
        stamp_ids=rows.stamp_ids,
        versions=rows.versions,
        version_ids=rows.version_ids,
    )


class _Lookup:
    """Per-row values from per-distinct values, by the rows' dictionary codes."""

    def __init__(self, codes: np.ndarray) -> None:
        self.codes = pa.array(codes)

    def __call__(self, values: Sequence[Any]) -> pa.Array:
        return pc.take(pa.array(values), self.codes)


_HOLE = re.compile(r"%\((\w+)\)s")


def _fill(codes: np.ndarray, templates: Sequence[str], holes: dict[str, pa.Array]) -> pa.Array:
    """Each row's template (`templates[code]`) with its holes filled, in one column-wise join.
    Templates may order their holes differently (a latency and a memory run list their values
    in another order): the join runs over slots that hold every used template's order in turn,
    and a row leaves the slots its template lacks empty. A literal piece that all rows share is
    passed once rather than copied to every row."""
    split = {code: _split(templates[code]) for code in np.unique(codes).tolist()}
    slots = _common_order([order for _, order in split.values()])
    spread = {code: _spread(pieces, order, slots) for code, (pieces, order) in split.items()}
    row_codes = pa.array(codes)
    joined: list[Any] = []
    for i in range(len(slots) + 1):
        literals = {literal for literal, _ in (s[i] for s in spread.values())}
        if len(literals) == 1 and slots:  # (with no hole at all, a scalar would be the result)
            joined.append(literals.pop())
        else:
            by_code = [spread[c][i][0] if c in spread else "" for c in range(len(templates))]
            joined.append(pc.take(pa.array(by_code, pa.string()), row_codes))
        if i == len(slots):
            break
        hole = holes[slots[i]]
        users = [code for code, s in spread.items() if s[i][1]]
        if len(users) < len(spread):  # the rows of other templates leave this slot empty
            hole = pc.if_else(pa.array(np.isin(codes, users)), hole, "")
        joined.append(hole)
    return pc.binary_join_element_wise(*joined, "")


def _common_order(orders: Sequence[tuple[str, ...]]) -> tuple[str, ...]:
    """A short sequence holding each order as a subsequence."""
    common: tuple[str, ...] = ()
    for order in dict.fromkeys(orders):
        common = _supersequence(common, order)
    return common


def _supersequence(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    """A sequence holding `a` and `b` as subsequences: their matching blocks (difflib) once, and
    between those what each has in turn."""
    merged: list[str] = []
    for tag, a_start, a_end, b_start, b_end in SequenceMatcher(None, a, b).get_opcodes():
        merged += a[a_start:a_end]
        if tag != "equal":
            merged += b[b_start:b_end]
    return tuple(merged)


def _spread(
    pieces: tuple[str, ...], order: tuple[str, ...], slots: tuple[str, ...]
) -> list[tuple[str, bool]]:
    """A template's literal pieces laid over `slots` (its order is a subsequence of them): for
    each slot, the literal before it and whether the template fills it; then the last piece."""
    spread = [("", False)] * len(slots) + [(pieces[-1], False)]
    at = 0
    for piece, hole in zip(pieces, order, strict=False):
        at = slots.index(hole, at)
        spread[at] = (piece, True)
        at += 1
    return spread


@lru_cache(maxsize=4096)
def _split(template: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A %-format template's literal pieces and, between them, its holes' names."""
    parts = _HOLE.split(template)
    return tuple(p.replace("%%", "%") for p in parts[0::2]), tuple(parts[1::2])


def _number_texts(numbers: np.ndarray) -> pa.Array:
    texts = pa.array(numbers).cast(pa.string())
    low, high = ARROW_FLOAT_TEXT
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


def _plain_external_ids(rows: _Rows, templates: Sequence[Any]) -> bool:
    """Whether no run's externalId has a character JSON escapes: judged on the distinct parts
    it is joined from (series head and tail, case key, stamp), not on every run."""
    parts = [
        *(t.external_id_head + t.external_id_tail for t in templates if t),
        *(w.case_key for w in rows.workloads if w),
        *(s.form for s in rows.stamps if s),
    ]
    return not any(_JSON_ESCAPED.search(part) for part in parts)


def _name_json(
    by_series: _Lookup,
    by_workload: _Lookup,
    by_stamp: _Lookup,
    templates: Sequence[Any],
    rows: _Rows,
) -> pa.Array:
    """'"<name>"': the slugs of the series' constant parts, the case key and the stamp, joined
    and cut at NAME_LIMIT (slugs are ASCII, so cutting code units is cutting characters)."""
    name = pc.binary_join_element_wise(
        by_series([t.name_head if t else "" for t in templates]),
        by_workload([w.case_slug if w else "" for w in rows.workloads]),
        by_stamp([s.slug if s else "" for s in rows.stamps]),
        "-",
    )
    cut = pc.utf8_slice_codeunits(name, 0, NAME_LIMIT)
    named = pc.binary_join_element_wise('"', cut, '"', "")
    whole = (
        np.array([bool(t and t.name_head) for t in templates])[rows.series_ids]
        & np.array([bool(w and w.case_slug) for w in rows.workloads])[rows.workload_ids]
        & np.array([bool(s and s.slug) for s in rows.stamps])[rows.stamp_ids]
    )
    if whole.all():
        return named
    # A part that slugs to nothing: the name is the slug of the parts joined (rules.joined_slug).
    names = named.to_pylist()
    for i in np.flatnonzero(~whole).tolist():
        series = rows.series[rows.series_ids[i]]
        workload = rows.workloads[rows.workload_ids[i]]
        stamp = rows.stamps[rows.stamp_ids[i]]
        assert series is not None and workload is not None and stamp is not None
        names[i] = json_string(series.name(workload, stamp.form))
    return pa.array(names, pa.string())


def _offsets(strings: pa.Array) -> list[int]:
    """Where each string of an Arrow string array starts in its data buffer, and the end."""
    start = strings.offset
    return np.frombuffer(strings.buffers()[1], dtype=np.int32)[
        start : start + len(strings) + 1
    ].tolist()


def utf8_slices(strings: pa.Array) -> Iterator[memoryview]:
    """The UTF-8 bytes of each string of an Arrow string array, without copying them."""
    offsets = _offsets(strings)
    data = memoryview(strings.buffers()[2] or b"")
    return map(data.__getitem__, map(slice, offsets[:-1], offsets[1:]))


def _run_digests(
    manifests: pa.Array, metadata: pa.Array, codes: np.ndarray, templates: Sequence[Any]
) -> pa.Array:
    """Each run's digest: the sha256 of its canonical identity, which is its template's
    identity_head and then its manifest's bytes after the metadata (normalize.split_identity),
    hashed where they lie rather than copied into an identity of their own."""
    heads = {t.identity_head: hashlib.sha256(t.identity_head) for t in templates if t}
    started = [heads[t.identity_head] if t else None for t in templates]
    leads = np.array([t.metadata_lead if t else 0 for t in templates], dtype=np.int64)
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


def _all(masks: Any) -> pa.Array:
    result = None
    for mask in masks:
        result = mask if result is None else pc.and_(result, mask)
    return result


def _known(build: Callable[[], Value]) -> Value | None:
    try:
        return build()
    except RowRejected:
        return None


def _nameable(series: Series) -> bool:
    return bool(series.run_template.name_head)


# --- a whole file, batch by batch -----------------------------------------------------------
BATCH_ROWS = 4096


def normalized_batches(
    stream: Iterable[bytes], normalizer: Normalizer | None = None, rows: int = BATCH_ROWS
) -> Iterator[Batch]:
    """The batches of a Liger CSV (binary lines: a file opened "rb"), in order, with the file's
    rule applied: a later row with an externalId already seen is quarantined (first one wins).
    Raises NotLigerCsv at once when the header is not Liger's."""
    return (batch for batch, _ in _batches(open_liger_csv(stream), normalizer, rows))


def normalized_outcomes(
    stream: Iterable[bytes], normalizer: Normalizer | None = None, rows: int = BATCH_ROWS
) -> Iterator[RowOutcome]:
    """The same batches' outcomes, one per row, in order (for callers that want rows)."""
    batches = _batches(open_liger_csv(stream), normalizer, rows)
    return (outcome for batch, records in batches for outcome in batch_outcomes(batch, records))


def _batches(
    csv_file: LigerCsv, normalizer: Normalizer | None, rows: int
) -> Iterator[tuple[Batch, list[CsvRecord]]]:
    layout = Layout.of(csv_file.columns)
    normalizer = normalizer or shared_normalizer()
    seen = SeenKeys()
    while records := list(islice(csv_file.records, rows)):
        batch = normalize_batch(records, layout, normalizer)
        quarantine_duplicates(batch, records, seen)
        yield batch, records


def batch_outcomes(
    batch: Batch, records: Sequence[CsvRecord] | RecordColumns
) -> Iterator[RowOutcome]:
    """A batch's outcomes as RowOutcomes, in input order: a plain run's records are its
    manifest as the batch wrote it and its series' and workload's shared records."""
    runs = batch.runs
    plain = {} if runs is None else {p: i for i, p in enumerate(runs.positions)}
    for position in range(batch.size):
        other = batch.others.get(position)
        if other is not None:
            yield other
            continue
        assert runs is not None
        i = plain[position]
        series = runs.series[runs.series_ids[i]]
        workload = runs.workloads[runs.workload_ids[i]]
        stamp = runs.stamps[runs.stamp_ids[i]]
        assert series is not None and workload is not None and stamp is not None
        external_id = runs.external_ids[i].as_py()
        run = Record(
            "BenchmarkRun", runs.digests[i].as_py(), manifest_json=runs.manifests[i].as_py()
        )
        operation, project, implementation, protocol, environment = series.references
        version = runs.versions[runs.version_ids[i]]
        facts = series.facts(
            runs.values[i].tolist(), stamp.observed_at, external_id, workload, version
        )
        record = records[position]
        yield RowOutcome(
            record.line,
            "ok",
            record.raw,
            records=[
                run,
                operation,
                project,
                implementation,
                workload.record,
                protocol,
                environment,
            ],
            facts=facts,
        )


def quarantine_duplicates(
    batch: Batch, records: Sequence[CsvRecord] | RecordColumns, seen: SeenKeys
) -> None:
    """Quarantine each run whose externalId an earlier row of the file had."""
    positions, ids = external_ids(batch)
    first = seen.first_times_of_digests(digests_of(utf8_slices(ids)))
    quarantine_repeats(batch, records, positions, ids, first)


def external_ids(batch: Batch) -> tuple[list[int], pa.Array]:
    """The batch's runs' positions and externalIds (strings), in input order."""
    runs = batch.runs
    others = {p: o.facts.external_id for p, o in batch.others.items() if o.facts is not None}
    if runs is not None and not others:
        return runs.positions, runs.external_ids
    ids: dict[int, str] = {}
    if runs is not None:
        ids = dict(zip(runs.positions, runs.external_ids.to_pylist(), strict=True))
    ids.update(others)
    positions = sorted(ids)
    return positions, pa.array([ids[p] for p in positions], pa.string())


def quarantine_repeats(
    batch: Batch,
    records: Sequence[CsvRecord] | RecordColumns,
    positions: list[int],
    ids: pa.Array,
    first: np.ndarray,
) -> None:
    for i in np.flatnonzero(~first).tolist():
        record = records[positions[i]]
        batch.others[positions[i]] = duplicate_outcome(record.line, record.raw, ids[i].as_py())


def write_json_lines(batch: Batch, out: BinaryIO) -> None:
    """Write a batch's `kindex normalize` lines, in input order, as RowOutcome.json_line writes
    them. A plain run's line is its own part (line number, digest, run manifest) and then its
    series' and workload's shared records, written from the same bytes every time: os.writev
    gathers them, so the ~5 KB of shared records per line are never copied in this process."""
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):  # io.BytesIO and the like
        out.write(b"".join(_line_parts(batch)))
        return
    out.flush()
    write_json_lines_to(fd, batch)


def write_json_lines_to(fd: int, batch: Batch) -> None:
    parts = _line_parts(batch)
    for start in range(0, len(parts), IOV_MAX):
        _writev_all(fd, parts[start : start + IOV_MAX])


IOV_MAX = 1024  # os.writev's limit on Linux


def _line_parts(batch: Batch) -> list[bytes | memoryview]:
    runs = batch.runs
    if runs is None:
        return [batch.others[p].json_line() for p in range(batch.size)]
    run_parts = prepare_lines(batch)
    if not batch.others:
        return run_parts
    parts: list[bytes | memoryview] = []
    run = 0
    plain = runs.positions
    for position in range(batch.size):
        other = batch.others.get(position)
        if other is not None:
            parts.append(other.json_line())
        if run < len(plain) and plain[run] == position:
            if other is None:
                parts += run_parts[RUN_PARTS * run : RUN_PARTS * (run + 1)]
            run += 1
    return parts


def prepare_lines(batch: Batch) -> list[bytes | memoryview]:
    """The parts of the lines of the batch's plain runs, built once: whatever duplicates are
    quarantined later, a kept run's line is the same."""
    if batch.run_lines is None:
        batch.run_lines = _run_line_parts(batch.runs) if batch.runs is not None else []
    return batch.run_lines


RUN_PARTS = 4  # a plain run's line: its own part, then its series' and workload's records


def _run_line_parts(runs: PlainRuns) -> list[bytes | memoryview]:
    """Each plain run's line as RUN_PARTS parts, one run after another."""
    heads = pc.binary_join_element_wise(
        '{"source_line":',
        runs.lines.cast(pa.string()),
        ',"status":"ok","reason":null,"records":[{"kind":"BenchmarkRun","digest":"',
        runs.digests,
        '","manifest":',
        runs.manifests,
        "},",
        "",
    )
    shared_head = [s.references_json[0] + b"," if s else b"" for s in runs.series]
    shared_tail = [s.references_json[1] + b"]}\n" if s else b"" for s in runs.series]
    workload = [w.record.json_bytes + b"," if w else b"" for w in runs.workloads]
    series_ids, workload_ids = runs.series_ids.tolist(), runs.workload_ids.tolist()
    parts: list[bytes | memoryview] = [b""] * (RUN_PARTS * len(series_ids))
    parts[0::RUN_PARTS] = list(utf8_slices(heads))
    parts[1::RUN_PARTS] = list(map(shared_head.__getitem__, series_ids))
    parts[2::RUN_PARTS] = list(map(workload.__getitem__, workload_ids))
    parts[3::RUN_PARTS] = list(map(shared_tail.__getitem__, series_ids))
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
        memory = np.array([s is not None and s.memory for s in runs.series])[runs.series_ids]
        kept = np.array([p not in batch.others for p in runs.positions], dtype=bool)
        counts["ok:memory"] += int((memory & kept).sum())
        counts["ok:latency"] += int((~memory & kept).sum())
    for outcome in batch.others.values():
        if outcome.status == "ok" and outcome.facts is not None:
            counts[f"ok:{outcome.facts.metric}"] += 1
        else:
            counts[f"quarantined:{outcome.reason}"] += 1

"""Liger's 2024 CSV layouts (tests/data/liger/layout_2024_*.csv, verbatim rows of a fork's
committed files: tests/data/NOTICE.md). Liger 0.1.x-0.2.x wrote `y_value_mean,y_value_std`
(do_bench's mean; peak memory's mean and standard deviation); the first script wrote
`y_value` (do_bench's median) with `time.time()` stamps and no liger_version. Each row is a
run that keeps the statistic the file measured, with values exact against the file; the batch
path writes what a row-by-row oracle writes; the layouts go through `kindex normalize` and the
in-process ingest into the index."""

from __future__ import annotations

import csv
import io
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from index_support import index_settings, query
from jsonschema import Draft202012Validator
from liger_oracle import reference_run
from liger_support import DATA, HEADER, SCHEMAS
from test_liger_parity import SCHEMA_FILE
from test_normalize_cli import kindex

from pipelines import ingest
from pipelines.records import RowOutcome
from pipelines.records.record_objects import RecordSetBuilder
from pipelines.records.rules import Reason, safe_columns
from pipelines.sources.liger.columnar import normalized_batches, write_json_lines
from pipelines.sources.liger.model import PARSER_VERSION, Layout, Normalizer, references
from pipelines.sources.liger.read import CsvRecord, NotLigerCsv, open_liger_csv
from pipelines.sources.liger.rules import (
    RowRejected,
    _epoch_stamp,
    kernel_of,
    parse_positive,
    parse_spread,
    parse_timestamp,
    record_rejection,
    stored_values,
)
from pipelines.sources.liger.tables import record_tables

__all__ = ["index_settings"]  # a fixture

MEAN_STD = DATA / "liger" / "layout_2024_mean_std.csv"
MEDIAN_EPOCH = DATA / "liger" / "layout_2024_median_epoch.csv"
NORMALIZER = Normalizer()
DIGEST = "sha256:" + "ab" * 32


def rows_of(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def outcomes(data: bytes, rows: int = 4096) -> list[dict[str, Any]]:
    out = io.BytesIO()
    for batch in normalized_batches(io.BytesIO(data), NORMALIZER, rows):
        write_json_lines(batch, out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def js_round(value: float) -> int:
    """JavaScript's Math.round of a double (the product computed first, as a double)."""
    return math.floor(value + 0.5)


def scale_of(row: dict[str, str]) -> float:
    """Liger's ms are 1e6 ns; its "MB" are MiB."""
    return {"ms": 1e6, "MB": 2.0**20}[row["metric_unit"]]


# --- the header names the layout --------------------------------------------------------------
def test_each_header_names_its_layout_and_others_are_still_refused() -> None:
    assert open_liger_csv(io.BytesIO(MEAN_STD.read_bytes())).layout.name == "mean-std"
    assert open_liger_csv(io.BytesIO(MEDIAN_EPOCH.read_bytes())).layout.name == "median-epoch"
    assert open_liger_csv(io.BytesIO((HEADER + "\n").encode())).layout.name == "quantiles"
    # Half of the old value columns is no layout: the error names what today's header lacks.
    header = HEADER.replace("y_value_50,y_value_20,y_value_80", "y_value_mean")
    with pytest.raises(NotLigerCsv, match="header lacks Liger column"):
        open_liger_csv(io.BytesIO((header + "\n").encode()))


# --- values exact against the file ------------------------------------------------------------
def test_mean_std_rows_are_runs_of_the_mean_with_their_std_exact_against_the_file() -> None:
    rows = rows_of(MEAN_STD)
    lines = outcomes(MEAN_STD.read_bytes())
    assert [line["status"] for line in lines] == ["ok"] * len(rows)
    assert {bool(row["y_value_std"]) for row in rows} == {True, False}  # both kinds held
    for row, line in zip(rows, lines, strict=True):
        run, *refs = line["records"]
        spec = run["manifest"]["spec"]
        scale, unit = scale_of(row), row["metric_unit"].lower()
        mean = js_round(float(row["y_value_mean"]) * scale)
        std = row["y_value_std"]
        memory = row["metric_name"] == "memory"
        metric, stored_unit = ("memory", "bytes") if memory else ("latency", "ns")
        measured = [] if not memory else [("mean", mean)]
        if std:
            measured.append(("std", js_round(float(std) * scale)))
        assert spec.get("measurements", []) == [
            {"metric": metric, "unit": stored_unit, "statistic": s, "value": v} for s, v in measured
        ]
        if memory:
            assert "timing" not in spec
        else:  # a mean is never written as a median
            assert spec["timing"] == {"primaryStatistic": "mean", "latencyNs": {"mean": mean}}
        native = {f"{unit}_mean": float(row["y_value_mean"])}
        if std:
            native[f"{unit}_std"] = float(std)
        assert spec["sourceNative"]["metrics"] == native
        assert spec["observedAt"] == row["timestamp"].replace(" ", "T") + ".000Z"
        by_kind = {r["kind"]: r["manifest"] for r in refs}
        protocol = by_kind["BenchmarkProtocol"]
        assert protocol["spec"]["measurement"]["primaryStatistic"] == "mean"
        assert protocol["metadata"]["name"].endswith(f"-mean-{row['kernel_operation_mode']}")
        hardware = by_kind["ExecutionEnvironment"]["spec"]["hardware"]
        assert (hardware["product"], hardware["architecture"]) == ("NVIDIA A100", "sm_80")
        assert run["manifest"]["metadata"]["labels"] == {"liger_version": row["liger_version"]}
        assert spec["sourceNative"]["externalId"].startswith(
            "/".join([row["kernel_name"], row["kernel_operation_mode"], row["kernel_provider"]])
        )


def test_median_epoch_rows_are_runs_of_the_median_stamped_in_utc() -> None:
    rows = rows_of(MEDIAN_EPOCH)
    lines = outcomes(MEDIAN_EPOCH.read_bytes())
    assert [line["status"] for line in lines] == ["ok"] * len(rows)
    for row, line in zip(rows, lines, strict=True):
        run = line["records"][0]["manifest"]
        spec = run["spec"]
        median = js_round(float(row["y_value"]) * scale_of(row))
        assert spec["timing"] == {"primaryStatistic": "median", "latencyNs": {"median": median}}
        assert "measurements" not in spec  # no spread was written
        assert spec["sourceNative"]["metrics"] == {"ms_value": float(row["y_value"])}
        moment = datetime.fromtimestamp(float(row["timestamp"]), UTC)
        assert spec["observedAt"] == moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:23] + "Z"
        assert spec["sourceNative"]["externalId"].endswith(moment.strftime("/%Y-%m-%d-%H-%M-%S"))
        assert "labels" not in run["metadata"]  # no liger_version, nothing uncurated
        protocol = line["records"][5]["manifest"]
        # do_bench's median, as today's runs: the same protocol, comparable with them.
        assert (
            protocol["metadata"]["name"] == f"liger-bench-do-bench-{row['kernel_operation_mode']}"
        )


def test_every_record_of_both_layouts_validates_against_the_schemas() -> None:
    validators = {
        kind: Draft202012Validator(
            json.loads((SCHEMAS / f"{stem}.v1alpha1.schema.json").read_text())
        )
        for kind, stem in SCHEMA_FILE.items()
    }
    seen: set[str] = set()
    for path in (MEAN_STD, MEDIAN_EPOCH):
        for line in outcomes(path.read_bytes()):
            for record in line["records"]:
                if record["digest"] in seen:
                    continue
                seen.add(record["digest"])
                errors = [
                    e.message for e in validators[record["kind"]].iter_errors(record["manifest"])
                ]
                assert not errors, (record["kind"], errors[:3])
    assert len(seen) > len(rows_of(MEAN_STD)) + len(rows_of(MEDIAN_EPOCH))


# --- the batch path writes what a row-by-row oracle writes ------------------------------------
def oracle_outcome(record: CsvRecord, layout: Layout) -> RowOutcome:
    """One record of an older layout read alone by the rules' scalar forms, in a row's order
    (record, kernel, series, numbers, timestamp, workload, range); its run built the plain way
    (tests/liger_oracle.py)."""
    statistics = layout.statistics
    try:
        rejected = record_rejection(record.fields, record.error, layout.width)
        if rejected is not None:
            raise rejected
        fields = layout.pick(record.fields or [])
        width = len(statistics.names)
        kernel, provider, mode, metric, unit, x_name, x_value = fields[:7]
        texts = dict(zip(statistics.names, fields[7 : 7 + width], strict=True))
        config, gpu, timestamp, version = fields[7 + width :]
        kernel = kernel_of(NORMALIZER.curation, kernel, config)
        present = tuple(
            n for n in statistics.names if n not in statistics.optional or texts[n].strip()
        )
        series = NORMALIZER.series(kernel, provider, mode, gpu, metric, unit, statistics, present)
        stats = []
        for name, column in zip(statistics.names, statistics.columns, strict=True):
            if name in statistics.optional:
                spread = parse_spread(texts[name], column)
                if spread is not None:
                    stats.append(spread)
            else:
                stats.append(parse_positive(texts[name], column))
        if layout.csv.epoch:
            stamp = _epoch_stamp(timestamp)
            if isinstance(stamp, RowRejected):
                raise stamp
            observed_at, form = stamp.observed_at, stamp.form
        else:
            observed_at, form = parse_timestamp(timestamp)
        workload = NORMALIZER.workload(series.kernel, x_name, x_value, config)
        values = stored_values(np.array(stats, dtype=np.float64), series.scale)
        if not safe_columns(values):
            raise RowRejected(Reason.BAD_NUMBER, f"value out of range: {max(stats)!r}")
    except RowRejected as rejected:
        return RowOutcome(record.line, "quarantined", record.raw, rejected.reason, rejected.detail)
    run, facts = reference_run(
        series, workload, stats, [int(v) for v in values], observed_at, form, version.strip()
    )
    records = [run, *references(series, workload)]
    return RowOutcome(record.line, "ok", record.raw, records=records, facts=facts)


def oracle_outcomes(data: bytes) -> list[RowOutcome]:
    csv_file = open_liger_csv(io.BytesIO(data))
    layout = Layout.of(csv_file.columns)
    seen: set[str] = set()
    result = []
    for record in csv_file.records:
        outcome = oracle_outcome(record, layout)
        external_id = outcome.facts.external_id if outcome.facts is not None else None
        if external_id is not None and external_id in seen:  # first one wins
            detail = f"externalId {external_id} already appeared earlier in this file"
            outcome = RowOutcome(
                record.line,
                "quarantined",
                record.raw,
                "duplicate_external_id",
                detail + " (first one wins)",
            )
        elif external_id is not None:
            seen.add(external_id)
        result.append(outcome)
    return result


def batch_bytes(data: bytes, rows: int) -> bytes:
    out = io.BytesIO()
    for batch in normalized_batches(io.BytesIO(data), NORMALIZER, rows):
        write_json_lines(batch, out)
    return out.getvalue()


def oracle_bytes(data: bytes) -> bytes:
    return b"".join(o.json_line() for o in oracle_outcomes(data))


@pytest.mark.parametrize("path", [MEAN_STD, MEDIAN_EPOCH], ids=lambda p: p.stem)
def test_the_batch_path_writes_the_oracles_bytes(path: Path) -> None:
    data = path.read_bytes()
    expected = oracle_bytes(data)
    for rows in (1, 7, 4096):
        assert batch_bytes(data, rows) == expected, rows


@pytest.mark.parametrize("path", [MEAN_STD, MEDIAN_EPOCH], ids=lambda p: p.stem)
def test_the_record_tables_equal_the_row_paths(path: Path) -> None:
    data = path.read_bytes()
    builder = RecordSetBuilder(DIGEST, PARSER_VERSION)
    for outcome in oracle_outcomes(data):
        builder.add(outcome)
    expected = builder.tables()
    for rows in (5, 4096):
        got = record_tables(io.BytesIO(data), DIGEST, PARSER_VERSION, NORMALIZER, rows)[1]
        for name, table in expected.items():
            assert got[name].equals(table), (name, rows)
    runs = expected["runs"].to_pylist()
    column, held = ("mean", "median") if path == MEAN_STD else ("median", "mean")
    value = "y_value_mean" if path == MEAN_STD else "y_value"
    assert [(run[column], run[held], run["p20"], run["p80"]) for run in runs] == [
        (js_round(float(row[value]) * scale_of(row)), None, None, None) for row in rows_of(path)
    ]


def _damaged(path: Path, **changes: str) -> str:
    """The first row of a sample with some fields changed, as a CSV line."""
    row = rows_of(path)[0] | changes
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(row.values())
    return out.getvalue()


MEAN_DAMAGES = [
    ({"y_value_std": "-0.5"}, Reason.NON_POSITIVE_VALUE),
    ({"y_value_std": "abc"}, Reason.BAD_NUMBER),
    ({"y_value_std": "1e400"}, Reason.BAD_NUMBER),
    ({"y_value_mean": ""}, Reason.BAD_NUMBER),
    ({"y_value_mean": "0"}, Reason.NON_POSITIVE_VALUE),
    ({"y_value_mean": "1e300"}, Reason.BAD_NUMBER),
    ({"timestamp": "1725304642.5"}, Reason.BAD_TIMESTAMP),  # an epoch in the dated layout
    ({"extra_benchmark_config_str": "{"}, Reason.BAD_CONFIG_JSON),
    ({"y_value_std": " 1e-3"}, None),  # read by the full grammar
    ({"y_value_std": "  "}, None),  # blank: no std
    ({"y_value_std": "0", "metric_name": "memory", "metric_unit": "MB"}, None),
    ({"gpu_name": "NVIDIA H300", "kernel_provider": "triton"}, None),  # uncurated, a run
]
EPOCH_DAMAGES = [
    ({"timestamp": "yesterday"}, Reason.BAD_TIMESTAMP),
    ({"timestamp": "2024-08-28 00:04:32"}, Reason.BAD_TIMESTAMP),
    ({"timestamp": "99999999999999"}, Reason.BAD_TIMESTAMP),
    ({"y_value": "-1"}, Reason.NON_POSITIVE_VALUE),
    ({"timestamp": " 1724803472 "}, None),
]


@pytest.mark.parametrize(
    ("path", "changes", "reason"),
    [(MEAN_STD, *d) for d in MEAN_DAMAGES] + [(MEDIAN_EPOCH, *d) for d in EPOCH_DAMAGES],
)
def test_a_malformed_row_is_quarantined_with_its_line_and_raw_text_and_the_rest_lands(
    path: Path, changes: dict[str, str], reason: Reason | None
) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    damaged = _damaged(path, **changes)  # in place of the first row (line 2)
    data = "\r\n".join([lines[0], lines[2], damaged, *lines[3:]]).encode() + b"\r\n"
    got = outcomes(data, rows=3)
    assert len(got) == len(lines) - 1
    assert [g["status"] for i, g in enumerate(got) if i != 1] == ["ok"] * (len(lines) - 2)
    if reason is None:
        assert got[1]["status"] == "ok"
    else:
        assert (got[1]["status"], got[1]["reason"], got[1]["source_line"]) == (
            "quarantined",
            reason,
            3,
        )
        assert got[1]["detail"]
    # The quarantine row keeps the raw text (the index's quarantine table).
    tables = record_tables(io.BytesIO(data), DIGEST, PARSER_VERSION, NORMALIZER)[1]
    if reason is not None:
        assert tables["quarantine"].to_pylist()[0]["raw"] == damaged
    assert batch_bytes(data, 2) == oracle_bytes(data)


sample_lines = st.sampled_from(
    MEAN_STD.read_text(encoding="utf-8").splitlines()[1:]
    + [_damaged(MEAN_STD, **d) for d, _ in MEAN_DAMAGES]
    + ["", "garbage", ",".join(["x"] * 3)]
)


@settings(max_examples=40, deadline=None)
@given(st.lists(sample_lines, min_size=1, max_size=25), st.integers(min_value=1, max_value=9))
def test_generated_mean_std_files_same_bytes(lines: list[str], rows: int) -> None:
    header = MEAN_STD.read_text(encoding="utf-8").splitlines()[0]
    data = ("\n".join([header, *lines]) + "\n").encode()
    assert batch_bytes(data, rows) == oracle_bytes(data)


def test_the_mean_std_columns_read_through_the_row_scalar_rules_alike() -> None:
    """The column-wise spread check agrees with parse_spread on the texts it reads plainly."""
    from pipelines.sources.liger.rules import spread_numbers

    texts = ["", " ", "0", "0.0", "12.5", "007.25", "1e-3", "-1", "x"]
    empty, plain, values = spread_numbers(pa.array(texts, pa.string()))
    for text, is_empty, is_plain, value in zip(
        texts, empty.to_pylist(), plain.to_pylist(), values.tolist(), strict=True
    ):
        if is_empty:
            assert parse_spread(text, "c") is None
        elif is_plain:
            assert parse_spread(text, "c") == value


# --- through `kindex normalize` and the in-process ingest -------------------------------------
def test_kindex_normalize_reads_both_layouts() -> None:
    result = kindex("normalize", "--summary", str(MEAN_STD), str(MEDIAN_EPOCH))
    assert result.returncode == 0, result.stderr
    mean_rows, epoch_rows = rows_of(MEAN_STD), rows_of(MEDIAN_EPOCH)
    memory = sum(r["metric_name"] == "memory" for r in mean_rows)
    assert f"rows: {len(mean_rows) + len(epoch_rows)}" in result.stdout
    assert f"memory runs: {memory}" in result.stdout
    assert "quarantined: 0" in result.stdout


def test_ingested_the_runs_land_in_the_index_with_the_statistic_the_file_measured(
    s3_store: Any, index_settings: Any
) -> None:
    summary = ingest.ingest_paths(
        [MEAN_STD, MEDIAN_EPOCH], index_settings, progress=False, store=s3_store
    )
    assert [(f.runs, f.quarantined) for f in summary.files] == [
        (len(rows_of(MEAN_STD)), 0),
        (len(rows_of(MEDIAN_EPOCH)), 0),
    ]
    got = query(
        index_settings,
        "SELECT source_line, median, p20, p80, mean, metric, gpu, liger_version FROM runs"
        f" WHERE source_key = 'incoming/{MEAN_STD.name}' ORDER BY source_line",
    )
    rows = rows_of(MEAN_STD)
    assert len(got) == len(rows)
    for (_, median, p20, p80, mean, metric, gpu, version), row in zip(got, rows, strict=True):
        assert (median, p20, p80) == (None, None, None)
        assert mean == js_round(float(row["y_value_mean"]) * scale_of(row))
        assert metric == ("memory" if row["metric_name"] == "memory" else "latency")
        assert (gpu, version) == (row["gpu_name"], row["liger_version"])
    epoch = query(
        index_settings,
        "SELECT median, mean, liger_version FROM runs"
        f" WHERE source_key = 'incoming/{MEDIAN_EPOCH.name}' ORDER BY source_line",
    )
    assert epoch == [
        (js_round(float(row["y_value"]) * scale_of(row)), None, None)
        for row in rows_of(MEDIAN_EPOCH)
    ]

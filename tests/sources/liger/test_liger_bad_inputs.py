"""A corpus of bad Liger CSVs: each row gets the right outcome, and nothing raises a traceback."""

from __future__ import annotations

import csv
import io

import pytest
from liger_support import HEADER, csv_lines

from pipelines.records import RowOutcome
from pipelines.sources import normalize_object
from pipelines.sources.liger.columnar import Batch, normalized_batches
from pipelines.sources.liger.normalize import NotLigerCsv, normalize_bytes
from pipelines.sources.liger.rules import FIELD_LIMIT

GOOD = csv_lines([2212])[0]  # the B200 jsd seed row
GOOD_FIELDS = next(csv.reader([GOOD]))


def row_with(**changes: str) -> str:
    columns = HEADER.split(",")
    fields = list(GOOD_FIELDS)
    for column, value in changes.items():
        fields[columns.index(column)] = value
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="").writerow(fields)
    return buffer.getvalue()


def normalize_text(*rows: str, newline: str = "\n") -> list[RowOutcome]:
    return list(normalize_bytes(newline.join([HEADER, *rows]).encode() + newline.encode()))


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (GOOD.rsplit(",", 1)[0], "wrong_column_count"),  # a column missing
        (GOOD + ",extra", "wrong_column_count"),
        (row_with(extra_benchmark_config_str='{"vocab_size": 128256, "bsz": 1'), "bad_config_json"),
        (row_with(extra_benchmark_config_str="[1, 2]"), "bad_config_json"),
        (
            row_with(extra_benchmark_config_str='{"vocab_size": NaN, "bsz": 1, "seq_len": 1}'),
            "bad_config_json",
        ),
        (row_with(y_value_50="NaN"), "bad_number"),
        (row_with(y_value_50="nan"), "bad_number"),
        (row_with(y_value_20="inf"), "bad_number"),
        (row_with(y_value_80="1e999"), "bad_number"),
        (row_with(y_value_80="9" * 400), "bad_number"),  # a plain decimal past float's range
        (row_with(y_value_50="1_000"), "bad_number"),
        (row_with(y_value_50="fast"), "bad_number"),
        (row_with(y_value_50=""), "bad_number"),
        (row_with(y_value_50="-3.5"), "non_positive_value"),
        (row_with(y_value_50="0"), "non_positive_value"),
        (row_with(y_value_20="0.0"), "non_positive_value"),
        # A unit no curated metric converts, or another metric's: no rule stores the number.
        (row_with(metric_unit="furlongs"), "unknown_metric"),
        (row_with(metric_name="throughput", metric_unit="tokens/s"), "unknown_metric"),
        (row_with(metric_unit="MB"), "unknown_metric"),  # speed in memory's unit
        (row_with(timestamp="yesterday"), "bad_timestamp"),
        (row_with(timestamp="2026-02-30 10:00:00"), "bad_timestamp"),
    ],
)
def test_bad_row_is_quarantined_and_the_rest_of_the_file_lands(row: str, reason: str) -> None:
    outcomes = normalize_text(GOOD, row, row_with(timestamp="2026-05-27 17:14:31"))
    assert [o.status for o in outcomes] == ["ok", "quarantined", "ok"]
    bad = outcomes[1]
    assert (bad.reason, bad.source_line, bad.raw) == (reason, 3, row)
    assert bad.detail and bad.records == []


@pytest.mark.parametrize(
    "row",
    [
        row_with(x_name="Q"),
        row_with(x_value="1024.5"),
        row_with(extra_benchmark_config_str='{"bsz": 1, "seq_len": 8192}'),
        row_with(extra_benchmark_config_str='{"vocab_size": 2, "bsz": 1, "seq_len": 2, "q": 1}'),
        row_with(extra_benchmark_config_str='{"vocab_size": "big", "bsz": 1, "seq_len": 8192}'),
        # Sizes past 2**53 - 1: JSON numbers cannot hold them exactly.
        row_with(x_value="9007199254740993"),
        row_with(x_value="9" * 30),
        row_with(
            extra_benchmark_config_str='{"vocab_size": 9007199254740993, "bsz": 1, "seq_len": 8192}'
        ),
    ],
)
def test_a_config_shape_no_one_curated_is_an_uncurated_run(row: str) -> None:
    """x and a config that bind no curated axes: a run of an uncurated workload, its parameters
    as they stand, marked so on the run and the workload; two such configs, two workloads."""
    good, run, other = normalize_text(GOOD, row, row_with(timestamp="2026-05-27 17:14:31"))
    assert [good.status, run.status, other.status] == ["ok", "ok", "ok"]
    assert run.facts is not None and run.facts.case_key.startswith("uncurated-")
    assert run.records[0].manifest["metadata"]["labels"]["curation"] == "uncurated"
    assert run.records[4].manifest["metadata"]["labels"] == {
        "curation": "uncurated",
        "uncurated": "config",
    }
    assert run.records[4].digest != good.records[4].digest
    (again,) = normalize_text(row)
    assert again.records[0].digest == run.records[0].digest


def test_duplicate_external_id_first_one_wins() -> None:
    outcomes = normalize_text(GOOD, GOOD, row_with(y_value_50="9.9"))
    assert [o.status for o in outcomes] == ["ok", "quarantined", "quarantined"]
    assert {o.reason for o in outcomes[1:]} == {"duplicate_external_id"}
    assert [o.source_line for o in outcomes] == [2, 3, 4]


def test_crlf_bom_and_reordered_columns_are_read() -> None:
    columns = HEADER.split(",")
    order = list(reversed(range(len(columns))))
    header = ",".join(columns[i] for i in order)
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\r\n").writerow([GOOD_FIELDS[i] for i in order])
    data = "\ufeff".encode() + (header + "\r\n" + buffer.getvalue()).encode()
    reordered = list(normalize_bytes(data))
    plain = normalize_text(GOOD)
    assert reordered[0].status == "ok"
    assert reordered[0].run and plain[0].run and reordered[0].run.digest == plain[0].run.digest


def test_quoted_field_across_lines_keeps_line_numbers() -> None:
    multiline = row_with(
        extra_benchmark_config_str='{"vocab_size": 128256,\n "bsz": 1, "seq_len": 8192}'
    )
    outcomes = normalize_text(multiline, GOOD)
    assert [(o.source_line, o.status) for o in outcomes] == [(2, "ok"), (4, "quarantined")]
    assert outcomes[1].reason == "duplicate_external_id"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"\n\n", "empty"),
        (bytes(range(256)) * 64, "UTF-8|NUL"),
        (b"\x89PNG\r\n\x1a\n" + bytes(500), "UTF-8"),
        (b"a,b,c\n1,2,3\n", "lacks Liger column"),
        (b'{"projects": []}', "lacks Liger column"),
    ],
)
def test_not_a_liger_csv_is_a_clear_error(data: bytes, message: str) -> None:
    with pytest.raises(NotLigerCsv, match=message):
        list(normalize_bytes(data))


def test_not_a_liger_csv_becomes_one_quarantine_outcome_in_the_pipeline() -> None:
    result = normalize_object("incoming/garbage.bin", bytes(range(256)) * 8)
    outcomes = list(result.outcomes)
    assert len(outcomes) == 1 and outcomes[0].status == "quarantined"
    assert outcomes[0].reason and outcomes[0].detail


def test_header_only_gives_no_rows() -> None:
    assert normalize_text() == []


def test_binary_garbage_rows_after_a_valid_header() -> None:
    data = (
        (HEADER + "\n" + GOOD + "\n").encode()
        + b"\xff\xfe\x00garbage,\x81\n"
        + (GOOD + "\n").encode()
    )
    outcomes = list(normalize_bytes(data))
    assert [o.status for o in outcomes] == ["ok", "quarantined", "quarantined"]
    assert outcomes[1].reason == "bad_encoding" and outcomes[1].source_line == 3
    assert outcomes[2].reason == "duplicate_external_id"


def test_ten_megabyte_line_is_quarantined_without_a_traceback() -> None:
    huge = row_with(extra_benchmark_config_str='{"pad": "' + "x" * (10 * 2**20) + '"}')
    outcomes = normalize_text(GOOD, huge, row_with(timestamp="2026-05-27 17:14:31"))
    assert [o.status for o in outcomes] == ["ok", "quarantined", "ok"]
    assert outcomes[1].reason == "field_too_large"
    assert len(outcomes[1].raw) > 10 * 2**20


@pytest.mark.parametrize("column", ["x_label", "extra_benchmark_config_str", "liger_version"])
def test_a_field_past_the_size_bound_is_quarantined(column: str) -> None:
    """A 10 MB x_label (a caption the normalizer never reads) or any other field is
    quarantined, and the rows around it land."""
    huge = row_with(**{column: "x" * (10 * 2**20)})
    just_fits = row_with(x_label="y" * FIELD_LIMIT, timestamp="2026-05-27 17:14:31")
    rows = [GOOD, huge, just_fits]
    data = "\n".join([HEADER, *rows]).encode() + b"\n"
    outcomes = normalize_text(*rows)
    assert [(o.status, o.reason) for o in outcomes] == _batch_outcomes(
        next(normalized_batches(io.BytesIO(data)))
    )
    assert [(o.status, o.reason) for o in outcomes] == [
        ("ok", None), ("quarantined", "field_too_large"), ("ok", None)
    ]  # fmt: skip
    assert outcomes[1].raw == huge and f"over the limit of {FIELD_LIMIT}" in str(outcomes[1].detail)


def _batch_outcomes(batch: Batch) -> list[tuple[str, str | None]]:
    assert batch.runs is not None
    outcomes = {p: ("ok", None) for p in batch.runs.positions}
    outcomes.update({p: (o.status, o.reason) for p, o in batch.others.items()})
    return [outcomes[p] for p in range(batch.size)]


def test_unterminated_quote_swallows_no_row_silently() -> None:
    broken = GOOD.replace('"{', '"{', 1)[:-5] + '"oops'
    outcomes = normalize_text(GOOD, broken, row_with(timestamp="2026-05-27 17:14:31"))
    assert outcomes[0].status == "ok"
    assert outcomes[1].status == "quarantined"
    assert sum(len(o.raw.splitlines()) for o in outcomes) == 3  # every line is accounted for

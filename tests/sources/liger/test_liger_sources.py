"""Every source implements one interface (pipelines/sources/__init__.py) and the source of an
object is
chosen there only: by content, first match wins, an object none recognizes is one outcome."""

from __future__ import annotations

from pathlib import Path

from liger_support import LIGER_CSV

from pipelines.records.record_objects import LINEAGE_SCHEMA
from pipelines.records.rules import Reason
from pipelines.sources import (
    SOURCES,
    LigerCsvSource,
    SourceContext,
    Unrecognized,
    normalize_object,
    source_of,
)


def test_each_source_recognizes_its_own_bytes_and_no_other() -> None:
    csv = LIGER_CSV.read_bytes()
    names = {source.name for source in SOURCES}
    assert {"liger-csv", "worker-bundle"} <= names
    recognized = [s.name for s in SOURCES if s.recognize("incoming/a.csv", csv) is None]
    assert recognized == ["liger-csv"]
    garbage = bytes(range(256)) * 8
    whys = [s.recognize("incoming/a.bin", garbage) for s in SOURCES]
    assert all(whys), whys


def test_the_chosen_source_names_the_result_and_builds_its_records() -> None:
    result = normalize_object("incoming/a.csv", LIGER_CSV.read_bytes())
    assert isinstance(result.reader, LigerCsvSource)
    assert result.source == "liger-csv" and result.parser_version.startswith("liger-csv/")
    garbage = normalize_object("incoming/a.bin", b"a,b\n1,2\n")
    assert isinstance(garbage.reader, Unrecognized) and garbage.source == "unrecognized"
    (outcome,) = garbage.outcomes
    assert outcome.reason == "unrecognized_format"
    assert "lacks Liger column" in (outcome.detail or "")


def test_reasons_are_one_table_of_codes() -> None:
    codes = {reason.value for reason in Reason}
    assert len(codes) == len(Reason)
    readme = (Path(__file__).parents[3] / "README.md").read_text()
    assert all(f"`{code}`" in readme for code in codes), sorted(
        c for c in codes if f"`{c}`" not in readme
    )


def test_a_small_csv_record_set_keeps_its_lineage_in_its_runs(tmp_path: Path) -> None:
    """Read in batches (not on every core), a Liger CSV's record set writes no lineage object:
    every run's lineage row is its own, the runs object's lineage columns."""
    data = LIGER_CSV.read_bytes()
    source = source_of("incoming/a.csv", data)
    content = source.record_set(data, "sha256:" + "0" * 64, SourceContext(), tmp_path)
    assert content.lineage_in_runs
    runs, lineage = content.tables["runs"], content.tables["lineage"]
    assert content.row_count("lineage") == runs.num_rows == lineage.num_rows > 0
    assert runs.select(LINEAGE_SCHEMA.names).equals(lineage)

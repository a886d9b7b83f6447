"""`kindex normalize` of a file cut into parts, normalized in worker processes: the same bytes
and counts as one pass in this process, whatever lies across the cuts."""

from __future__ import annotations

import io
import random
from collections import Counter
from pathlib import Path

import pytest
from liger_support import LIGER_CSV

from pipelines.sources.liger import normalize
from pipelines.sources.liger.normalize import NotLigerCsv, write_outcomes


def odd_file(path: Path, rows: int = 900) -> Path:
    """The shared CSV's first rows with what a cut must not change: runs repeated from far
    earlier (duplicate externalIds across parts), quoted line breaks, bad UTF-8, blank lines,
    CRLF, short rows, a quote left open to the end."""
    lines = LIGER_CSV.read_bytes().split(b"\n")
    header, data = lines[0], lines[1 : rows + 1]
    chosen = random.Random(28)
    out = [header]
    for i, row in enumerate(data):
        pick = chosen.random()
        if pick < 0.05 and i > 50:
            out.append(data[chosen.randrange(0, 50)])  # a duplicate
        elif pick < 0.08:
            out.append(row.replace(b'{""', b'{\n""', 1).replace(b'}"', b'\n}"', 1))
            continue
        elif pick < 0.09:
            out.append(b"garbage,row")
        elif pick < 0.10:
            out.append(b"")
        elif pick < 0.11:
            out.append(row.replace(b"liger", b"lig\xff\xfeer", 1))
        elif pick < 0.12:
            out.append(row + b"\r")
        out.append(row)
    out.append(b'a,"never closed')
    path.write_bytes(b"\n".join(out) + b"\n")
    return path


def outcomes(path: Path, **options: int) -> tuple[bytes, Counter[str]]:
    out = io.BytesIO()
    counts = write_outcomes(path, out, **options)
    return out.getvalue(), counts


def test_parts_write_what_one_pass_writes(tmp_path: Path) -> None:
    path = odd_file(tmp_path / "odd.csv")
    whole, whole_counts = outcomes(path, workers=1)
    assert whole_counts["quarantined:duplicate_external_id"] > 10
    for part_bytes in (20_000, 7_000):  # cuts fall inside quoted line breaks too
        lines, counts = outcomes(path, workers=2, part_bytes=part_bytes)
        assert lines == whole
        assert counts == whole_counts
        _, summary = outcomes(path, workers=2, part_bytes=part_bytes)  # counts alone
        assert summary == whole_counts


def test_a_cut_inside_a_record_reads_the_rest_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quoted field whose line break a cut falls on: the parts before stand, the rest of the
    file is read in this process from the torn part's start."""
    path = odd_file(tmp_path / "odd.csv", rows=300)
    whole, whole_counts = outcomes(path, workers=1)
    text = path.read_bytes()
    broken = text.index(b'{\n""')  # the first quoted line break
    calls = []
    in_process = normalize._in_process

    def spy(*args: object) -> None:
        calls.append(args[2])
        in_process(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(normalize, "_in_process", spy)
    part_bytes = broken - text.index(b"\n") - 1  # the first part ends inside that field
    lines, counts = outcomes(path, workers=2, part_bytes=part_bytes)
    assert (lines, counts) == (whole, whole_counts)
    assert [cut.start for cut in calls] == [text.index(b"\n") + 1]  # from the first part on


def test_parts_copied_to_a_file_by_the_kernel(tmp_path: Path) -> None:
    path = odd_file(tmp_path / "odd.csv")
    whole, _ = outcomes(path, workers=1)
    target = tmp_path / "lines.jsonl"
    with target.open("wb") as out:
        write_outcomes(path, out, workers=2, part_bytes=10_000)
    assert target.read_bytes() == whole


def test_not_a_liger_csv_raises_before_any_part(tmp_path: Path) -> None:
    path = tmp_path / "other.csv"
    path.write_bytes(b"a,b,c\n" + b"1,2,3\n" * 10_000)
    out = io.BytesIO()
    with pytest.raises(NotLigerCsv):
        write_outcomes(path, out, workers=2, part_bytes=1_000)
    assert out.getvalue() == b""

"""A burst of files dropped at once under a real `kindex up`: every object ends indexed or
quarantined by itself, the good files' runs equal an in-process `kindex ingest` of the same
files, nothing is missing at rest, and `kindex backfill 'incoming/*' --wait` over all of them
succeeds. `benchmarks/burst.py` does the same with 2,000 files and prints the rates."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from process_support import KindexUp
from process_support import kindex_up as kindex_up  # the fixture

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from burst import drop_burst, ingest_in_process, odd_objects, small_files  # noqa: E402

pytestmark = pytest.mark.slow

FILES = 24
ODD = 3  # a 999-byte key, a binary file, a file in no format


def test_a_burst_lands_whole_and_equals_in_process_ingest(
    kindex_up: KindexUp, tmp_path: Path
) -> None:
    paths = small_files(tmp_path / "files", FILES, 20)
    kindex_up.start()

    burst = drop_burst(kindex_up, paths, odd_objects(paths[0]))

    print(
        f"\n{burst.files} files: last one {burst.drop_to_last_file_s:.1f} s after the drop "
        f"({burst.files / burst.drop_to_last_file_s:.1f} files/s), "
        f"peak RSS {burst.peak_rss_bytes / 2**20:.0f} MiB"
    )
    assert burst.missing == 0
    assert burst.quarantined_files == 2  # the binary file and the text, each by itself
    ingest = ingest_in_process(tmp_path / "ingest-home", paths)
    assert (burst.runs, burst.fingerprint) == (ingest.runs, ingest.fingerprint)
    assert burst.runs > 0

    kindex_up.backfill("incoming/*")

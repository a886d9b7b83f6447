"""Progress bars: on stderr when it is a terminal, counting bytes or rows, never steps."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import Any

import pytest

KINDEX = str(Path(sys.executable).with_name("kindex"))
LIGER_CSV = Path(__file__).parent / "data" / "liger" / "all_benchmark_data.csv"


def with_terminal_stderr(args: list[str], stdout: Path, cwd: Path) -> tuple[int, str]:
    """Run `kindex ARGS` with stderr on a pseudo-terminal; its exit code and what it showed."""
    primary, secondary = pty.openpty()
    # rows and columns of a terminal (a new pseudo-terminal has none: bars would be empty)
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))
    with stdout.open("wb") as out:
        process = subprocess.Popen([KINDEX, *args], stdout=out, stderr=secondary, cwd=cwd)
    os.close(secondary)
    shown = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the terminal closed: the process is done
            break
        if not chunk:
            break
        shown += chunk
    os.close(primary)
    return process.wait(timeout=300), shown.decode(errors="replace")


def test_normalize_shows_bytes_read_on_a_terminal(tmp_path: Path) -> None:
    out = tmp_path / "lines.jsonl"
    code, shown = with_terminal_stderr(["normalize", str(LIGER_CSV)], out, tmp_path)
    assert code == 0
    assert re.search(r"100%\|.*\| 631k/631k", shown), shown
    assert len(out.read_bytes().splitlines()) == 2448


def test_normalize_shows_no_bar_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    result = subprocess.run(
        [KINDEX, "normalize", str(LIGER_CSV)], capture_output=True, cwd=tmp_path, timeout=300
    )
    assert result.returncode == 0 and result.stderr == b""


@pytest.mark.slow
def test_ingest_progress_counts_bytes(s3_store: Any, tmp_path: Path) -> None:
    out = tmp_path / "summary.txt"
    code, shown = with_terminal_stderr(["ingest", str(LIGER_CSV)], out, tmp_path)
    assert code == 0, shown
    assert re.search(r"100%\|.*\| 631k/631k", shown), shown
    assert "step" not in shown

"""benchmarks/history.py in its smoke size: the history it builds through the product's writing
code, and its last line, the JSON object of ratios docs/benchmarks.md quotes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from process_support import free_port

from pipelines.storage.embedded import find_free_port_block

ROOT = Path(__file__).resolve().parents[1]
RATIOS = (
    "batch_time_ratio",
    "batch_requests_ratio",
    "batch_rss_ratio",
    "tick_time_ratio",
    "ledger_tick_time_ratio",
    "reconcile_time_ratio",
)


@pytest.mark.slow  # a server, a history and eight measuring processes: a minute or two
def test_the_smoke_history_is_built_and_measured(tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "history.py"),
        "--smoke",
        "--port",
        str(find_free_port_block()),
        "--metrics-port",
        str(free_port()),
        "--home",
        str(tmp_path / "home"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["history_batches"] == 60
    assert result["ledger_rows"] == 3000 and result["ledger_commits"] >= 6
    for key in RATIOS:
        assert math.isfinite(result[key]) and result[key] > 0, (key, result)
    # The history is the product's layout: a sets file per batch (and the template's), the
    # incoming versions and their snapshots.
    sets_files = list((tmp_path / "home").rglob("sets.json"))
    assert len(sets_files) >= 60, len(sets_files)

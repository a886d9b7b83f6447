"""Test-only pause points, so a fault test can stop a real kindex process at an exact step.

When `KINDEX_FAULT_PAUSE` names a point and the process reaches it, the process creates
`$KINDEX_FAULT_DIR/<point>.reached` and waits until `<point>.resume` appears; meanwhile the test
kills the S3 server, or SIGKILLs this process. Outside tests the variable is unset and a point
costs one environment lookup.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PAUSE_ENV = "KINDEX_FAULT_PAUSE"
DIR_ENV = "KINDEX_FAULT_DIR"
POLL_SECONDS = 0.02

# Where the points are: record objects written, summary (the commit mark) not yet; and a new
# index version's tables committed, its `index_versions` row (the commit point) not yet.
RECORD_FILES_WRITTEN = "record-files-written"
INDEX_FILES_WRITTEN = "index-files-written"


def pause_point(name: str) -> None:
    """Wait here for the test when it asked to pause at `name`; return at once otherwise."""
    if os.environ.get(PAUSE_ENV) != name:
        return
    directory = Path(os.environ[DIR_ENV])
    (directory / f"{name}.reached").touch()
    resume = directory / f"{name}.resume"
    while not resume.exists():
        time.sleep(POLL_SECONDS)

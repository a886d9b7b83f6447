"""Regenerate docs/backfill-window.png: a backfill of one arrival window of `records`, launched
as the UI launches it (GraphQL `launchPartitionBackfill`), then the window's partition in the
Dagster UI: the backfill's run materialized it, each file of the window processed again (the
`per_file` table, its attempts), from a running `kindex up` (Debian's chromium, headless).

usage: .venv/bin/python docs/screenshot-backfill.py URL WINDOW [OUT]
  e.g. URL http://127.0.0.1:3000, WINDOW '2026-12-03-14:00'
"""

from __future__ import annotations

import sys
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chromium import browser_page, dismiss_nux, screenshot  # noqa: E402

from pipelines.commands.backfill import launch_window_backfill, wait_for_backfill  # noqa: E402


def main(url: str, window: str, out: Path) -> None:
    base = url.rstrip("/").removesuffix("/graphql")
    endpoint = f"{base}/graphql"
    backfill = launch_window_backfill(endpoint, [window])
    status = wait_for_backfill(endpoint, backfill, timeout=600)
    print(f"backfill {backfill} of {window}: {status}")
    dismiss_nux(base)
    with browser_page() as page:
        partition = urllib.parse.quote(window)
        page.call(
            "Page.navigate", url=f"{base}/assets/records?partition={partition}&view=partitions"
        )
        page.wait_for("document.body && document.body.innerText.includes('per_file')")
        time.sleep(3)
        screenshot(page, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    default = Path(__file__).with_name("backfill-window.png")
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]) if len(sys.argv) > 3 else default)

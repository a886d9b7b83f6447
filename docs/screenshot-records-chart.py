"""Regenerate docs/records-chart.png: a `records` materialization of a batch in the Dagster UI,
its speedup chart open, from a running `kindex up` (Debian's chromium, headless).

usage: .venv/bin/python docs/screenshot-records-chart.py URL WINDOW [OUT]
  e.g. URL http://127.0.0.1:3000, WINDOW '2026-12-03-14:00' (a window holding the Liger CSV)

The chart is markdown metadata, which the UI opens in a dialog: the page is driven over the
DevTools protocol (websockets, which the webserver already depends on) to click it open.
"""

from __future__ import annotations

import sys
import time
import urllib.parse
from pathlib import Path

from chromium import Page, browser_page, dismiss_nux, screenshot

# Click the "Show Markdown" action of the `speedup_chart` metadata entry (the row that names it).
OPEN_CHART = """
(() => {
  const rows = [...document.querySelectorAll('tr')]
    .filter(r => r.innerText.includes('speedup_chart'));
  for (const row of rows) {
    const actions = [...row.querySelectorAll('*')].filter(e => /show markdown/i.test(e.innerText));
    const action = actions[actions.length - 1];  // the innermost: the clickable one
    if (action) { action.click(); return true; }
  }
  return false;
})()
"""


def main(url: str, partition: str, out: Path) -> None:
    base = url.rstrip("/").removesuffix("/graphql")
    dismiss_nux(base)
    page_url = f"{base}/assets/records?" + urllib.parse.urlencode(
        {"view": "partitions", "partition": partition}
    )
    with browser_page() as page:
        shoot(page, page_url, out)
    print(f"wrote {out}")


def shoot(page: Page, page_url: str, out: Path) -> None:
    page.call("Page.navigate", url=page_url)
    page.wait_for("document.body && document.body.innerText.includes('speedup_chart')")
    time.sleep(2)
    if not page.evaluate(OPEN_CHART):
        raise RuntimeError("no speedups chart on the page")
    try:
        page.wait_for("[...document.images].some(i => i.src.startsWith('data:image/png'))")
        time.sleep(1)
    finally:  # what the page showed, also when the chart did not open
        screenshot(page, out)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    default = Path(__file__).with_name("records-chart.png")
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]) if len(sys.argv) > 3 else default)

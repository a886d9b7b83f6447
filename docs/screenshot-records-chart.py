"""Regenerate docs/records-chart.png: a `records` materialization of a backfilled file in the
Dagster UI, its speedup chart open, from a running `kindex up` (Debian's chromium, headless).

usage: .venv/bin/python docs/screenshot-records-chart.py URL PARTITION [OUT]
  e.g. URL http://127.0.0.1:3000, PARTITION 'incoming/all_benchmark_data.csv@5b9b3930'

The chart is markdown metadata, which the UI opens in a dialog: the page is driven over the
DevTools protocol (websockets, which the webserver already depends on) to click it open.
"""

from __future__ import annotations

import base64
import itertools
import json
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
    "--window-size=1600,1100",
]
# Click the "Show Markdown" action of the `speedups` metadata entry (the row that names it).
OPEN_CHART = """
(() => {
  const rows = [...document.querySelectorAll('tr')].filter(r => r.innerText.includes('speedups'));
  for (const row of rows) {
    const actions = [...row.querySelectorAll('*')].filter(e => /show markdown/i.test(e.innerText));
    const action = actions[actions.length - 1];  // the innermost: the clickable one
    if (action) { action.click(); return true; }
  }
  return false;
})()
"""


class Page:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self.ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                raise TimeoutError(expression)
            time.sleep(0.5)


def main(url: str, partition: str, out: Path) -> None:
    base = url.rstrip("/").removesuffix("/graphql")
    # Dagster shows a "join the community" dialog on localhost until it is marked seen.
    request = urllib.request.Request(
        f"{base}/graphql",
        data=json.dumps({"query": "mutation { setNuxSeen }"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=30).read()
    page_url = f"{base}/assets/records?" + urllib.parse.urlencode(
        {"view": "partitions", "partition": partition}
    )
    with tempfile.TemporaryDirectory(prefix="kindex-chromium-") as profile:
        browser = subprocess.Popen(
            ["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 60
            while not port_file.exists() or not port_file.read_text().strip():
                if time.monotonic() > deadline:
                    raise TimeoutError("chromium did not open its DevTools port")
                time.sleep(0.2)
            port = port_file.read_text().split()[0]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as targets:
                target = next(t for t in json.load(targets) if t["type"] == "page")
            with connect(target["webSocketDebuggerUrl"], max_size=64 << 20) as ws:
                shoot(Page(ws), page_url, out)
        finally:
            browser.terminate()
            browser.wait(timeout=30)
    print(f"wrote {out}")


def shoot(page: Page, page_url: str, out: Path) -> None:
    page.call("Page.enable")
    page.call(
        "Emulation.setDeviceMetricsOverride",
        width=1600,
        height=1100,
        deviceScaleFactor=1,
        mobile=False,
    )
    page.call("Page.navigate", url=page_url)
    page.wait_for("document.body && document.body.innerText.includes('speedups')")
    time.sleep(2)
    if not page.evaluate(OPEN_CHART):
        raise RuntimeError("no speedups chart on the page")
    try:
        page.wait_for("[...document.images].some(i => i.src.startsWith('data:image/png'))")
        time.sleep(1)
    finally:  # what the page showed, also when the chart did not open
        shot = page.call("Page.captureScreenshot", format="png")
        out.write_bytes(base64.b64decode(shot["data"]))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    default = Path(__file__).with_name("records-chart.png")
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]) if len(sys.argv) > 3 else default)

"""Headless Debian chromium driven over the DevTools protocol (websockets, which the Dagster
webserver already depends on): what the docs' screenshot scripts share."""

from __future__ import annotations

import base64
import itertools
import json
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
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


def dismiss_nux(base: str) -> None:
    """Dagster shows a "join the community" dialog on localhost until it is marked seen."""
    request = urllib.request.Request(
        f"{base}/graphql",
        data=json.dumps({"query": "mutation { setNuxSeen }"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=30).read()


@contextmanager
def browser_page(width: int = 1600, height: int = 1100) -> Iterator[Page]:
    """A page of a headless chromium, stopped by its PID on the way out."""
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
                page = Page(ws)
                page.call("Page.enable")
                page.call(
                    "Emulation.setDeviceMetricsOverride",
                    width=width,
                    height=height,
                    deviceScaleFactor=1,
                    mobile=False,
                )
                yield page
        finally:
            browser.terminate()
            browser.wait(timeout=30)


def screenshot(page: Page, out: Path) -> None:
    shot = page.call("Page.captureScreenshot", format="png")
    out.write_bytes(base64.b64decode(shot["data"]))

"""Retake the Dagster UI screenshots of docs/ from a fresh `kindex up` (Debian's chromium,
headless), as a new user meets it:

- partitions-new-home.png: `records`' partitions before any file (none: nothing is "missing");
- then the shared Liger CSV is dropped, and once it is indexed the harness samples, in the same
  hour: two batches of one window;
- window-two-batches.png: that window's materialization, both batches counted;
- asset-graph.png: the asset graph, the index materialized and its checks evaluated;
- index-metadata.png: the index's latest materialization (version, counts, who published it);
- runs-table.png: the `runs` table's asset (column schema, row count, Iceberg table, query);
- records-chart.png and backfill-window.png, by their own scripts, on the same window.

usage: .venv/bin/python docs/screenshot-ui.py [--port 3100] [--s3-port 18333]
It starts `kindex up` in a temporary home on 127.0.0.1 and stops it (by its pid) when done.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chromium import Page, browser_page, dismiss_nux, screenshot  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
KINDEX = str(Path(sys.executable).parent / "kindex")
LIGER = ROOT / "tests" / "data" / "liger" / "all_benchmark_data.csv"
HARNESS = sorted(
    p
    for p in (ROOT / "tests" / "data" / "formats").rglob("*")
    if p.is_file() and p.suffix in (".json", ".jsonl")
)


def run_kindex(env: dict[str, str], *args: str) -> str:
    return subprocess.run(
        [KINDEX, *args], env=env, check=True, capture_output=True, text=True, timeout=600
    ).stdout


def files_done(env: dict[str, str]) -> int:
    out = run_kindex(
        env,
        "query",
        "select count(*) as n from files where state <> 'pending'",
        "--format",
        "json",
        "--sync",
    )
    return int(json.loads(out)[0]["n"])


def wait_for(what: str, done: Callable[[], bool], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(2)


def graphql(base: str, query: str, variables: dict[str, object] | None = None) -> dict:
    request = urllib.request.Request(
        f"{base}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.load(response)["data"])


def windows(base: str) -> list[str]:
    query = '{ assetNodeOrError(assetKey: {path: ["records"]}) { ... on AssetNode { %s } } }'
    data = graphql(base, query % "partitionKeys")
    return list(data["assetNodeOrError"]["partitionKeys"])


def shot(page: Page, url: str, ready: str, out: Path, settle: float = 4) -> None:
    page.call("Page.navigate", url=url)
    page.wait_for(f"document.body && document.body.innerText.includes({json.dumps(ready)})")
    time.sleep(settle)
    screenshot(page, out)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=3100)
    parser.add_argument("--s3-port", type=int, default=18333)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="kindex-screens-"))
    env = {**os.environ, "KINDEX_HOME": str(home), "KINDEX_S3_PORT": str(args.s3_port)}
    log = (home / "up.out").open("wb")
    up = subprocess.Popen(
        [KINDEX, "up", "--port", str(args.port)], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{args.port}"
    try:
        wait_for("kindex up", lambda: (home / "up.json").exists(), timeout=180)
        dismiss_nux(base)
        with browser_page() as page:
            records = f"{base}/assets/records?view=partitions"
            shot(page, records, "Partitions", DOCS / "partitions-new-home.png")
            run_kindex(env, "put", str(LIGER))
            wait_for("the Liger CSV indexed", lambda: files_done(env) >= 1)
            run_kindex(env, "put", *map(str, HARNESS))
            total = 1 + len(HARNESS)
            wait_for("the harness files indexed", lambda: files_done(env) >= total)
            time.sleep(10)  # the last run's events
            window = windows(base)[-1]
            partition = urllib.parse.quote(window)
            shot(
                page,
                f"{records}&partition={partition}",
                "this_run_files",
                DOCS / "window-two-batches.png",
            )
            shot(page, f"{base}/asset-groups/kindex", "records", DOCS / "asset-graph.png", 8)
            index = f"{base}/assets/index?view=events"
            shot(page, index, "index_version", DOCS / "index-metadata.png")
            shot(page, f"{base}/assets/runs", "source_key", DOCS / "runs-table.png")
        # The window's speedup chart, then a backfill of the window (their own scripts).
        here = Path(__file__).resolve().parent
        for script in ("screenshot-records-chart.py", "screenshot-backfill.py"):
            subprocess.run([sys.executable, str(here / script), base, window], check=True)
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
        log.close()
        print(f"kindex up stopped; its home and logs: {home}")


if __name__ == "__main__":
    main()

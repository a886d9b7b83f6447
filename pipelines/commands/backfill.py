"""`kindex backfill`: re-process chosen files with the current parser on a running Dagster.

Launches the same partition backfill as the UI, through the GraphQL `launchPartitionBackfill`
mutation (Dagster has no CLI command for it), and prints the backfill id. Files are chosen by a
glob over partition keys (`incoming/liger*`), by having quarantined rows (e.g. after the curation
learned a new GPU name), or all of them.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipelines.forked import pid_alive

UP_FILE = "up.json"  # where `kindex up` says it serves: {"url": ..., "pid": ...}
# Partitions per request: a request's size, and what it asks of Dagster's storage, stay bounded
# however many files there are.
PARTITIONS_PER_REQUEST = 1000
FILE_ASSETS = (["snapshot"], ["records"])
TERMINAL_STATUSES = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}

PARTITIONS_QUERY = """
query ($path: [String!]!) {
  assetNodeOrError(assetKey: {path: $path}) {
    __typename
    ... on AssetNode { partitionKeys }
  }
}"""

MATERIALIZATIONS_QUERY = """
query ($path: [String!]!, $partitions: [String!]) {
  assetNodeOrError(assetKey: {path: $path}) {
    ... on AssetNode {
      latestMaterializationByPartition(partitions: $partitions) {
        partition
        metadataEntries { label ... on IntMetadataEntry { intValue } }
      }
    }
  }
}"""

LAUNCH_MUTATION = """
mutation ($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
    ... on UnauthorizedError { message }
    ... on PartitionSetNotFoundError { message }
    ... on InvalidStepError { invalidStepKey }
    ... on InvalidOutputError { invalidOutputName }
  }
}"""

STATUS_QUERY = """
query ($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill { id status }
    ... on PythonError { message }
  }
}"""


class GraphQLError(RuntimeError):
    pass


class NoInstance(RuntimeError):
    """No running `kindex up` was found, and no --url was given."""


def graphql_url(url: str) -> str:
    """The GraphQL endpoint of a Dagster webserver given by its base URL (or by the endpoint)."""
    base = url.rstrip("/").removesuffix("/graphql")
    return f"{base}/graphql"


def running_instance_url(home: Path) -> str:
    """The URL `kindex up` serves at, from `$KINDEX_HOME/up.json`, if its process is alive."""
    path = home / UP_FILE
    try:
        up = json.loads(path.read_text())
        url, pid = str(up["url"]), int(up["pid"])
    except FileNotFoundError:
        raise NoInstance(
            f"no running `kindex up` in {home} (no {UP_FILE}): start it, or pass --url"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise NoInstance(f"cannot read {path}: {error}; pass --url") from None
    if not pid_alive(pid):
        raise NoInstance(
            f"`kindex up` (pid {pid}, {url}) in {home} is not running: start it, or pass --url"
        )
    return url


def graphql(url: str, query: str, variables: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        payload = json.loads(response.read())
    if payload.get("errors"):
        raise GraphQLError("; ".join(e.get("message", str(e)) for e in payload["errors"]))
    return dict(payload["data"])


def partition_keys(url: str) -> list[str]:
    node = graphql(url, PARTITIONS_QUERY, {"path": ["records"]})["assetNodeOrError"]
    if node["__typename"] != "AssetNode":
        raise GraphQLError(f"no records asset at {url}: {node['__typename']}")
    return list(node["partitionKeys"])


def partitions_with_quarantine(url: str, keys: Sequence[str]) -> list[str]:
    """Files whose latest records materialization reported quarantined rows, asked a bounded
    number of partitions at a time (Dagster answers one latest event per partition)."""
    chosen = []
    for start in range(0, len(keys), PARTITIONS_PER_REQUEST):
        chunk = list(keys[start : start + PARTITIONS_PER_REQUEST])
        data = graphql(url, MATERIALIZATIONS_QUERY, {"path": ["records"], "partitions": chunk})
        events = data["assetNodeOrError"].get("latestMaterializationByPartition") or []
        for key, event in zip(chunk, events, strict=True):
            if event is None:
                continue
            count = next(
                (
                    e.get("intValue") or 0
                    for e in event["metadataEntries"]
                    if e["label"] == "quarantined_rows"
                ),
                0,
            )
            if count > 0:
                chosen.append(key)
    return chosen


def choose(url: str, glob: str | None, quarantined: bool) -> list[str]:
    keys = partition_keys(url)
    if glob:
        keys = [k for k in keys if fnmatch.fnmatchcase(k, glob)]
    if quarantined and keys:
        keys = partitions_with_quarantine(url, keys)
    return keys


def launch_backfill(url: str, keys: Sequence[str], title: str | None = None) -> str:
    params: dict[str, Any] = {
        "assetSelection": [{"path": path} for path in FILE_ASSETS],
        "partitionNames": list(keys),
        "fromFailure": False,
        "tags": [{"key": "kindex/backfill", "value": "cli"}],
    }
    if title:
        params["title"] = title
    result = graphql(url, LAUNCH_MUTATION, {"params": params})["launchPartitionBackfill"]
    if result["__typename"] != "LaunchBackfillSuccess":
        raise GraphQLError(f"{result['__typename']}: {result}")
    return str(result["backfillId"])


def backfill_status(url: str, backfill_id: str) -> str:
    result = graphql(url, STATUS_QUERY, {"id": backfill_id})["partitionBackfillOrError"]
    if result["__typename"] != "PartitionBackfill":
        raise GraphQLError(f"{result['__typename']}: {result}")
    return str(result["status"])


def wait_for(url: str, backfill_id: str, timeout: float, interval: float = 2.0) -> str:
    deadline = time.monotonic() + timeout
    status = backfill_status(url, backfill_id)
    while status not in TERMINAL_STATUSES and time.monotonic() < deadline:
        time.sleep(interval)
        status = backfill_status(url, backfill_id)
    return status


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "backfill",
        help="re-process files with the current parser (a Dagster partition backfill)",
        description=__doc__,
    )
    parser.add_argument("glob", nargs="?", help="partition key glob, e.g. 'incoming/liger*'")
    parser.add_argument(
        "--quarantined",
        action="store_true",
        help="only files whose last processing quarantined rows",
    )
    parser.add_argument(
        "--url",
        help="the Dagster webserver, e.g. http://127.0.0.1:3000 (default: where `kindex up` "
        f"in this home serves, from $KINDEX_HOME/{UP_FILE})",
    )
    parser.add_argument("--wait", action="store_true", help="wait until the backfill finishes")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds --wait waits")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.url:
            url = graphql_url(args.url)
        else:
            from pipelines.settings import Settings

            url = graphql_url(running_instance_url(Settings.from_env().home))
        keys = choose(url, args.glob, args.quarantined)
        if not keys:
            print("kindex backfill: no file matches; nothing launched", file=sys.stderr)
            return 1
        backfill_id = launch_backfill(url, keys, title=f"kindex backfill of {len(keys)} files")
        print(backfill_id, flush=True)
        print(
            f"{len(keys)} files; see {url.removesuffix('/graphql')}/runs/b/{backfill_id}",
            file=sys.stderr,
        )
        if not args.wait:
            return 0
        status = wait_for(url, backfill_id, args.timeout)
        print(status)
        return 0 if status in {"COMPLETED", "COMPLETED_SUCCESS"} else 1
    except NoInstance as error:
        print(f"kindex backfill: {error}", file=sys.stderr)
        return 2
    except (OSError, GraphQLError) as error:
        print(f"kindex backfill: {error}", file=sys.stderr)
        return 2

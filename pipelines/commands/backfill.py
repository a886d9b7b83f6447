"""`kindex backfill`: re-process chosen files with the current parser on a running Dagster.

Files are chosen through the file ledger: by a glob over object keys (`incoming/liger*`, each
key's newest version), by having had quarantined rows, by holding uncurated runs in the index
(`--uncurated`: after the curation learned a new GPU, provider or kernel, the files it turns into
curated runs), or all of them. It launches the `reprocess_files` job with the same choice in its
config (the launchpad takes it too; `--uncurated` passes the chosen keys), through Dagster's
GraphQL `launchRun`, and prints the run's id.
`--window HOUR` instead backfills arrival windows of `records`, as the UI's Launch backfill does
(`launchPartitionBackfill`): every file that arrived in them.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.curation.gaps import CURATION_LABEL, UNCURATED
from pipelines.forked import pid_alive
from pipelines.index.local import open_index, sync_local
from pipelines.intake.ledger import Ledger
from pipelines.settings import Settings
from pipelines.storage.s3 import store_session

if TYPE_CHECKING:
    from pipelines.storage.base import ObjectStore

UP_FILE = "up.json"  # where `kindex up` says it serves: {"url": ..., "pid": ...}
REPROCESS_JOB = "reprocess_files"
TERMINAL_STATUSES = {"SUCCESS", "FAILURE", "CANCELED"}

JOB_LOCATION_QUERY = """
query {
  repositoriesOrError {
    __typename
    ... on RepositoryConnection {
      nodes { name location { name } jobs { name } }
    }
    ... on PythonError { message }
  }
}"""

LAUNCH_MUTATION = """
mutation ($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on InvalidSubsetError { message }
    ... on UnauthorizedError { message }
    ... on PipelineNotFoundError { message }
  }
}"""

LAUNCH_BACKFILL_MUTATION = """
mutation ($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
    ... on UnauthorizedError { message }
    ... on PartitionSetNotFoundError { message }
  }
}"""

BACKFILL_STATUS_QUERY = """
query ($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill { id status }
    ... on PythonError { message }
  }
}"""
BACKFILL_DONE = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}

STATUS_QUERY = """
query ($id: ID!) {
  runOrError(runId: $id) {
    __typename
    ... on Run { id status }
    ... on RunNotFoundError { message }
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


def answer(
    url: str, query: str, variables: dict[str, Any], field: str, typename: str
) -> dict[str, Any]:
    """The `field` of a GraphQL answer, which must be a `typename` (else the error it is)."""
    result: dict[str, Any] = graphql(url, query, variables)[field]
    if result["__typename"] != typename:
        raise GraphQLError(f"{result['__typename']}: {result}")
    return result


def job_selector(url: str, job: str = REPROCESS_JOB) -> dict[str, str]:
    """Where the Dagster instance at `url` serves `job`: its code location and repository."""
    data = answer(url, JOB_LOCATION_QUERY, {}, "repositoriesOrError", "RepositoryConnection")
    for repository in data["nodes"]:
        if any(j["name"] == job for j in repository["jobs"]):
            return {
                "repositoryLocationName": repository["location"]["name"],
                "repositoryName": repository["name"],
                "jobName": job,
            }
    raise GraphQLError(f"no job {job} at {url}")


def reprocess_config(patterns: list[str], quarantined: bool) -> dict[str, Any]:
    return {"ops": {"reprocess": {"config": {"files": patterns, "quarantined": quarantined}}}}


def launch_reprocess(url: str, patterns: list[str], quarantined: bool) -> str:
    params = {
        "selector": job_selector(url),
        "runConfigData": reprocess_config(patterns, quarantined),
        "executionMetadata": {"tags": [{"key": "kindex/backfill", "value": "cli"}]},
    }
    result = answer(url, LAUNCH_MUTATION, {"params": params}, "launchRun", "LaunchRunSuccess")
    return str(result["run"]["runId"])


def launch_window_backfill(url: str, windows: list[str]) -> str:
    """A backfill of these arrival windows of `records`, as the UI launches one."""
    params = {
        "assetSelection": [{"path": ["records"]}],
        "partitionNames": windows,
        "tags": [{"key": "kindex/backfill", "value": "cli"}],
    }
    result = answer(
        url,
        LAUNCH_BACKFILL_MUTATION,
        {"params": params},
        "launchPartitionBackfill",
        "LaunchBackfillSuccess",
    )
    return str(result["backfillId"])


def run_status(url: str, run_id: str) -> str:
    return str(answer(url, STATUS_QUERY, {"id": run_id}, "runOrError", "Run")["status"])


def backfill_status(url: str, backfill_id: str) -> str:
    query, variables = BACKFILL_STATUS_QUERY, {"id": backfill_id}
    return str(
        answer(url, query, variables, "partitionBackfillOrError", "PartitionBackfill")["status"]
    )


def wait_until_done(
    status: Callable[[], str], done: set[str], timeout: float, interval: float = 2.0
) -> str:
    """Poll `status` until it is one of `done` or `timeout` seconds pass; the last status."""
    deadline = time.monotonic() + timeout
    now = status()
    while now not in done and time.monotonic() < deadline:
        time.sleep(interval)
        now = status()
    return now


def wait_for(url: str, run_id: str, timeout: float) -> str:
    return wait_until_done(lambda: run_status(url, run_id), TERMINAL_STATUSES, timeout)


def wait_for_backfill(url: str, backfill_id: str, timeout: float) -> str:
    return wait_until_done(lambda: backfill_status(url, backfill_id), BACKFILL_DONE, timeout)


def chosen_files(patterns: list[str], quarantined: bool, uncurated: bool = False) -> list[str]:
    """The keys of the files the ledger holds that the choice takes (each key's newest
    version); `uncurated`: only those whose content holds uncurated runs in the index."""

    settings = Settings.from_env()
    with store_session(settings) as store:
        entries = Ledger.of(store, settings).select(patterns=patterns, quarantined=quarantined)
        if uncurated:
            held = uncurated_snapshots(store, settings)
            entries = [e for e in entries if e.snapshot_digest in held]
    return [e.key for e in entries]


def uncurated_snapshots(store: ObjectStore, settings: Settings) -> set[str]:
    """The snapshots whose current record set holds uncurated runs (the labels of
    pipelines/curation/gaps.py), in the index's current version."""

    sync_local(store, settings)
    con = open_index(settings)
    try:
        rows = con.execute(
            """SELECT DISTINCT l.snapshot_digest FROM lineage l
               SEMI JOIN (SELECT run_digest FROM runs
                          WHERE json_extract_string(manifest, '$.metadata.labels.' || ?) = ?) u
               USING (run_digest)""",
            [CURATION_LABEL, UNCURATED],
        ).fetchall()
    finally:
        con.close()
    return {str(row[0]) for row in rows}


def backfill_windows(url: str, windows: list[str], wait: bool, timeout: float) -> int:
    backfill_id = launch_window_backfill(url, windows)
    print(backfill_id, flush=True)
    base = url.removesuffix("/graphql")
    print(f"windows {', '.join(windows)}; see {base}/runs/b/{backfill_id}", file=sys.stderr)
    if not wait:
        return 0
    status = wait_for_backfill(url, backfill_id, timeout)
    print(status)
    return 0 if status in {"COMPLETED", "COMPLETED_SUCCESS"} else 1


def follow_run(url: str, run_id: str, what: str, wait: bool, timeout: float) -> int:
    """Print a launched run's id (stdout) and where to see it; with `wait`, its final status:
    the command's exit status."""
    print(run_id, flush=True)
    print(f"{what}; see {url.removesuffix('/graphql')}/runs/{run_id}", file=sys.stderr)
    if not wait:
        return 0
    status = wait_for(url, run_id, timeout)
    print(status)
    return 0 if status == "SUCCESS" else 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "backfill",
        help="re-process files with the current parser (the reprocess_files job)",
        description=__doc__,
    )
    parser.add_argument(
        "glob", nargs="?", default="incoming/*", help="object key glob, e.g. 'incoming/liger*'"
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--quarantined",
        action="store_true",
        help="only files whose last processing quarantined rows",
    )
    which.add_argument(
        "--uncurated",
        action="store_true",
        help="only files whose runs in the index are uncurated (after the curation grew)",
    )
    parser.add_argument(
        "--url",
        help="the Dagster webserver, e.g. http://127.0.0.1:3000 (default: where `kindex up` "
        f"in this home serves, from $KINDEX_HOME/{UP_FILE})",
    )
    parser.add_argument(
        "--window",
        action="append",
        metavar="HOUR",
        help="backfill this arrival window of records instead (e.g. 2026-12-03-14:00; repeat "
        "for more): every file that arrived in it",
    )
    parser.add_argument("--wait", action="store_true", help="wait until the run finishes")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds --wait waits")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    patterns = [args.glob]
    try:
        url = graphql_url(args.url or running_instance_url(Settings.from_env().home))
        if args.window:
            return backfill_windows(url, args.window, args.wait, args.timeout)
        files = chosen_files(patterns, args.quarantined, args.uncurated)
        if not files:
            print("kindex backfill: no file matches; nothing launched", file=sys.stderr)
            return 1
        if args.uncurated:  # the job chooses by glob: each chosen key, matching itself only
            patterns = [glob.escape(key) for key in files]
        run_id = launch_reprocess(url, patterns, args.quarantined)
        return follow_run(url, run_id, f"{len(files)} files", args.wait, args.timeout)
    except NoInstance as error:
        print(f"kindex backfill: {error}", file=sys.stderr)
        return 2
    except (OSError, GraphQLError) as error:
        print(f"kindex backfill: {error}", file=sys.stderr)
        return 2

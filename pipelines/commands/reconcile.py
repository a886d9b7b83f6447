"""`kindex reconcile`: compare incoming/ with the file ledger now, on a running Dagster.

The reconcile sensor compares only what changed since its last tick (the newest S3 Inventory
report, the embedded server's filer log, or a window of keys): it never lists the bucket by
itself. `kindex reconcile --full` lists every object under incoming/ and compares it with the
whole ledger, and the index's `every_version_processed` check is evaluated over that listing;
the versions the ledger lacks become pending rows, which the ledger sensor requests. Without
`--full`, one incremental comparison from the start of its source (the filer log's last
reconcile interval, the newest inventory report, or the first window of keys). It launches the
`reconcile_bucket` job through Dagster's GraphQL `launchRun` and prints the run's id.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pipelines.commands.backfill import (
    LAUNCH_MUTATION,
    UP_FILE,
    GraphQLError,
    NoInstance,
    answer,
    follow_run,
    graphql_url,
    job_selector,
    running_instance_url,
)
from pipelines.settings import Settings

RECONCILE_JOB = "reconcile_bucket"
RECONCILE_OP = "reconcile_incoming"


def reconcile_config(full: bool) -> dict[str, Any]:
    return {"ops": {RECONCILE_OP: {"config": {"full": full}}}}


def launch_reconcile(url: str, full: bool) -> str:
    params = {
        "selector": job_selector(url, RECONCILE_JOB),
        "runConfigData": reconcile_config(full),
        "executionMetadata": {"tags": [{"key": "kindex/reconcile", "value": "cli"}]},
    }
    result = answer(url, LAUNCH_MUTATION, {"params": params}, "launchRun", "LaunchRunSuccess")
    return str(result["run"]["runId"])


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "reconcile",
        help="compare incoming/ with the file ledger now (--full: list the whole bucket)",
        description=__doc__,
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="list every object under incoming/ (what the reconcile sensor never does)",
    )
    parser.add_argument(
        "--url",
        help="the Dagster webserver, e.g. http://127.0.0.1:3000 (default: where `kindex up` "
        f"in this home serves, from $KINDEX_HOME/{UP_FILE})",
    )
    parser.add_argument("--wait", action="store_true", help="wait until the run finishes")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds --wait waits")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        url = graphql_url(args.url or running_instance_url(Settings.from_env().home))
        run_id = launch_reconcile(url, args.full)
        what = "a full listing of incoming/" if args.full else "what changed"
        return follow_run(url, run_id, what, args.wait, args.timeout)
    except NoInstance as error:
        print(f"kindex reconcile: {error}", file=sys.stderr)
        return 2
    except (OSError, GraphQLError) as error:
        print(f"kindex reconcile: {error}", file=sys.stderr)
        return 2

"""The reconcile sensor: nothing dropped falls through unseen.

Each tick judges the bucket (pipelines/intake/reconcile.py): every object version under `incoming/`
must have a snapshot and a record set of the current parser. Versions that lack them are
requested again as partition runs (few runs: contiguous ranges of the partition order), each
version with its own backoff, so a file that fails every time is retried less and less often
and never with the same run key twice. The missing count is in every tick's log and, when it
changes, an observation of the records asset; the index's check reports it too (0 at rest).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from dagster import (
    AssetObservation,
    AssetSelection,
    DefaultSensorStatus,
    MetadataValue,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from assets.files import FILE_ASSETS, RECORDS_KEY
from assets.partitions import INCOMING_FILES
from assets.resources import KindexResource
from assets.sensors import MAX_FILES_PER_RUN, run_requests_for, runs_in_flight
from pipelines.intake.reconcile import reconcile
from pipelines.intake.sensor_cursor import partition_key_for

RECONCILE_INTERVAL_SECONDS = 60
clock = time.time  # the sensor's notion of now (tests move it)
# A version first found missing may just be on its way (listed, its run not started yet).
GRACE_SECONDS = 60.0
FIRST_BACKOFF_SECONDS = 60.0
MAX_BACKOFF_SECONDS = 6 * 3600.0
MAX_RUNS_PER_TICK = 10
# Done partitions between two missing ones that a run may cover rather than start another run
# (redoing a done file costs a few small requests: its record set exists).
MAX_GAP = 16


@dataclass(slots=True)
class Attempt:
    count: int  # runs requested for this version so far
    due_at: float  # time.time() when it may be requested again


@dataclass(slots=True)
class ReconcileState:
    """The sensor's cursor: each missing version's attempts, and the last count reported."""

    attempts: dict[str, Attempt] = field(default_factory=dict)
    last_missing: int | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "attempts": {k: [a.count, round(a.due_at, 3)] for k, a in self.attempts.items()},
                "last_missing": self.last_missing,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | None) -> ReconcileState:
        if not text:
            return cls()
        data = json.loads(text)
        return cls(
            {k: Attempt(int(n), float(due)) for k, (n, due) in data["attempts"].items()},
            data.get("last_missing"),
        )


def backoff_seconds(count: int, rng: random.Random) -> float:
    """Exponential, with jitter so that many failing files do not come back in step."""
    return min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2**count) * rng.uniform(0.8, 1.2)


def due_partitions(
    state: ReconcileState, missing: Sequence[str], now: float, rng: random.Random
) -> list[str]:
    """Update `state` for this tick's missing partitions and return those due for a run."""
    still = set(missing)
    state.attempts = {k: a for k, a in state.attempts.items() if k in still}
    due = []
    for key in missing:
        attempt = state.attempts.get(key)
        if attempt is None:
            state.attempts[key] = Attempt(0, now + GRACE_SECONDS)
        elif attempt.due_at <= now:
            due.append(key)
    return due


def ranges(order: Sequence[str], chosen: Sequence[str]) -> list[list[str]]:
    """The chosen partitions as contiguous ranges of the partition order, merging ranges whose
    gap is at most MAX_GAP partitions."""
    position = {key: i for i, key in enumerate(order)}
    indices = sorted(position[k] for k in chosen if k in position)
    groups: list[list[int]] = []
    for i in indices:
        if groups and i - groups[-1][-1] <= MAX_GAP + 1:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [list(order[g[0] : g[-1] + 1]) for g in groups]


def reconcile_requests(
    state: ReconcileState, order: Sequence[str], due: Sequence[str], now: float, rng: random.Random
) -> list[RunRequest]:
    """Runs for the due partitions; their attempts are counted, and each run key names the
    attempts, so a later request of the same files is a new run, never a repeat."""
    requests: list[RunRequest] = []
    chunks = [
        piece[i : i + MAX_FILES_PER_RUN]
        for piece in ranges(order, due)
        for i in range(0, len(piece), MAX_FILES_PER_RUN)
    ]
    for chunk in chunks[:MAX_RUNS_PER_TICK]:
        for request in run_requests_for(chunk):  # one: the chunk fits one run
            requested = [k for k in chunk if k in state.attempts]
            for key in requested:
                attempt = state.attempts[key]
                attempt.count += 1
                attempt.due_at = now + backoff_seconds(attempt.count, rng)
            text = "\n".join(f"{k}#{state.attempts[k].count}" for k in requested)
            run_key = "reconcile-" + hashlib.sha256(text.encode()).hexdigest()[:24]
            requests.append(
                request.with_replaced_attrs(
                    run_key=run_key, tags={**request.tags, "kindex/reconcile": str(len(requested))}
                )
            )
    return requests


@sensor(
    name="reconcile_sensor",
    description="Finds object versions under incoming/ with no snapshot or no record set of the "
    "current parser, and requests them again with backoff; logs the missing count.",
    minimum_interval_seconds=RECONCILE_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
    asset_selection=AssetSelection.assets(*FILE_ASSETS),
)
def reconcile_sensor(context: SensorEvaluationContext, kindex: KindexResource) -> SensorResult:
    state = ReconcileState.from_json(context.cursor)
    if runs_in_flight(context.instance):
        # A running file may look missing, and judging the bucket lists all of it: wait for
        # the runs to finish (the count is logged again then).
        context.log.info("runs in flight: the bucket is judged once they finish")
        return SensorResult(run_requests=[], cursor=state.to_json())
    found = reconcile(kindex.store, kindex.settings)
    missing = sorted({partition_key_for(m.info) for m in found.missing})
    without_snapshot = sum(1 for m in found.missing if not m.has_snapshot)
    context.log.info(
        f"{found.missing_count} of {found.objects} object versions missing a record set "
        f"({without_snapshot} without a snapshot)"
    )
    now, rng = clock(), random.Random()
    due = due_partitions(state, missing, now, rng)
    requests: list[RunRequest] = []
    new_keys: list[str] = []
    if due:
        existing = list(context.instance.get_dynamic_partitions(INCOMING_FILES.name or ""))
        known = set(existing)
        new_keys = [k for k in due if k not in known]  # listed, but never given a partition
        requests = reconcile_requests(state, [*existing, *new_keys], due, now, rng)
        context.log.info(f"requesting {len(due)} missing versions again in {len(requests)} runs")
    events = []
    if state.last_missing != found.missing_count:
        events.append(
            AssetObservation(
                RECORDS_KEY,
                metadata={
                    "missing_versions": MetadataValue.int(found.missing_count),
                    "without_snapshot": MetadataValue.int(without_snapshot),
                    "object_versions": MetadataValue.int(found.objects),
                },
            )
        )
        state.last_missing = found.missing_count
    return SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[INCOMING_FILES.build_add_request(new_keys)]
        if new_keys
        else [],
        asset_events=events,
        cursor=state.to_json(),
    )

"""False alarms and detections of the regression verdicts on the shared Liger history.

Builds indexes in-process (an embedded S3 server, the same ingest and publish as `kindex
ingest`) from the gh-pages runs of Liger's CI under CORPUS (`gh-pages/benchmarks/<commit>
[-<tag>]/benchmark.csv`) and prints, for each scenario, what `regressions` and `drift` name:

1. A/A: the runs of one GPU up to run `0a62700-v0.6.4`, then run `0a62700` (the same commit a
   week later) labelled as the next version: every kernel named (a regression or an
   improvement) is a false alarm;
2. injected: the same, with the `liger` provider's latency 1.25x in the five quietest kernels
   (the lowest noise of the A/A index): the five should be named, and nothing else;
3. host drift: the same, with every provider's latency 1.2x: nothing named, drift shows it;
4. the real history: every gh-pages run (every GPU) and the committed versions of
   `all_benchmark_data.csv` under `history/` (by commit time): every change named, for
   docs/regressions.md.

    .venv/bin/python benchmarks/regressions.py --corpus /work/shared/data/liger [--skip-history]

Exits non-zero when a scenario fails (a false alarm, a missed or extra detection, no drift).
tests/test_regressions.py holds the first three on the sample in tests/data/liger/gh-pages.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import math
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

AA_OLD, AA_NEW = "0a62700-v0.6.4", "0a62700"
INJECTED_FACTOR, DRIFT_FACTOR = 1.25, 1.2
INJECTED_PROVIDER = "liger"
VALUE_COLUMNS = ("y_value_50", "y_value_20", "y_value_80")


@dataclass(frozen=True, slots=True)
class LigerRun:
    """One benchmark.csv of a gh-pages run: its name (the folder), header and rows."""

    name: str
    header: list[str]
    rows: list[list[str]]

    def column(self, name: str) -> int:
        return self.header.index(name)

    def first_time(self) -> str:
        i = self.column("timestamp")
        return min(r[i] for r in self.rows)

    def gpu(self) -> str:
        i = self.column("gpu_name")
        return max({r[i] for r in self.rows})

    def version(self) -> str:
        i = self.column("liger_version")
        return max({r[i] for r in self.rows})

    def to_bytes(self) -> bytes:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(self.header)
        writer.writerows(self.rows)
        return out.getvalue().encode()

    def relabelled(self, version: str) -> LigerRun:
        """The same rows under another liger_version (a later version of the same code)."""
        i = self.column("liger_version")
        rows = [[*r[:i], version, *r[i + 1 :]] for r in self.rows]
        return LigerRun(self.name, self.header, rows)

    def scaled(
        self,
        factor: float,
        providers: Iterable[str] | None = None,
        kernels: Iterable[str] | None = None,
    ) -> LigerRun:
        """Latency (Liger's `speed` metric) times `factor` for the given providers and kernels
        (all when None)."""
        wanted_providers = None if providers is None else set(providers)
        wanted_kernels = None if kernels is None else set(kernels)
        metric, provider, kernel = (
            self.column(c) for c in ("metric_name", "kernel_provider", "kernel_name")
        )
        values = [self.column(c) for c in VALUE_COLUMNS]
        rows = []
        for r in self.rows:
            r = list(r)
            if (
                r[metric] == "speed"
                and (wanted_providers is None or r[provider] in wanted_providers)
                and (wanted_kernels is None or r[kernel] in wanted_kernels)
            ):
                for v in values:
                    r[v] = repr(float(r[v]) * factor)
            rows.append(r)
        return LigerRun(self.name, self.header, rows)


def read_run(path: Path, name: str | None = None) -> LigerRun:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    records = list(csv.reader(io.StringIO(data.decode())))
    default = path.parent.name if path.name == "benchmark.csv" else path.name.removesuffix(".gz")
    default = default.removesuffix(".csv")
    return LigerRun(name or default, records[0], records[1:])


def corpus_runs(corpus: Path) -> list[LigerRun]:
    """Every gh-pages run under a corpus folder, oldest first."""
    runs = [
        read_run(p) for p in sorted((corpus / "gh-pages" / "benchmarks").glob("*/benchmark.csv"))
    ]
    return sorted(runs, key=lambda r: r.first_time())


def next_version(version: str) -> str:
    parts = version.split(".")
    return ".".join([*parts[:-1], str(int(parts[-1]) + 1)])


def aa_history(runs: list[LigerRun]) -> tuple[list[LigerRun], LigerRun]:
    """The runs of AA_OLD's GPU up to AA_OLD, and AA_NEW labelled as the next version."""
    by_name = {r.name: r for r in runs}
    old, new = by_name[AA_OLD], by_name[AA_NEW]
    history = [r for r in runs if r.gpu() == old.gpu() and r.first_time() <= old.first_time()]
    return history, new.relabelled(next_version(old.version()))


# ---------------------------------------------------------------------------------------------
# In-process indexes on an embedded S3 server (as `kindex ingest` builds them).


@dataclass
class Index:
    store: Any
    settings: Any

    def ingest(self, items: list[tuple[str, bytes]]) -> None:
        from pipelines.index.publish import publish_index
        from pipelines.ingest import process_snapshot
        from pipelines.intake.snapshots import take_snapshot

        for key, data in items:
            info = self.store.put_bytes(key, data)
            snapshot = take_snapshot(self.store, self.settings, key, etag=info.etag)
            process_snapshot(self.store, self.settings, snapshot)
        publish_index(self.store, self.settings)

    def query(self, sql: str, **params: Any) -> list[tuple[Any, ...]]:
        from pipelines.index.local import open_index

        con = open_index(self.settings)
        try:
            return con.execute(sql, params or None).fetchall()
        finally:
            con.close()


@contextmanager
def server(folder: Path) -> Iterator[Any]:
    from pipelines.storage.embedded import start_on_free_ports

    running = start_on_free_ports(folder / "s3")
    try:
        yield running
    finally:
        running.stop()


def new_index(running: Any, home: Path) -> Index:
    import os

    from pipelines.settings import Settings
    from pipelines.storage.s3 import S3Store

    bucket = f"regressions-{uuid.uuid4().hex[:12]}"
    store = S3Store(bucket, endpoint_url=running.endpoint_url, credentials=running.credentials)
    store.ensure_bucket()
    os.environ.update(
        {
            "KINDEX_HOME": str(home / bucket),
            "KINDEX_S3_ENDPOINT": running.endpoint_url,
            "KINDEX_BUCKET": bucket,
            "AWS_ACCESS_KEY_ID": running.credentials.access_key,
            "AWS_SECRET_ACCESS_KEY": running.credentials.secret_key,
        }
    )
    return Index(store, Settings.from_env())


def run_items(runs: Iterable[LigerRun]) -> list[tuple[str, bytes]]:
    return [(f"incoming/gh-pages/{r.name}/benchmark.csv", r.to_bytes()) for r in runs]


# Every change named at a version, either way (an improvement named in an A/A pair is a false
# alarm too).
NAMED_SQL = """
SELECT kernel, provider, mode, gpu, old_version, new_version, ratio, evidence, verdict
FROM version_verdicts
WHERE new_version = $version AND verdict IN ('regression', 'improvement')
ORDER BY kernel, provider, mode, metric
"""
DRIFT_SQL = "SELECT count(*) FROM drift WHERE new_version = $version AND direction = 'slower'"
QUIET_SQL = """
SELECT kernel FROM version_verdicts
WHERE provider = $provider AND metric = 'latency' AND new_version = $version
  AND verdict = 'no change'
GROUP BY kernel ORDER BY max(noise), kernel LIMIT 5
"""


@dataclass
class Outcome:
    scenario: str
    named: list[tuple[Any, ...]]
    expected: set[str]  # kernels that should be named
    drift: int = 0
    drift_expected: bool = False

    @property
    def kernels(self) -> set[str]:
        return {r[0] for r in self.named}

    @property
    def false_alarms(self) -> int:
        return sum(1 for r in self.named if r[0] not in self.expected)

    @property
    def detected(self) -> int:
        return len(self.kernels & self.expected)

    @property
    def ok(self) -> bool:
        return (
            self.false_alarms == 0
            and self.detected == len(self.expected)
            and (self.drift > 0) == self.drift_expected
        )


def scenarios(running: Any, home: Path, runs: list[LigerRun]) -> list[Outcome]:
    """A/A, injected and host drift on the history up to AA_OLD (each a fresh index)."""
    history, new = aa_history(runs)
    version = new.version()
    outcomes = []
    aa = new_index(running, home)
    aa.ingest(run_items(history))
    aa.ingest(run_items([new]))
    outcomes.append(Outcome("A/A", aa.query(NAMED_SQL, version=version), set()))
    counts = aa.query(
        "SELECT verdict, count(*) FROM version_verdicts WHERE new_version = $version "
        "GROUP BY 1 ORDER BY 1",
        version=version,
    )
    print("A/A verdicts of the pair:", dict(counts), flush=True)
    quiet = [r[0] for r in aa.query(QUIET_SQL, provider=INJECTED_PROVIDER, version=version)]
    injected = new_index(running, home)
    injected.ingest(run_items(history))
    slower = new.scaled(INJECTED_FACTOR, providers=[INJECTED_PROVIDER], kernels=quiet)
    injected.ingest(run_items([slower]))
    outcomes.append(
        Outcome(
            f"injected {INJECTED_FACTOR}x ({', '.join(quiet)})",
            injected.query(NAMED_SQL, version=version),
            set(quiet),
        )
    )
    drift = new_index(running, home)
    drift.ingest(run_items(history))
    drift.ingest(run_items([new.scaled(DRIFT_FACTOR)]))
    outcomes.append(
        Outcome(
            f"host drift {DRIFT_FACTOR}x",
            drift.query(NAMED_SQL, version=version),
            set(),
            drift=drift.query(DRIFT_SQL, version=version)[0][0],
            drift_expected=True,
        )
    )
    return outcomes


HISTORY_SQL = """
SELECT kernel, provider, mode, metric, gpu, old_point, new_point, cases, ratio, own_ratio,
       noise, evidence, threshold, agreement, history, verdict
FROM version_verdicts WHERE verdict IN ('regression', 'improvement', 'baseline changed')
ORDER BY gpu, kernel, provider, mode, metric, new_point
"""
COUNTS_SQL = "SELECT verdict, count(*) FROM version_verdicts GROUP BY 1 ORDER BY 1"
# The README's examples, run through `kindex query` on the real history.
README_QUERIES = (
    "SELECT kernel, provider, mode, old_point, new_point, cases, ratio, own_ratio, noise, "
    "evidence, threshold FROM regressions WHERE gpu = 'NVIDIA H100 80GB HBM3' "
    "AND metric = 'latency' ORDER BY ratio DESC LIMIT 6",
    "SELECT old_point, new_point, ratio, own_ratio, evidence, threshold, verdict "
    "FROM version_verdicts WHERE kernel = 'embedding' AND provider = 'liger' "
    "AND mode = 'forward' AND gpu = 'NVIDIA H100 80GB HBM3' AND metric = 'latency' "
    "AND new_version IN ('0.6.1', '0.6.2') ORDER BY new_point",
    "SELECT case_key, old_point, new_point, old_median, new_median, "
    "old_baseline_median, new_baseline_median, ratio FROM regression_cases "
    "WHERE kernel = 'embedding' AND provider = 'liger' AND mode = 'forward' "
    "AND gpu = 'NVIDIA H100 80GB HBM3' AND metric = 'latency' AND old_version = '0.6.1' "
    "AND new_version = '0.6.2' ORDER BY ratio DESC LIMIT 3",
    "SELECT kernel, mode, gpu, old_version, new_point, providers, ratio, min_ratio, "
    "max_ratio FROM drift WHERE metric = 'latency' ORDER BY abs(ln(ratio)) DESC LIMIT 5",
)
# The chart docs/regressions.md shows: a change that came and went within the history.
CHART_ARGS = (
    "--kernel", "rope", "--mode", "forward", "--provider", "liger",
    "--gpu", "NVIDIA H100 80GB HBM3",
)  # fmt: skip


def real_history(running: Any, home: Path, corpus: Path, runs: list[LigerRun]) -> Index:
    """Every gh-pages run, oldest first, then the committed versions of Liger's CSV."""
    index = new_index(running, home)
    for run in runs:
        index.ingest(run_items([run]))
    commits = corpus / "history" / "commits.tsv"
    if commits.exists():
        lines = commits.read_text().splitlines()[1:]
        for line in lines:
            commit = line.split("\t")[0]
            path = corpus / "history" / commit / "all_benchmark_data.csv"
            if path.exists():
                index.ingest([("incoming/all_benchmark_data.csv", path.read_bytes())])
    return index


def history_files(corpus: Path, runs: list[LigerRun]) -> list[LigerRun]:
    """The files real_history ingests, in its order."""
    files = list(runs)
    commits = corpus / "history" / "commits.tsv"
    if commits.exists():
        for line in commits.read_text().splitlines()[1:]:
            path = corpus / "history" / line.split("\t")[0] / "all_benchmark_data.csv"
            if path.exists():
                files.append(read_run(path, name=line.split("\t")[0]))
    return files


def raw_ratio(files: list[LigerRun], ranks: dict[str, int], named: tuple[Any, ...]) -> float | None:
    """A named change recomputed from the CSV rows themselves, not the index. Each file's rows
    of a case that no earlier file held (a new measurement) are the case's point there; its
    time is over the lowest-ranked baseline row of the same file (any row). A series' points in
    a file are labelled by their version and earliest time (as regression_points labels them)
    and sorted by version (numerically) and time; each case of the new point is compared with
    its own point before, and the change is the geometric mean of the ratios of ratios. None
    when the rows do not give it (a kernel the curation renames)."""
    kernel, provider, mode, metric, gpu, _old_point, new_point = named[:7]
    raw_metric = "speed" if metric == "latency" else metric
    seen: set[tuple[str, ...]] = set()
    # case -> [(version order, point time, file, relative time)]
    points: dict[tuple[str, ...], list[tuple[tuple[int, ...], str, int, float]]] = {}
    labels: dict[tuple[int, str], str] = {}  # (file, version) -> the point's time
    for i, f in enumerate(files):
        c = {name: f.column(name) for name in f.header}
        values: dict[tuple[str, tuple[str, ...], str], float] = {}
        fresh: dict[tuple[tuple[str, ...], str], tuple[str, float]] = {}
        for r in f.rows:
            if (
                r[c["kernel_name"]] != kernel
                or r[c["kernel_operation_mode"]] != mode
                or r[c["gpu_name"]] != gpu
                or r[c["metric_name"]] != raw_metric
            ):
                continue
            case = (r[c["x_name"]], r[c["x_value"]], r[c["extra_benchmark_config_str"]])
            version, when = r[c["liger_version"]], r[c["timestamp"]]
            value = float(r[c["y_value_50"]])
            values.setdefault((r[c["kernel_provider"]], case, version), value)
            identity = (r[c["kernel_provider"]], *case, version, when, r[c["y_value_50"]])
            if identity in seen:
                continue
            seen.add(identity)
            if r[c["kernel_provider"]] == provider:
                if (case, version) not in fresh or when < fresh[(case, version)][0]:
                    fresh[(case, version)] = (when, value)
                labels[(i, version)] = min(labels.get((i, version), when), when)
        for (case, version), (_when, own) in fresh.items():
            present = [(rank, p) for p, rank in ranks.items() if (p, case, version) in values]
            relative = own
            if provider not in ranks and present:
                relative = own / values[(min(present)[1], case, version)]
            order = tuple(int(x) for x in version.split("."))
            points.setdefault(case, []).append((order, version, i, relative))

    def label(i: int, version: str) -> str:
        return f"{version} @ {labels[(i, version)][:16]}"

    logs = []
    for case_points in points.values():
        ordered = sorted(case_points, key=lambda p: (p[0], labels[(p[2], p[1])], p[2]))
        for before, after in zip(ordered, ordered[1:], strict=False):
            if label(after[2], after[1]) == new_point:
                logs.append(math.log(after[3] / before[3]))
    return round(math.exp(sum(logs) / len(logs)), 4) if logs else None


def markdown(rows: list[tuple[Any, ...]]) -> str:
    header = (
        "| kernel | provider | pass | metric | GPU | points | cases | ratio | own ratio | "
        "noise | evidence (threshold) | agreement | history | verdict | from the CSV rows |\n"
        + "|---" * 15
        + "|"
    )
    lines = [header]
    for row in rows:
        k, p, m, metric, gpu, old, new, cases, ratio, own, noise, ev, thr, agree, hist, v = row[:16]
        lines.append(
            f"| {k} | {p} | {m} | {metric} | {gpu} | {old} -> {new} | {cases} | {ratio} | "
            f"{own} | {noise} | {ev} ({thr}) | {agree} | {hist} | {v} | {row[16]} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="e.g. /work/shared/data/liger")
    parser.add_argument("--skip-history", action="store_true", help="scenarios 1-3 only")
    parser.add_argument("--table", type=Path, help="write the real history's table (markdown)")
    parser.add_argument("--chart", type=Path, help="draw rope forward's regressions chart here")
    from report import Figure, add_write_docs, write_figures

    add_write_docs(parser)
    args = parser.parse_args()
    runs = corpus_runs(args.corpus)
    if not runs:
        parser.error(f"no gh-pages run under {args.corpus}")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="regressions-") as folder, server(Path(folder)) as s:
        home = Path(folder) / "homes"
        outcomes = scenarios(s, home, runs)
        print("scenario | named | false alarms | detected | drift rows | ok")
        for o in outcomes:
            print(
                f"{o.scenario} | {len(o.named)} | {o.false_alarms} | "
                f"{o.detected}/{len(o.expected)} | {o.drift} | {'yes' if o.ok else 'NO'}"
            )
            for row in o.named:
                print("    named:", row)
        if not args.skip_history:
            index = real_history(s, home, args.corpus, runs)
            counts = index.query(COUNTS_SQL)
            print("\nreal history: verdicts", dict(counts))
            from pipelines import curation

            files = history_files(args.corpus, runs)
            ranks = curation.load().baseline_ranks()
            named = [(*r, raw_ratio(files, ranks, r)) for r in index.query(HISTORY_SQL)]
            table = markdown(named)
            print(table)
            if args.table:
                args.table.write_text(table + "\n")
            from pipelines.cli import main as kindex

            for sql in README_QUERIES:
                print(f'\nkindex query "{sql}"', flush=True)
                kindex(["query", sql])
            if args.chart:
                kindex(["chart", "regressions", *CHART_ARGS, "-o", str(args.chart)])
    print(f"\n{time.perf_counter() - began:.0f} s")
    if args.write_docs:
        write_figures(
            [
                Figure(
                    f"regressions: {o.scenario.split(' (')[0]} on the shared history",
                    f"{len(o.named)} named, {o.false_alarms} false alarms, "
                    f"{o.detected}/{len(o.expected)} detected, {o.drift} drift rows",
                    "0 false alarms, all detected",
                )
                for o in outcomes
            ]
        )
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Coverage and parity of the Liger normalizer over a corpus of real Liger CSVs.

For each CSV under CORPUS (a copy of Liger's corpus: HEAD CSVs, gh-pages runs, history),
normalizes it on the production (batch) path and compares every row with KernelIndex's own
importer's outcome in VECTORS (one file per CSV, `<path with / as __>.jsonl.gz`, one object per
data row):

- parity: each row the reference imports is `ok` here with the same externalId and the same
  digest for all seven kinds;
- coverage: the share of all data rows that become runs;
- the quarantine's reasons, with one example row each;
- identity: every distinct manifest validates against its schema, no two runs of a file share a
  digest (a memory run never collides with a speed run), and a run's externalId names one digest
  across all files (identity stable across files).

    .venv/bin/python benchmarks/liger_coverage.py [--corpus DIR] [--vectors DIR]

Exits non-zero when parity fails or coverage is under 99.9 % on some file.
"""

from __future__ import annotations

import argparse
import gzip
import io
import sys
from collections import Counter
from pathlib import Path

import orjson

from pipelines.records.manifests import schema_errors
from pipelines.sources.liger.columnar import normalized_batches, write_json_lines

KINDS = {
    "BenchmarkRun": "run",
    "OperationSpec": "operation",
    "SoftwareProject": "project",
    "ImplementationRevision": "implementation",
    "WorkloadCase": "workload",
    "BenchmarkProtocol": "protocol",
    "ExecutionEnvironment": "environment",
}
COVERAGE_TARGET = 0.999


def vectors_name(corpus: Path, csv: Path) -> str:
    return str(csv.relative_to(corpus).with_suffix("")).replace("/", "__") + ".jsonl.gz"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--vectors", type=Path, required=True)
    args = parser.parse_args()
    files = sorted(args.corpus.rglob("*.csv"))
    if not files:
        parser.error(f"no CSV under {args.corpus}")
    validated: set[str] = set()
    identities: dict[str, str] = {}  # externalId -> run digest, across files
    unstable = 0
    failed = False
    totals: Counter[str] = Counter()
    print(f"{'file':64} {'rows':>6} {'runs':>6} {'cover':>8} {'ref':>5} {'parity':>7}  quarantine")
    for csv in files:
        reference_path = args.vectors / vectors_name(args.corpus, csv)
        reference = {}
        if reference_path.exists():
            with gzip.open(reference_path) as stream:
                reference = {d["line"]: d for d in map(orjson.loads, stream)}
        out = io.BytesIO()
        with csv.open("rb") as stream:
            for batch in normalized_batches(stream):
                write_json_lines(batch, out)
        rows = ok = imported = matched = 0
        reasons: Counter[str] = Counter()
        examples: dict[str, str] = {}
        mismatches: list[str] = []
        run_digests: set[str] = set()
        for line in out.getvalue().splitlines():
            outcome = orjson.loads(line)
            rows += 1
            number = outcome["source_line"]
            digests = {KINDS[r["kind"]]: r["digest"] for r in outcome.get("records") or ()}
            if outcome["status"] == "ok":
                ok += 1
                run = next(r for r in outcome["records"] if r["kind"] == "BenchmarkRun")
                external_id = run["manifest"]["spec"]["sourceNative"]["externalId"]
                if digests["run"] in run_digests:
                    mismatches.append(f"line {number}: run digest repeats in the file")
                run_digests.add(digests["run"])
                if identities.setdefault(external_id, digests["run"]) != digests["run"]:
                    unstable += 1
                for record in outcome["records"]:
                    if record["digest"] not in validated:
                        validated.add(record["digest"])
                        errors = list(schema_errors(record["manifest"]))
                        if errors:
                            mismatches.append(f"line {number}: {record['kind']} {errors[:2]}")
            else:
                reasons[outcome["reason"]] += 1
                examples.setdefault(outcome["reason"], f"line {number}")
            expected = reference.get(number)
            if expected is None or expected["outcome"] != "run":
                continue
            imported += 1
            want = {k: expected[k] for k in KINDS.values()}
            got_id = (
                run["manifest"]["spec"]["sourceNative"]["externalId"]
                if outcome["status"] == "ok"
                else None
            )
            if digests == want and got_id == expected["externalId"]:
                matched += 1
            elif len(mismatches) < 5:
                differ = sorted(k for k in want if digests.get(k) != want[k])
                status = f"{outcome['status']} {outcome.get('reason')}"
                mismatches.append(f"line {number}: {status} differs in {differ}")
        if rows != len(reference) and reference:
            mismatches.append(f"{rows} outcomes for {len(reference)} reference rows")
        coverage = ok / rows if rows else 1.0
        name = str(csv.relative_to(args.corpus))
        quarantine = ", ".join(f"{r} {n}" for r, n in reasons.most_common())
        parity = f"{matched}/{imported}"
        print(f"{name:64} {rows:6} {ok:6} {coverage:8.4%} {imported:5} {parity:>7}  {quarantine}")
        for reason, example in examples.items():
            print(f"    {reason}: {example[:160]}")
        for mismatch in mismatches[:5]:
            print(f"    MISMATCH {mismatch}")
        failed |= bool(mismatches) or matched != imported or coverage < COVERAGE_TARGET
        totals.update(rows=rows, ok=ok, imported=imported, matched=matched)
    print(
        f"all: {totals['rows']} rows, {totals['ok']} runs"
        f" ({totals['ok'] / max(totals['rows'], 1):.4%}), parity"
        f" {totals['matched']}/{totals['imported']}, {len(validated)} distinct records valid,"
        f" {unstable} externalIds with two digests across files"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

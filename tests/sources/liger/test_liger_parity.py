"""Digest-for-digest parity with KernelIndex's Liger importer, on the seeds, the vectors and the
whole shared CSV."""

from __future__ import annotations

import csv
import json
from collections import Counter
from functools import cache
from pathlib import Path

from jsonschema import Draft202012Validator
from liger_support import LIGER_CSV, RECORD_ORDER, SCHEMAS, seed, vectors

from pipelines.records import RowOutcome
from pipelines.sources.liger.normalize import normalize_bytes

SCHEMA_FILE = {
    "OperationSpec": "operation-spec",
    "WorkloadCase": "workload-case",
    "SoftwareProject": "software-project",
    "ImplementationRevision": "implementation-revision",
    "BenchmarkProtocol": "benchmark-protocol",
    "ExecutionEnvironment": "execution-environment",
    "BenchmarkRun": "benchmark-run",
}


@cache
def outcomes_by_line() -> dict[int, RowOutcome]:
    return {o.source_line: o for o in normalize_bytes(LIGER_CSV.read_bytes())}


def test_whole_csv_counts() -> None:
    outcomes = list(outcomes_by_line().values())
    assert len(outcomes) == 2448
    assert Counter(o.status for o in outcomes) == {"ok": 2448}
    assert Counter(o.facts.metric for o in outcomes if o.facts) == {"latency": 1649, "memory": 799}
    assert len({o.run.digest for o in outcomes if o.run}) == 2448


def test_source_lines_and_raw_text_point_into_the_file() -> None:
    lines = LIGER_CSV.read_text(encoding="utf-8").splitlines()
    for line, outcome in outcomes_by_line().items():
        assert outcome.raw == lines[line - 1]


def test_seeds_come_out_exactly() -> None:
    for name, line in (("000_62d94da41d44ef74.txt", 2212), ("004_34dae7d6c56bcfaf.txt", 1843)):
        expected = seed(name)
        run, _, _, implementation, workload, protocol, environment = outcomes_by_line()[
            line
        ].records
        assert run.manifest == expected["run"]
        assert protocol.manifest == expected["protocol"]
        assert environment.manifest == expected["environment"]
        spec = expected["run"]["spec"]
        assert implementation.digest == spec["implementationDigest"]
        assert workload.digest == spec["workloadDigest"]
        assert protocol.digest == spec["protocolDigest"]
        assert environment.digest == spec["environmentDigest"]


def test_every_vector_matches() -> None:
    runs = skips = 0
    for vector in vectors():
        outcome = outcomes_by_line()[vector["line"]]
        assert outcome.raw == vector["raw"]
        if vector["outcome"] == "skip":
            # The reference skips memory rows; kindex imports them as memory runs.
            assert vector["reason"] == "memoryRows"
            assert outcome.status == "ok" and outcome.facts and outcome.facts.metric == "memory"
            skips += 1
            continue
        assert outcome.facts is not None and outcome.facts.case_key == vector["caseKey"]
        for kind, record in zip(RECORD_ORDER, outcome.records, strict=True):
            assert record.digest == vector[kind]["digest"], (vector["line"], kind)
            assert record.manifest == vector[kind]["manifest"], (vector["line"], kind)
        runs += 1
    assert runs > 200 and skips > 100


def test_memory_runs_never_collide_with_speed_runs() -> None:
    speed, memory = {}, {}
    for outcome in outcomes_by_line().values():
        assert outcome.facts is not None and outcome.run is not None
        key = (
            outcome.facts.kernel,
            outcome.facts.provider,
            outcome.facts.mode,
            outcome.facts.gpu,
            outcome.facts.case_key,
            outcome.facts.observed_at[:16],
        )
        (memory if outcome.facts.metric == "memory" else speed)[key] = outcome
    pairs = [(speed[k], memory[k]) for k in speed.keys() & memory.keys()]
    assert pairs, "the CSV has speed and memory rows of the same case"
    for speed_run, memory_run in pairs:
        assert speed_run.run.digest != memory_run.run.digest
        assert speed_run.records[5].digest != memory_run.records[5].digest  # protocols differ
        assert speed_run.facts.external_id != memory_run.facts.external_id


def test_memory_values_are_integer_bytes_from_mib() -> None:
    rows = list(csv.reader(LIGER_CSV.read_text(encoding="utf-8").splitlines()))
    for line, outcome in outcomes_by_line().items():
        if outcome.facts and outcome.facts.metric == "memory":
            mib = float(rows[line - 1][8])
            assert outcome.facts.median == int(mib * 2**20 + 0.5)
            assert outcome.facts.unit == "bytes"


def test_every_emitted_manifest_validates_against_the_shared_schemas() -> None:
    validators = {
        kind: Draft202012Validator(
            json.loads(Path(SCHEMAS, f"{stem}.v1alpha1.schema.json").read_text())
        )
        for kind, stem in SCHEMA_FILE.items()
    }
    seen: set[str] = set()
    for outcome in outcomes_by_line().values():
        for record in outcome.records:
            if record.digest in seen:
                continue
            seen.add(record.digest)
            errors = [e.message for e in validators[record.kind].iter_errors(record.manifest)]
            assert not errors, (record.kind, record.digest, errors[:3])
    assert len(seen) > 2448

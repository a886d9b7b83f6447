"""GPU-worker result bundles -> records, with partial acceptance.

Every manifest is checked on its own (pipelines.sources.bundles.validate); digests a run, workload
or
implementation names must be the digest of a valid manifest of the right kind in the bundle, or
known to the index (`known_digest`). What is wrong is quarantined with a reason and a JSON pointer
into the bundle; the valid rest yields one ok outcome per run (the BenchmarkRun first, then every
manifest of the bundle it references) and one ok outcome, without facts, for each valid manifest
that no ok run carries (so an operation or workload dropped on its own still reaches the index).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pipelines.records import Record, RowOutcome
from pipelines.records.rules import Reason
from pipelines.sources.bundles.canonicalize import Problem
from pipelines.sources.bundles.facts import run_facts
from pipelines.sources.bundles.layout import Entry, lay_out
from pipelines.sources.bundles.reader import (
    DEFAULT_LIMITS,
    Defect,
    ReadError,
    ReadLimits,
    read_documents,
)
from pipelines.sources.bundles.validate import (
    CheckedManifest,
    check_manifest,
    describe,
    main_problem,
)

PARSER_VERSION = "kindex-bundle/1"
RAW_LIMIT = 4096  # characters of raw text kept with a quarantine row

KnownDigest = Callable[[str], bool]


def never_known(digest: str) -> bool:
    return False


# (field of the spec, kind it must name) for each kind that names others.
REFERENCES: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = {
    "BenchmarkRun": (
        (("implementationDigest",), "ImplementationRevision"),
        (("workloadDigest",), "WorkloadCase"),
        (("protocolDigest",), "BenchmarkProtocol"),
        (("environmentDigest",), "ExecutionEnvironment"),
    ),
    "WorkloadCase": ((("operationSpecDigest",), "OperationSpec"),),
    "ImplementationRevision": ((("operation", "specDigest"), "OperationSpec"),),
}


@dataclass(slots=True)
class Checked:
    entry: Entry
    check: CheckedManifest
    problems: list[Problem]  # pointers absolute in the bundle

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def digest(self) -> str | None:
        return self.check.digest

    @property
    def kind(self) -> str | None:
        return self.check.kind


def normalize_bundle_bytes(
    data: bytes,
    known_digest: KnownDigest = never_known,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> Iterator[RowOutcome]:
    """Normalize one bundle. Never raises on bad content."""
    try:
        documents = read_documents(data, limits).documents
    except ReadError as error:
        yield RowOutcome(
            error.line, "quarantined", _head(data), error.reason, error.detail, pointer=""
        )
        return
    if not documents:
        yield RowOutcome(1, "quarantined", _head(data), Reason.EMPTY, "no document", pointer="")
        return
    layout = lay_out(documents)
    outcomes = [_stray_outcome(defect) for defect in layout.stray]
    checked = [_check_entry(entry) for entry in layout.entries]
    _resolve(checked, known_digest)
    outcomes.extend(_outcomes(checked))
    outcomes.sort(key=lambda o: o.source_line)  # document order
    yield from outcomes


def _head(data: bytes) -> str:
    return data[:RAW_LIMIT].decode("utf-8", errors="replace")


def _raw(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=False, default=str)
    return text[:RAW_LIMIT]


def _stray_outcome(defect: Defect) -> RowOutcome:
    return RowOutcome(
        defect.line, "quarantined", "", defect.reason, defect.detail, pointer=defect.pointer
    )


def _check_entry(entry: Entry) -> Checked:
    check = check_manifest(entry.value, entry.expected_kind)
    problems = [Problem(d.pointer, d.reason, d.detail) for d in entry.defects]
    problems += [Problem(entry.pointer + p.pointer, p.reason, p.detail) for p in check.problems]
    return Checked(entry, check, problems)


def _get(spec: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(spec, dict):
            return None
        spec = spec.get(key)
    return spec


def _references(item: Checked) -> Iterator[tuple[str, str, str]]:
    """(pointer of the field, digest named, kind expected) for each digest a manifest names."""
    spec = item.check.manifest.get("spec") if isinstance(item.check.manifest, dict) else None
    for path, kind in REFERENCES.get(item.kind or "", ()):
        digest = _get(spec, path)
        if isinstance(digest, str):
            yield item.entry.pointer + "/spec/" + "/".join(path), digest, kind


def _resolve(checked: list[Checked], known_digest: KnownDigest) -> None:
    """Mark each manifest that names a missing, mistyped or invalid manifest. Operations are
    resolved before workloads/implementations, and those before runs, so invalidity propagates."""
    by_digest: dict[str, list[Checked]] = {}
    for item in checked:
        if item.digest is not None:
            by_digest.setdefault(item.digest, []).append(item)
    order = ("WorkloadCase", "ImplementationRevision", "BenchmarkRun")
    for kind in order:
        for item in checked:
            if item.kind != kind or not item.ok:
                continue
            for pointer, digest, expected in _references(item):
                problem = _dependency_problem(pointer, digest, expected, by_digest, known_digest)
                if problem is not None:
                    item.problems.append(problem)
    _quarantine_runs_with_bad_parts(checked)


def _dependency_problem(
    pointer: str,
    digest: str,
    expected: str,
    by_digest: dict[str, list[Checked]],
    known_digest: KnownDigest,
) -> Problem | None:
    candidates = [c for c in by_digest.get(digest, []) if c.kind == expected]
    if any(c.ok for c in candidates):
        return None
    if candidates:
        where = candidates[0]
        detail = f"{digest} names the {expected} at {where.entry.pointer}, which is invalid: " + (
            describe(where.problems)
        )
        return Problem(pointer, Reason.INVALID_DEPENDENCY, detail)
    if known_digest(digest):
        return None
    others = sorted({c.kind or "?" for c in by_digest.get(digest, [])})
    found = f" (it names a {', '.join(others)})" if others else ""
    detail = f"no {expected} with digest {digest} in the bundle or the index{found}"
    return Problem(pointer, Reason.DANGLING_DIGEST, detail)


def _quarantine_runs_with_bad_parts(checked: list[Checked]) -> None:
    """A `runs` item stands or falls as one: a bad embedded protocol or environment takes its run
    with it (and is reported through the run's outcome)."""
    parts: dict[int, list[Checked]] = {}
    for item in checked:
        if item.entry.run_index is not None:
            parts.setdefault(item.entry.run_index, []).append(item)
    for items in parts.values():
        run = next((i for i in items if i.entry.expected_kind == "BenchmarkRun"), None)
        if run is None:
            continue
        for part in items:
            if part is not run and not part.ok:
                run.problems.extend(part.problems)


def _outcomes(checked: list[Checked]) -> Iterator[RowOutcome]:
    by_digest = {item.digest: item for item in reversed(checked) if item.ok and item.digest}
    carried: set[str] = set()
    seen_runs: dict[str, str] = {}
    run_parts = {
        id(i) for i in checked if i.entry.run_index is not None and i.kind != "BenchmarkRun"
    }
    for item in checked:
        if item.kind != "BenchmarkRun" and item.entry.expected_kind != "BenchmarkRun":
            continue
        if not item.ok:
            yield _quarantined(item)
            continue
        assert item.digest is not None
        if item.digest in seen_runs:
            detail = f"the same run as {seen_runs[item.digest]}"
            yield RowOutcome(
                item.entry.line,
                "quarantined",
                _raw(item.entry.value),
                Reason.DUPLICATE,
                detail,
                pointer=item.entry.pointer,
            )
            continue
        seen_runs[item.digest] = item.entry.pointer
        records = _run_records(item, by_digest)
        carried.update(r.digest for r in records)
        yield RowOutcome(
            item.entry.line,
            "ok",
            _raw(item.entry.value),
            records=records,
            facts=run_facts(records, item.entry.pointer),
            pointer=item.entry.pointer,
        )
    for item in checked:
        if item.kind == "BenchmarkRun" or item.entry.expected_kind == "BenchmarkRun":
            continue
        if not item.ok:
            if id(item) not in run_parts:  # a run part's problems went out with its run
                yield _quarantined(item)
            continue
        if item.digest in carried or item.digest is None:
            continue
        carried.add(item.digest)
        yield RowOutcome(
            item.entry.line,
            "ok",
            _raw(item.entry.value),
            records=[_record(item)],
            pointer=item.entry.pointer,
        )


def _quarantined(item: Checked) -> RowOutcome:
    problem = main_problem(item.problems)
    return RowOutcome(
        item.entry.line,
        "quarantined",
        _raw(item.entry.value),
        problem.reason,
        describe(item.problems),
        pointer=problem.pointer,
    )


def _record(item: Checked) -> Record:
    assert item.kind is not None and item.digest is not None
    return Record(item.kind, item.digest, item.check.manifest)


def _run_records(run: Checked, by_digest: dict[str, Checked]) -> list[Record]:
    """The run, then every manifest of the bundle it references (directly or through its workload
    and implementation), each once. Manifests only the index knows are not repeated."""
    records = [_record(run)]
    seen = {run.digest}
    queue = [run]
    while queue:
        item = queue.pop(0)
        for _, digest, _ in _references(item):
            target = by_digest.get(digest)
            if target is None or digest in seen:
                continue
            seen.add(digest)
            records.append(_record(target))
            queue.append(target)
    project = _project_of(records, by_digest)
    if project is not None and project.digest not in seen:
        records.append(_record(project))
    return records


def _project_of(records: list[Record], by_digest: dict[str, Checked]) -> Checked | None:
    """The SoftwareProject a run's implementation names through its bundle `projectSlug`."""
    slugs = {
        item.entry.project_slug
        for item in by_digest.values()
        if item.kind == "ImplementationRevision"
        and any(r.digest == item.digest for r in records)
        and item.entry.project_slug
    }
    for item in by_digest.values():
        if item.kind == "SoftwareProject" and isinstance(item.check.manifest, dict):
            name = item.check.manifest.get("metadata", {}).get("name")
            if name in slugs:
                return item
    return None

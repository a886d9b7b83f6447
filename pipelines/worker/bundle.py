"""Build, check, write and upload a result bundle from a GPU worker.

    writer = BundleWriter(environment=capture_environment())
    writer.add_run(implementation=impl, workload=workload, protocol=protocol,
                   samples_ns=timings, operation=operation, project=project, project_slug="x")
    writer.upload(store)                      # -> incoming/worker-bundles/<sha256>.yaml

Manifests are plain dicts (`manifest(kind, name, spec)` builds one). The writer canonicalizes them
the way the reader does, computes every digest with pipelines.records.canonical, and refuses to
write a
bundle that kindex would not accept in full.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from ruamel.yaml import YAML

from pipelines import API_VERSION
from pipelines.records import RowOutcome
from pipelines.records.canonical import manifest_digest
from pipelines.records.rules import name_of
from pipelines.sources.bundles.canonicalize import canonicalize
from pipelines.sources.bundles.normalize import KnownDigest, never_known, normalize_bundle_bytes
from pipelines.storage.base import ObjectInfo, ObjectStore
from pipelines.worker.stats import summarize_ns

DEFAULT_PREFIX = "incoming/worker-bundles/"
Format = Literal["yaml", "json"]


class InvalidBundle(ValueError):
    def __init__(self, outcomes: list[RowOutcome]) -> None:
        lines = [f"{o.pointer}: {o.reason}: {o.detail}" for o in outcomes]
        super().__init__("the bundle would be quarantined in part:\n" + "\n".join(lines))
        self.outcomes = outcomes


def manifest(
    kind: str,
    name: str,
    spec: dict[str, Any],
    *,
    title: str | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": slug(name)}
    if title:
        metadata["title"] = title
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata, "spec": spec}


def slug(text: str) -> str:
    """A metadata.name (the rulebook's, pipelines/records/rules.py); "unnamed" when empty."""
    return name_of(text, empty="unnamed")


def utc_now() -> str:
    """Now as a UTC instant ending in Z, with milliseconds (like the Liger importer writes)."""
    now = datetime.now(UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def _canonical(value: dict[str, Any]) -> tuple[dict[str, Any], str]:
    canonical, problems = canonicalize(value)
    if problems:
        raise ValueError("; ".join(f"{p.pointer}: {p.detail}" for p in problems))
    return canonical, manifest_digest(canonical)


@dataclass(slots=True)
class BundleWriter:
    environment: dict[str, Any]
    projects: dict[str, dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    implementations: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)

    def add_run(
        self,
        *,
        implementation: dict[str, Any],
        workload: dict[str, Any],
        protocol: dict[str, Any],
        samples_ns: Sequence[float],
        operation: dict[str, Any] | None = None,
        project: dict[str, Any] | None = None,
        project_slug: str | None = None,
        status: str = "passed",
        correctness: dict[str, Any] | None = None,
        observed_at: str | None = None,
        name: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Record one run measured from raw per-sample timings (ns). Returns the run manifest.
        `operation` and `project` may be left out when the index already holds them."""
        if operation is not None:
            self._keep(self.operations, operation)
        if project is not None:
            self._keep(self.projects, project)
            project_slug = project_slug or project["metadata"]["name"]
        workload_c, workload_digest = _canonical(workload)
        self.workloads.setdefault(workload_digest, workload_c)
        implementation_c, implementation_digest = _canonical(implementation)
        entry: dict[str, Any] = {"manifest": implementation_c}
        if project_slug:
            entry = {"projectSlug": project_slug, "manifest": implementation_c}
        self.implementations.setdefault(implementation_digest, entry)
        protocol_c, protocol_digest = _canonical(protocol)
        environment_c, environment_digest = _canonical(self.environment)
        summary = summarize_ns(samples_ns)
        spec: dict[str, Any] = {
            "implementationDigest": implementation_digest,
            "workloadDigest": workload_digest,
            "protocolDigest": protocol_digest,
            "environmentDigest": environment_digest,
            "status": status,
            "timing": {
                "primaryStatistic": "median",
                "samples": summary.samples,
                "latencyNs": summary.latency_ns(),
            },
            "observedAt": observed_at or utc_now(),
        }
        if correctness is not None:
            spec["correctness"] = correctness
        run_name = name or (
            f"{implementation['metadata']['name']}-{workload['metadata']['name']}-{spec['observedAt']}"
        )
        run = manifest("BenchmarkRun", run_name, spec, labels=labels)
        self.runs.append({"run": run, "protocol": protocol_c, "environment": environment_c})
        return run

    @staticmethod
    def _keep(section: dict[str, dict[str, Any]], value: dict[str, Any]) -> None:
        canonical, digest = _canonical(value)
        section.setdefault(digest, canonical)

    def bundle(self) -> dict[str, Any]:
        """The submission bundle as a JSON-ready mapping (empty sections left out)."""
        sections = {
            "projects": list(self.projects.values()),
            "operations": list(self.operations.values()),
            "workloads": list(self.workloads.values()),
            "implementations": list(self.implementations.values()),
            "runs": self.runs,
        }
        return {name: items for name, items in sections.items() if items}

    def dumps(self, format: Format = "yaml") -> bytes:
        if format == "json":
            return json.dumps(self.bundle(), indent=2, ensure_ascii=False).encode("utf-8") + b"\n"
        yaml = YAML(typ="safe", pure=True)
        yaml.default_flow_style = False
        yaml.sort_base_mapping_type_on_output = False  # type: ignore[assignment]  # keep key order
        stream = io.StringIO()
        yaml.dump(self.bundle(), stream)
        return stream.getvalue().encode("utf-8")

    def check(self, data: bytes, known_digest: KnownDigest = never_known) -> None:
        """Read the bytes back as kindex will; raise InvalidBundle unless every part is ok."""
        bad = [o for o in normalize_bundle_bytes(data, known_digest) if o.status != "ok"]
        if bad:
            raise InvalidBundle(bad)

    def write(
        self, path: str, format: Format = "yaml", known_digest: KnownDigest = never_known
    ) -> bytes:
        data = self.dumps(format)
        self.check(data, known_digest)
        with open(path, "wb") as out:
            out.write(data)
        return data

    def upload(
        self,
        store: ObjectStore,
        *,
        prefix: str = DEFAULT_PREFIX,
        format: Format = "yaml",
        known_digest: KnownDigest = never_known,
    ) -> ObjectInfo:
        """Put the bundle into the bucket under a content-addressed key (re-uploading the same
        bundle writes the same key)."""
        data = self.dumps(format)
        self.check(data, known_digest)
        key = f"{prefix}{hashlib.sha256(data).hexdigest()[:32]}.{format}"
        content_type = "application/json" if format == "json" else "application/yaml"
        return store.put_bytes(key, data, content_type=content_type)

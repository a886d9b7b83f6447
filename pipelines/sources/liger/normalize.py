"""Steps 2–3 of the Liger source: turn each CSV record into kernelindex.dev/v1alpha1 records.

A row becomes a BenchmarkRun plus the six manifests it references, byte-identical (digest for
digest) to KernelIndex's own Liger importer for every row that importer imports. Memory rows,
which the importer skips, become runs under a memory protocol (see docs/memory-runs.md). Every
other row becomes a quarantine outcome with a stable reason code; no row is dropped unseen.

This module holds the shared manifests (Normalizer), a series' run template (Series) and the
workloads; what each text means is pipelines/sources/liger/rules.py, and runs are assembled
column-wise
by pipelines/sources/liger/columnar.py. A row's path: read.py -> columnar.normalize_batch ->
tables.py.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property, lru_cache
from operator import itemgetter
from typing import Any

import numpy as np
import orjson

from pipelines import API_VERSION
from pipelines.curation import (
    MODEL_PREFIX,
    Binding,
    Curation,
    Expression,
    ExpressionError,
    Kernel,
    load,
)
from pipelines.records import Record, RowOutcome, RunFacts
from pipelines.records.canonical import (
    MAX_SAFE_INTEGER,
    canonical_json_reference,
    digest_of_canonical,
    identity,
    manifest_digest,
)
from pipelines.sources.liger.read import COLUMNS, CsvRecord, NotLigerCsv
from pipelines.sources.liger.rules import (
    FIELD_LIMIT,
    LABEL,
    NAME_LIMIT,
    SLUG_BREAK,
    SOURCE,
    Reason,
    RowRejected,
    Stamp,
    axis_value,
    binding_of,
    case_key,
    check_known,
    environment_name,
    external_id,
    implementation_name,
    in_range,
    is_baseline,
    is_integer,
    is_memory,
    joined_slug,
    kernel_of,
    metric_scale,
    parse_config,
    parse_positive,
    parse_timestamp,
    positive_integer,
    protocol_name,
    run_name_parts,
    run_title,
    scalars_of,
    sizes_of,
    slug,
    stored_values,
    workload_title,
)

PARSER_VERSION = "liger-csv/1"  # the code's version; see parser_version() for the full one

__all__ = [
    "FIELD_LIMIT",
    "NAME_LIMIT",
    "PARSER_VERSION",
    "NotLigerCsv",
    "RowRejected",
    "joined_slug",
    "normalize_bytes",
    "normalize_lines",
    "parse_timestamp",
    "parser_version",
    "slug",
]


def parser_version(curation: Curation | None = None) -> str:
    """The code's version plus the curation's fingerprint: records made by another curation (a
    GPU added since, say) are rebuilt by a backfill, not reused."""
    return f"{PARSER_VERSION}+{(curation or load()).fingerprint}"


# The columns the normalizer reads, in the order `Normalizer.normalize_fields` takes them.
ROW_COLUMNS = tuple(c for c in COLUMNS if c != "x_label")  # x_label is only a caption


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a file's header puts ROW_COLUMNS in each record's fields."""

    width: int  # fields a well-formed record has
    pick: Callable[[list[str]], tuple[str, ...]]  # its ROW_COLUMNS texts, in order
    indices: tuple[int, ...]  # where those texts are among the fields

    @classmethod
    def of(cls, columns: tuple[str, ...]) -> Layout:
        indices = tuple(columns.index(c) for c in ROW_COLUMNS)
        return cls(len(columns), itemgetter(*indices), indices)


def _manifest(kind: str, metadata: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata, "spec": spec}


def _record(manifest: dict[str, Any]) -> Record:
    return Record(manifest["kind"], manifest_digest(manifest), manifest)


@dataclass(frozen=True, slots=True)
class Workload:
    case_key: str
    dtype: str
    record: Record
    digest_json: str  # the record's digest as a JSON string, for run templates
    case_slug: str  # slug(case_key), for run names


@dataclass(frozen=True, slots=True)
class RowRead:
    """What a row's texts say, each read by its rule: all a run is made from."""

    series: Series
    workload: Workload
    stamp: Stamp
    stats: list[float]  # the row's own numbers
    values: list[int]  # in the stored unit
    version: str  # liger_version, stripped


class Normalizer:
    """Builds records from rows; manifests shared by many rows are built once and cached."""

    def __init__(self, curation: Curation | None = None) -> None:
        self.curation = curation or load()
        self._operations = {k.name: _record(k.operation) for k in self.curation.kernels.values()}
        self.project = lru_cache(maxsize=None)(self._project)
        self.implementation = lru_cache(maxsize=None)(self._implementation)
        self.environment = lru_cache(maxsize=None)(self._environment)
        self.protocol = lru_cache(maxsize=None)(self._protocol)
        self.family = lru_cache(maxsize=1024)(self._family)
        self.workload = lru_cache(maxsize=4096)(self._workload)
        self.series = lru_cache(maxsize=1024)(self._series)
        self.kernel_of = lru_cache(maxsize=1024)(self._kernel_of)

    def _kernel_of(self, kernel: str, config_text: str) -> str:
        return kernel_of(self.curation, kernel, config_text)

    # --- shared manifests -------------------------------------------------------------------
    def operation(self, kernel: str) -> Record:
        return self._operations[kernel]

    def _project(self, provider: str) -> Record:
        entry = self.curation.providers[provider]
        return _record(
            _manifest("SoftwareProject", {"name": entry.project_slug}, dict(entry.project))
        )

    def _implementation(self, kernel_name: str, provider_name: str) -> Record:
        kernel = self.curation.kernels[kernel_name]
        provider = self.curation.providers[provider_name]
        metadata: dict[str, Any] = {
            "name": implementation_name(kernel_name, provider_name),
            "title": f"{kernel.title} · {provider.title}",
            "description": provider.description,
        }
        if is_baseline(self.curation, provider_name):
            metadata["labels"] = {"role": "baseline"}
        metadata["sourceRefs"] = [{"url": self.curation.harness["repository"]}]
        spec = {
            "projectRevision": {},
            "operation": {"specDigest": self.operation(kernel_name).digest},
            **{k: v for k, v in provider.implementation.items() if k != "projectRevision"},
        }
        return _record(_manifest("ImplementationRevision", metadata, spec))

    def _environment(self, gpu_name: str) -> Record:
        gpu = self.curation.gpus[gpu_name]
        metadata = {
            "name": environment_name(gpu_name),
            "title": f"Liger benchmark host · {gpu.title}",
        }
        return _record(
            _manifest(
                "ExecutionEnvironment", metadata, {"hardware": dict(gpu.hardware), "software": {}}
            )
        )

    def _protocol(self, metric: str, mode: str) -> Record:
        method, passing = self.curation.metrics[metric], self.curation.passes[mode]
        memory = is_memory(metric)
        metadata = {
            "name": protocol_name(mode, memory),
            "title": f"Liger benchmark harness · {passing.title}"
            + (" · peak memory" if memory else ""),
        }
        spec = {
            "harness": dict(self.curation.harness),
            "measurement": {"timer": method["timer"], "primaryStatistic": "median"},
            "comparability": {
                "family": method["family"],
                "notes": method["notes"].format(**{"pass": passing.timed}),
            },
        }
        return _record(_manifest("BenchmarkProtocol", metadata, spec))

    # --- the workload a row binds -----------------------------------------------------------
    def _workload(self, kernel_name: str, x_name: str, x_text: str, config_text: str) -> Workload:
        """`reference_workload`'s result, or its RowRejected, built from the row's cached
        family; the generic way where the family cannot splice."""
        family = self.family(kernel_name, x_name, config_text)
        if family is None:
            return self.reference_workload(kernel_name, x_name, x_text, config_text)
        return family.workload(x_text)

    def _family(self, kernel_name: str, x_name: str, config_text: str) -> WorkloadFamily | None:
        """What the workloads of one config share; raises what `reference_workload` raises
        before it reads x, and is None where splicing is not provably byte-identical."""
        kernel = self.curation.kernels[kernel_name]
        binding, config = binding_of(kernel, x_name, parse_config(config_text))
        if binding.named_x:  # x is a name, not a size: the generic path binds it
            return None
        values = {k: v for k, v in config.items() if is_integer(v)}
        axes = _fixed_axes(binding, values)
        if axes is None:
            return None
        try:
            scalars, dtype = scalars_of(kernel, config), self._dtype(kernel, binding, config)
        except RowRejected as rejected:  # raised once x and the axes pass, as the generic path does
            return WorkloadFamily(kernel, values, axes, (rejected.reason, rejected.detail), None)
        except Exception:  # anything else: the generic path raises it, in its order
            return None
        cases = CaseTemplate.of(kernel, binding, dtype, scalars, self.operation(kernel_name).digest)
        return None if cases is None else WorkloadFamily(kernel, values, axes, None, cases)

    def reference_workload(
        self, kernel_name: str, x_name: str, x_text: str, config_text: str
    ) -> Workload:
        """The workload built as a dict and digested by the generic canonical path: the
        definition `_workload` is held to (tests/test_liger_workloads.py)."""
        kernel = self.curation.kernels[kernel_name]
        binding, config = binding_of(kernel, x_name, parse_config(config_text))
        axes, dtype, scalars = self._bind(kernel, binding, x_text, config)
        key = case_key(((name, str(axes[name])) for name in sorted(axes)), dtype)
        spec: dict[str, Any] = {
            "operationSpecDigest": self.operation(kernel_name).digest,
            "axes": axes,
            "tensors": _tensors(kernel, axes, dtype),
        }
        if scalars:
            spec["scalars"] = {
                name: {"dtype": "fp32", "value": value} for name, value in scalars.items()
            }
        spec["correctness"] = {"comparator": "not_asserted"}
        metadata = {
            "name": f"{kernel.slug}-{slug(key)}"[:NAME_LIMIT],
            "title": workload_title(kernel.title, ((n, str(v)) for n, v in axes.items()), dtype),
        }
        record = _record(_manifest("WorkloadCase", metadata, spec))
        if binding.named_x:
            # Two models (or labels) may give one workload (same vocab, say): each row stays its
            # own run, its externalId and name carrying the name its x value gives.
            key = f"{key}-{x_text.strip()}"
        return Workload(key, dtype, record, json_string(record.digest), slug(key))

    def _bind(
        self, kernel: Kernel, binding: Binding, x_text: str, config: dict[str, Any]
    ) -> tuple[dict[str, int], str, dict[str, float | int]]:
        values = {k: v for k, v in config.items() if is_integer(v)}
        if binding.x == "model":
            model = self.curation.models.get(x_text.strip())
            if model is None:
                raise RowRejected(
                    Reason.UNKNOWN_CONFIG_SHAPE, f"x_value {x_text[:80]!r} names no curated model"
                )
            values.update({MODEL_PREFIX + name: size for name, size in model.items()})
        elif binding.x == "label":
            if not LABEL.fullmatch(x_text.strip()):
                raise RowRejected(
                    Reason.UNKNOWN_CONFIG_SHAPE,
                    f"x_value {x_text[:80]!r} is not a configuration name",
                )
        else:
            values["x"] = positive_integer(x_text, "x_value")
        try:
            axes = {
                axis: axis_value(axis, expr.evaluate(values)) for axis, expr in binding.axes.items()
            }
        except (ExpressionError, TypeError) as error:
            raise RowRejected(Reason.UNKNOWN_CONFIG_SHAPE, f"{kernel.name}: {error}") from None
        scalars = scalars_of(kernel, config)
        return axes, self._dtype(kernel, binding, config), scalars

    def _dtype(self, kernel: Kernel, binding: Binding, config: dict[str, Any]) -> str:
        if "dtype" not in config:
            default = binding.default_dtype or kernel.default_dtype
            if default is None:
                raise RowRejected(
                    Reason.UNKNOWN_CONFIG_SHAPE, f"{kernel.name}: config names no dtype"
                )
            return default
        dtype = (
            self.curation.dtypes.get(config["dtype"]) if isinstance(config["dtype"], str) else None
        )
        if dtype is None:
            raise RowRejected(Reason.UNKNOWN_CONFIG_SHAPE, f"unknown dtype {config['dtype']!r}")
        return dtype

    # --- one row ----------------------------------------------------------------------------
    def normalize(self, row: dict[str, str]) -> tuple[list[Record], RunFacts]:
        """A row given as {column: text}."""
        return self.normalize_fields(tuple(row[c] for c in ROW_COLUMNS))

    def normalize_fields(self, fields: tuple[str, ...]) -> tuple[list[Record], RunFacts]:
        """A row given as the texts of ROW_COLUMNS, in that order (see `Layout`)."""
        return self.records(self.read_fields(fields))

    def read_fields(self, fields: tuple[str, ...]) -> RowRead:
        """What a row's texts say, each by its rule (pipelines/sources/liger/rules.py), or the
        RowRejected of the first that fails."""
        (kernel, provider, mode, metric, unit, x_name, x_value, median, p20, p80,
         config, gpu, timestamp, version) = fields  # fmt: skip
        kernel = self.kernel_of(kernel, config)
        series = self.series(kernel, provider, mode, gpu, metric, unit)
        stats = [
            parse_positive(median, "y_value_50"),
            parse_positive(p20, "y_value_20"),
            parse_positive(p80, "y_value_80"),
        ]
        observed_at, form = parse_timestamp(timestamp)
        stamp = Stamp(observed_at, json_string(observed_at), form, slug(form))
        workload = self.workload(series.kernel, x_name, x_value, config)
        values = series.values(stats)
        return RowRead(series, workload, stamp, stats, values, version.strip())

    def records(self, row: RowRead) -> tuple[list[Record], RunFacts]:
        """A read row's records, in the order `kindex normalize` writes them."""
        run, facts = self.run(row)
        operation, project, implementation, protocol, environment = row.series.references
        return [
            run,
            operation,
            project,
            implementation,
            row.workload.record,
            protocol,
            environment,
        ], facts

    def run(self, row: RowRead) -> tuple[Record, RunFacts]:
        """A row's run: a batch of one (tests/liger_oracle.py builds it the plain way and holds
        the two equal)."""
        from pipelines.sources.liger.columnar import assemble_run  # it builds on this module

        return assemble_run(row)

    def _series(
        self, kernel: str, provider: str, mode: str, gpu: str, metric_name: str, unit: str
    ) -> Series:
        """What every run of one kernel, provider, pass, GPU and metric (in one unit) shares."""
        metric, scale = metric_name, metric_scale(self.curation, metric_name, unit)
        check_known(self.curation, kernel, provider, mode, gpu)
        return Series(
            kernel=kernel,
            provider=provider,
            mode=mode,
            gpu=gpu,
            memory=is_memory(metric),
            unit=unit,
            scale=scale,
            kernel_title=self.curation.kernels[kernel].title,
            architecture=self.curation.gpus[gpu].hardware["architecture"],
            baseline=is_baseline(self.curation, provider),
            references=(
                self.operation(kernel),
                self.project(provider),
                self.implementation(kernel, provider),
                self.protocol(metric, mode),
                self.environment(gpu),
            ),
        )


_SHARED_LIMIT = 4
_shared: dict[str, Normalizer] = {}


def shared_normalizer() -> Normalizer:
    """The normalizer of the curation as the files say now, one per curation this process has
    met: its caches (run templates, workload families, shared records) then serve every file
    the process reads, not just one. An edited curation gets a normalizer of its own."""
    curation = load()
    normalizer = _shared.get(curation.fingerprint)
    if normalizer is None:
        if len(_shared) >= _SHARED_LIMIT:
            _shared.pop(next(iter(_shared)))
        normalizer = _shared.setdefault(curation.fingerprint, Normalizer(curation))
    return normalizer


@dataclass(frozen=True)
class Series:
    """A kernel × provider × pass × GPU × metric: the shared part of its runs.

    A run's canonical JSON differs from its series' other runs only in a few values, so it is
    written by filling the holes of a template the reference serializer made once per series
    (`run_template`), column-wise for a batch (pipelines/sources/liger/columnar.py).
    tests/liger_oracle.py
    builds the same record the plain way; the tests prove the two equal byte for byte.
    """

    kernel: str
    provider: str
    mode: str
    gpu: str
    memory: bool
    unit: str  # as the row writes it (sourceNative names its metrics after it)
    scale: float  # from the unit to integer ns (speed) or bytes (memory)
    kernel_title: str
    architecture: str
    baseline: bool
    references: tuple[Record, Record, Record, Record, Record]  # operation … environment

    @cached_property
    def references_json(self) -> tuple[bytes, bytes]:
        """The JSON of its references, comma-separated, in the order a run's records list
        them: (operation, project, implementation) before the workload, and after it (protocol,
        environment)."""
        before, after = self.references[:3], self.references[3:]
        return b",".join(r.json_bytes for r in before), b",".join(r.json_bytes for r in after)

    @cached_property
    def run_template(self) -> RunTemplate:
        holes = {name: _hole(name) for name in RUN_HOLES}
        spec = self._spec(
            [holes["v0"], holes["v1"], holes["v2"]],
            [holes["s0"], holes["s1"], holes["s2"]],
            holes["observed_at"],
            holes["external_id"],
            holes["workload"],
        )
        title = self._title()
        labels = {"liger_version": holes["version"]}
        head, tail = self._external_id_of("\0", "\0").split("\0/\0")
        parts = [slug(part) for part in self._name_parts()]
        spec_template = _template(spec)
        identity_template = _template(identity(_manifest("BenchmarkRun", {}, holes["spec"])))  # type: ignore[arg-type]
        manifest = _template(_manifest("BenchmarkRun", holes["metadata"], holes["spec"]))  # type: ignore[arg-type]
        full_manifest = manifest.replace("%(spec)s", spec_template)
        identity_head, metadata_lead = split_identity(identity_template, manifest)
        return RunTemplate(
            name_head="-".join(parts) if all(parts) else "",
            external_id_head=head,
            external_id_tail=tail,
            spec=spec_template,
            identity=identity_template,
            manifest=manifest,
            labelled=_template({"name": holes["name"], "title": title, "labels": labels}),
            unlabelled=_template({"name": holes["name"], "title": title}),
            full_manifest=full_manifest,
            identity_head=identity_head,
            metadata_lead=metadata_lead,
        )

    def values(self, stats: list[float]) -> list[int]:
        """A row's numbers in the stored unit, or RowRejected when JSON cannot hold them."""
        values = stored_values(np.array(stats, dtype=np.float64), self.scale)
        if not in_range(values):
            raise RowRejected(Reason.BAD_NUMBER, f"value out of range: {max(stats)!r}")
        return [int(v) for v in values]

    def _external_id_of(self, case_key: str, stamp: str) -> str:
        return external_id(
            self.kernel, self.mode, self.provider, self.gpu, case_key, stamp, self.memory
        )

    def _spec(
        self,
        values: list[Any],
        stats: list[Any],
        observed_at: str,
        external_id: str,
        workload_digest: str,
    ) -> dict[str, Any]:
        kernel, mode = self.kernel, self.mode
        _, _, implementation, protocol, environment = self.references
        spec: dict[str, Any] = {
            "implementationDigest": implementation.digest,
            "workloadDigest": workload_digest,
            "protocolDigest": protocol.digest,
            "environmentDigest": environment.digest,
            "status": "passed",
        }
        if self.memory:
            spec["measurements"] = [
                {"metric": "memory", "unit": "bytes", "statistic": s, "value": v}
                for s, v in zip(("median", "p20", "p80"), values, strict=True)
            ]
            native = self._native(stats)
        else:
            spec["timing"] = {"primaryStatistic": "median", "latencyNs": {"median": values[0]}}
            spec["measurements"] = [
                {"metric": "latency", "unit": "ns", "statistic": "p20", "value": values[1]},
                {"metric": "latency", "unit": "ns", "statistic": "p80", "value": values[2]},
            ]
            native = self._native(stats)
        spec["sourceNative"] = {
            "source": SOURCE,
            "benchmark": f"{kernel}/{mode}",
            "externalId": external_id,
            "metrics": native,
        }
        spec["observedAt"] = observed_at
        return spec

    def _native(self, stats: list[Any]) -> dict[str, Any]:
        """The row's own numbers, named after its unit and quantile (ms_50, mb_20, ...)."""
        names = (f"{self.unit.lower()}_{q}" for q in (50, 20, 80))
        return dict(zip(names, stats, strict=True))

    def _title(self) -> str:
        return run_title(self.kernel_title, self.provider, self.mode, self.memory)

    def name(self, workload: Workload, stamp: str) -> str:
        """A run's metadata.name (a batch joins the same slugs column-wise)."""
        return joined_slug(*self._name_parts(), workload.case_key, stamp)[:NAME_LIMIT]

    def _name_parts(self) -> tuple[str, ...]:
        return run_name_parts(self.kernel, self.mode, self.provider, self.gpu, self.memory)

    def facts(
        self,
        values: list[int],
        observed_at: str,
        external_id: str,
        workload: Workload,
        version: str,
    ) -> RunFacts:
        memory = self.memory
        return RunFacts(
            metric="memory" if memory else "latency",
            unit="bytes" if memory else "ns",
            kernel=self.kernel,
            provider=self.provider,
            mode=self.mode,
            gpu=self.gpu,
            architecture=self.architecture,
            dtype=workload.dtype,
            case_key=workload.case_key,
            median=values[0],
            p20=values[1],
            p80=values[2],
            observed_at=observed_at,
            external_id=external_id,
            liger_version=version or None,
            origin="reported",
            extra={"baseline": self.baseline},
        )


@dataclass(frozen=True, slots=True)
class RunTemplate:
    """%-format templates of a series' run: canonical spec and identity, manifest, metadata;
    and the constant parts of its runs' externalIds and names."""

    name_head: str  # the slugs of the name's constant parts, joined; "" when one is empty
    external_id_head: str
    external_id_tail: str
    spec: str
    identity: str
    manifest: str
    labelled: str
    unlabelled: str
    # The manifest with the spec's holes in place of %(spec)s, and how its bytes give the
    # identity's: identity_head, then what follows its metadata (`split_identity`).
    full_manifest: str
    identity_head: bytes
    metadata_lead: int  # the manifest's bytes before its metadata


def split_identity(identity: str, manifest: str) -> tuple[bytes, int]:
    """Templates of a canonical identity and of its manifest (sorted keys, so the manifest is
    the identity with `,"metadata":…` after "kind") as (head, lead): a filled identity is
    `head` and then the filled manifest's bytes after its metadata, which start `lead` bytes
    plus the metadata's length in. Raises AssertionError for templates not so made."""
    before, metadata, after = manifest.partition("%(metadata)s")
    head = identity.removesuffix(after)
    if not metadata or head == identity or "%(" in before or not before.startswith(head):
        raise AssertionError("the manifest is not its identity plus its metadata")
    return head.replace("%%", "%").encode(), len(before.replace("%%", "%").encode())


RUN_HOLES = (
    "v0", "v1", "v2", "s0", "s1", "s2", "observed_at", "external_id", "workload",
    "spec", "metadata", "name", "version",
)  # fmt: skip


def _hole(name: str) -> str:
    return f"@@kindex-hole:{name}@@"


def _template(document: Any) -> str:
    """The reference serializer's canonical JSON of `document` as a %-format template: each
    `_hole(name)` string (quotes included) becomes `%(name)s`, to be filled with JSON text."""
    text = canonical_json_reference(document).decode().replace("%", "%%")
    for name in RUN_HOLES:
        quoted = json_string(_hole(name))
        if text.count(quoted) > 1:
            raise AssertionError(f"hole {name} appears twice")
        text = text.replace(quoted, f"%({name})s")
    return text


@lru_cache(maxsize=256)
def version_json(version: str) -> str:
    return json_string(version)


def json_string(text: str) -> str:
    """A string as JSON text; RFC 8785 and orjson escape strings alike (tests/test_canonical.py)."""
    return orjson.dumps(text).decode()


# --- workload families -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class WorkloadFamily:
    """The workloads of one kernel, x_name and config: what x does not change, computed once.

    Only the axes whose expressions name x are evaluated per workload. The config-only ones
    are evaluated here; the family is made only when they all bind (else the generic path keeps
    the order of the errors)."""

    kernel: Kernel
    values: dict[str, Any]  # the config's integer-valued entries: what axis expressions read
    axes: tuple[tuple[str, Expression | None, int], ...]  # binding order; no expression: fixed
    late: tuple[Reason, str] | None  # the scalars' or dtype's rejection, raised once x is checked
    cases: CaseTemplate | None  # None exactly when `late` is set

    def workload(self, x_text: str) -> Workload:
        """The workload of one x, or the RowRejected the generic path raises for it."""
        values = dict(self.values)
        values["x"] = positive_integer(x_text, "x_value")
        try:
            axes = {
                axis: value if expr is None else axis_value(axis, expr.evaluate(values))
                for axis, expr, value in self.axes
            }
        except (ExpressionError, TypeError) as error:
            raise RowRejected(Reason.UNKNOWN_CONFIG_SHAPE, f"{self.kernel.name}: {error}") from None
        if self.late is not None:
            raise RowRejected(*self.late)
        assert self.cases is not None
        return self.cases.workload(axes)


@dataclass(frozen=True, slots=True)
class CaseTemplate:
    """A family's WorkloadCase with holes for the axes, the tensors and the metadata.

    Its canonical JSON and its manifest JSON are byte pieces the reference serializer and orjson
    wrote once, spliced around orjson's sorted dumps of a workload's axes and tensors. Those
    dumps are RFC 8785's bytes when every key is ASCII and every integer within ±(2**53-1)
    (pipelines/records/canonical.py): `of` checks the names once; sizes and scalars past 2**53-1 are
    rejected before (`_axis_value`, `_scalar`)."""

    kernel: Kernel
    dtype: str
    tensors: tuple[tuple[str, tuple[Any, ...], str], ...]  # each input tensor: name, shape, dtype
    scalars: dict[str, Any] | None  # spec.scalars, shared by the family's records (immutable)
    operation_digest: str
    sorted_axes: tuple[str, ...]
    case_key: str  # %-format over the axis values in sorted order
    case_slug: str  # slug(case_key) as a %-format over the same
    title: str  # %-format over the axis values in binding order
    name_head: str  # the metadata.name before the case slug
    identity: tuple[bytes, ...]  # the canonical identity around the axes and the tensors
    manifest: tuple[bytes, ...]  # the manifest JSON around the metadata, axes and tensors

    @classmethod
    def of(
        cls,
        kernel: Kernel,
        binding: Binding,
        dtype: str,
        scalars: dict[str, float | int],
        operation_digest: str,
    ) -> CaseTemplate | None:
        """The template, or None when some part of it is outside what splicing may print."""
        tensors = _tensor_plan(kernel, dtype)
        if tensors is None:
            return None
        names = [*binding.axes, *kernel.scalars, *(t[0] for t in tensors), dtype]
        if (
            not binding.axes
            or not all(_ascii(name) for name in names)
            or not (_encodable(kernel.title) and _encodable(kernel.slug))
        ):
            return None
        scalar_spec = {name: {"dtype": "fp32", "value": value} for name, value in scalars.items()}
        holed = {
            **_manifest("WorkloadCase", {}, {}),
            "metadata": _hole("metadata"),
            "spec": _case_spec(operation_digest, _hole("axes"), _hole("tensors"), scalar_spec),
        }
        sorted_axes = tuple(sorted(binding.axes))
        return cls(
            kernel=kernel,
            dtype=dtype,
            tensors=tensors,
            scalars=scalar_spec or None,
            operation_digest=operation_digest,
            sorted_axes=sorted_axes,
            case_key=case_key(((_escape(axis), "%d") for axis in sorted_axes), _escape(dtype)),
            case_slug=_slug_format(sorted_axes, dtype),
            title=workload_title(
                _escape(kernel.title), ((_escape(a), "%d") for a in binding.axes), _escape(dtype)
            ),
            name_head=f"{kernel.slug}-",
            identity=_pieces(canonical_json_reference(identity(holed)), ("axes", "tensors")),
            manifest=_pieces(orjson.dumps(holed, option=orjson.OPT_SORT_KEYS), _MANIFEST_HOLES),
        )

    def workload(self, axes: dict[str, int]) -> Workload:
        # Every size is a safe integer (_axis_value rejects the others): orjson prints it as
        # RFC 8785 does.
        sizes = sizes_of(self.kernel, axes)
        tensors = {
            name: {
                "shape": [dim if isinstance(dim, int) else sizes[dim] for dim in shape],
                "dtype": dtype,
            }
            for name, shape, dtype in self.tensors
        }
        ordered = tuple(axes[axis] for axis in self.sorted_axes)
        case_slug = self.case_slug % ordered
        metadata = {
            "name": (self.name_head + case_slug)[:NAME_LIMIT],
            "title": self.title % tuple(axes.values()),
        }
        axes_json = orjson.dumps(axes, option=orjson.OPT_SORT_KEYS)
        tensors_json = orjson.dumps(tensors, option=orjson.OPT_SORT_KEYS)
        head, middle, tail = self.identity
        digest = digest_of_canonical(b"".join((head, axes_json, middle, tensors_json, tail)))
        start, after_metadata, after_axes, end = self.manifest
        text = b"".join(
            (
                start,
                orjson.dumps(metadata),
                after_metadata,
                axes_json,
                after_axes,
                tensors_json,
                end,
            )
        ).decode()
        spec = _case_spec(self.operation_digest, axes, tensors, self.scalars)
        record = Record(
            "WorkloadCase", digest, _manifest("WorkloadCase", metadata, spec), manifest_json=text
        )
        # The digest is "sha256:" and hex digits: nothing in it for JSON to escape.
        return Workload(self.case_key % ordered, self.dtype, record, f'"{digest}"', case_slug)


_MANIFEST_HOLES = ("metadata", "axes", "tensors")


def _case_spec(
    operation_digest: str, axes: Any, tensors: Any, scalars: dict[str, Any] | None
) -> dict[str, Any]:
    """A WorkloadCase spec with the keys in `reference_workload`'s order (`Record.json_bytes`
    prints the manifest dict unsorted); axes and tensors may be holes."""
    spec: dict[str, Any] = {
        "operationSpecDigest": operation_digest,
        "axes": axes,
        "tensors": tensors,
    }
    if scalars:
        spec["scalars"] = scalars
    spec["correctness"] = {"comparator": "not_asserted"}
    return spec


def _fixed_axes(
    binding: Binding, values: dict[str, Any]
) -> tuple[tuple[str, Expression | None, int], ...] | None:
    """The binding's axes with the config-only ones evaluated; None when one of those fails
    (which error wins then depends on x: the generic path decides)."""
    axes: list[tuple[str, Expression | None, int]] = []
    for axis, expr in binding.axes.items():
        if "x" in expr.names:
            axes.append((axis, expr, 0))
            continue
        try:
            axes.append((axis, None, axis_value(axis, expr.evaluate(values))))
        except Exception:  # see the docstring
            return None
    return tuple(axes)


def _tensor_plan(kernel: Kernel, dtype: str) -> tuple[tuple[str, tuple[Any, ...], str], ...] | None:
    """Each input tensor's name, shape (axis names and literal sizes) and dtype, as `_tensors`
    reads them; None when the operation holds something the template could not print alike."""
    plan = []
    try:
        for entry in kernel.operation["spec"]["inputs"]:
            tensor = entry.get("tensor")
            if tensor is None:
                continue
            shape = tuple(tensor["shape"])
            plan.append(
                (entry["name"], shape, dtype if tensor["dtype"] == "float" else tensor["dtype"])
            )
    except Exception:  # a malformed operation: the generic path raises it, in its order
        return None
    literals = [dim for _, shape, _ in plan for dim in shape if isinstance(dim, int)]
    if all(_ascii(entry[2]) for entry in plan) and all(
        type(dim) is bool or abs(dim) <= MAX_SAFE_INTEGER for dim in literals
    ):
        return tuple(plan)
    return None


def _ascii(name: Any) -> bool:
    return type(name) is str and name.isascii()


def _encodable(text: str) -> bool:
    """Text orjson can print (no lone surrogates)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _escape(text: str) -> str:
    """`text` as a %-format that prints it."""
    return text.replace("%", "%%")


def _slug_format(sorted_axes: tuple[str, ...], dtype: str) -> str:
    """slug(case_key) as a %-format over the axis values. The values are non-empty runs of
    digits, which slug keeps and no run of other characters crosses, so the slug is that of each
    ASCII piece between them; only the first and last pieces touch the ends that slug strips."""
    pieces = [sorted_axes[0], *(f"-{axis}" for axis in sorted_axes[1:]), f"-{dtype}"]
    slugs = [SLUG_BREAK.sub("-", piece.lower()) for piece in pieces]
    slugs[0], slugs[-1] = slugs[0].lstrip("-"), slugs[-1].rstrip("-")
    return "%d".join(slugs)


def _pieces(text: bytes, holes: tuple[str, ...]) -> tuple[bytes, ...]:
    """`text` cut at each hole (its JSON string, quotes included), in that order."""
    pieces = []
    for name in holes:
        quoted = json_string(_hole(name)).encode()
        if text.count(quoted) != 1:
            raise AssertionError(f"hole {name} appears {text.count(quoted)} times")
        piece, text = text.split(quoted)
        pieces.append(piece)
    return (*pieces, text)


def _tensors(kernel: Kernel, axes: dict[str, int], dtype: str) -> dict[str, Any]:
    sizes = sizes_of(kernel, axes)
    tensors = {}
    for entry in kernel.operation["spec"]["inputs"]:
        tensor = entry.get("tensor")
        if tensor is None:
            continue
        shape = [dim if isinstance(dim, int) else sizes[dim] for dim in tensor["shape"]]
        tensors[entry["name"]] = {
            "shape": shape,
            "dtype": dtype if tensor["dtype"] == "float" else tensor["dtype"],
        }
    return tensors


# --- the file ---------------------------------------------------------------------------------
def duplicate_outcome(line: int, raw: str, external_id: str) -> RowOutcome:
    detail = f"externalId {external_id} already appeared earlier in this file (first one wins)"
    return RowOutcome(line, "quarantined", raw, Reason.DUPLICATE_EXTERNAL_ID, detail)


def read_record(record: CsvRecord, layout: Layout, normalizer: Normalizer) -> RowOutcome | RowRead:
    """What one record says, judged alone (duplicates across the file are the caller's rule),
    or its quarantine: how a batch reads a row its columns cannot
    (pipelines/sources/liger/columnar.py)."""
    fields = record.fields
    if fields is None or record.error is not None:
        reason = (record.error or "unparseable_row").split(":", 1)[0]
        return RowOutcome(record.line, "quarantined", record.raw, reason, record.error)
    if len(fields) != layout.width:
        detail = f"expected {layout.width} fields, found {len(fields)}"
        return RowOutcome(record.line, "quarantined", record.raw, Reason.WRONG_COLUMN_COUNT, detail)
    longest = max(range(len(fields)), key=lambda i: len(fields[i]))
    if len(fields[longest]) > FIELD_LIMIT:
        detail = (
            f"field {longest + 1} holds {len(fields[longest])} characters,"
            f" over the limit of {FIELD_LIMIT}"
        )
        return RowOutcome(record.line, "quarantined", record.raw, Reason.FIELD_TOO_LARGE, detail)
    try:
        return normalizer.read_fields(layout.pick(fields))
    except RowRejected as rejected:
        return RowOutcome(record.line, "quarantined", record.raw, rejected.reason, rejected.detail)


def normalize_lines(
    lines: Iterable[bytes], normalizer: Normalizer | None = None
) -> Iterator[RowOutcome]:
    """Normalize a Liger CSV given as binary lines (e.g. a file opened "rb"): streams, in
    batches (pipelines/sources/liger/columnar.py), one outcome per row.

    Raises NotLigerCsv before yielding anything when the header is not Liger's.
    """
    from pipelines.sources.liger.columnar import normalized_outcomes  # it builds on this module

    return normalized_outcomes(lines, normalizer)


def normalize_bytes(data: bytes, normalizer: Normalizer | None = None) -> Iterator[RowOutcome]:
    return normalize_lines(io.BytesIO(data), normalizer)

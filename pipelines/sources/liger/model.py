"""The Liger source's data model: what rows share, built once per distinct value and cached.

A row becomes a BenchmarkRun plus the six manifests it references, byte-identical (digest for
digest) to KernelIndex's own Liger importer for every row that importer imports. Memory rows,
which the importer skips, become runs under a memory protocol (see docs/memory-runs.md); a config
the curation does not know becomes an uncurated workload (`Normalizer.workload`).

This module holds the shared manifests (Normalizer), a series' run template (Series), the
workloads, and the one template kind runs are written with (Template). What each text means is
pipelines/sources/liger/rules.py; a batch of rows is read and its runs are filled column-wise by
pipelines/sources/liger/columnar.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

import orjson
import pyarrow as pa

from pipelines import API_VERSION
from pipelines.curation import (
    MODEL_PREFIX,
    Binding,
    Curation,
    ExpressionError,
    Kernel,
    Pass,
    Provider,
    load,
)
from pipelines.curation.gaps import (
    Gap,
    UncuratedCase,
    gap_labels,
    gpu_hardware,
)
from pipelines.records import Record, RunFacts
from pipelines.records.canonical import (
    canonical_json,
    identity,
    manifest_digest,
)
from pipelines.records.rules import NAME_LIMIT, SHORT_LIMIT, UNSPECIFIED, joined_slugs, slug
from pipelines.records.rules import key_of as axis_name
from pipelines.sources.liger.read import layout_columns, layout_of
from pipelines.sources.liger.rules import (
    LABEL,
    LAYOUTS,
    ORIGIN,
    QUANTILES,
    SOURCE,
    STATUS,
    CsvLayout,
    Statistics,
    Uncurated,
    axis_value,
    binding_of,
    case_key,
    environment_name,
    external_id_parts,
    gaps_of,
    implementation_name,
    is_baseline,
    is_integer,
    is_memory,
    kernel_of,
    metric_kind,
    named_metric,
    parse_config,
    positive_integer,
    protocol_name,
    run_name_parts,
    run_title,
    scalars_of,
    sizes_of,
    stored_metric,
    workload_title,
)

# The code's version; see parser_version() for the full one. 3: the 2024 layouts are read. A
# file of one that an earlier reader refused has an `unrecognized` record set under this
# source's version (sources/__init__.py), which a backfill would otherwise reuse.
PARSER_VERSION = "liger-csv/3"


def parser_version(curation: Curation | None = None) -> str:
    """The code's version plus the curation's fingerprint: records made by another curation (a
    GPU added since, say) are rebuilt by a backfill, not reused."""
    return f"{PARSER_VERSION}+{(curation or load()).fingerprint}"


def row_columns(layout: CsvLayout = LAYOUTS[0]) -> tuple[str, ...]:
    """The columns the normalizer reads, in this order, as today's header names them (a
    layout's value columns in the quantiles' place); x_label is only a caption."""
    named_today = CsvLayout("", layout.statistics)  # its own names aside, liger_version kept
    return tuple(c for c in layout_columns(named_today) if c != "x_label")


# Today's layout's (the oracle's order: tests/liger_oracle.py).
ROW_COLUMNS = row_columns()


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a file's header puts its layout's row_columns in each record's fields (-1: a
    column the layout lacks, liger_version, read as empty)."""

    width: int  # fields a well-formed record has
    pick: Callable[[list[str]], tuple[str, ...]]  # its row_columns texts, in order
    indices: tuple[int, ...]  # where those texts are among the fields
    csv: CsvLayout = LAYOUTS[0]

    @property
    def statistics(self) -> Statistics:
        return self.csv.statistics

    @classmethod
    def of(cls, columns: tuple[str, ...]) -> Layout:
        layout = layout_of(columns)
        named = dict(layout.renamed)
        indices = tuple(
            columns.index(named.get(c, c)) if named.get(c, c) in columns else -1
            for c in row_columns(layout)
        )

        def pick(fields: list[str]) -> tuple[str, ...]:
            return tuple(fields[i] if i >= 0 else "" for i in indices)

        return cls(len(columns), pick, indices, layout)


def manifest(kind: str, metadata: Any, spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata, "spec": spec}


def _record(document: dict[str, Any]) -> Record:
    return Record(document["kind"], manifest_digest(document), document)


# Where a row's workload goes among the manifests its run references (RowOutcome.records lists
# the run, then these): its series' operation, project and implementation, the workload, then
# its series' protocol and environment.
WORKLOAD_SLOT = 3


def references(series: Series, workload: Workload) -> list[Record]:
    """The manifests a run references, in the order a row's records list them after the run."""
    shared = series.references
    return [*shared[:WORKLOAD_SLOT], workload.record, *shared[WORKLOAD_SLOT:]]


@dataclass(frozen=True)
class Workload:
    case_key: str
    dtype: str
    record: Record
    uncurated: bool  # bound by no curated binding: its parameters as they stand

    @cached_property
    def case_slug(self) -> str:
        return slug(self.case_key)


class Normalizer:
    """Builds the records rows share (a series' manifests, workloads), each once, and caches
    them."""

    def __init__(self, curation: Curation | None = None) -> None:
        self.curation = curation or load()
        self._operations = {k.name: _record(k.operation) for k in self.curation.kernels.values()}
        self.project = lru_cache(maxsize=None)(self._project)
        self.implementation = lru_cache(maxsize=None)(self._implementation)
        self.environment = lru_cache(maxsize=None)(self._environment)
        self.protocol = lru_cache(maxsize=None)(self._protocol)
        self.workload = lru_cache(maxsize=4096)(self._workload)
        self.series = lru_cache(maxsize=1024)(self._series)
        self.kernel_of = lru_cache(maxsize=1024)(self._kernel_of)

    def _kernel_of(self, kernel: str, config_text: str) -> str:
        return kernel_of(self.curation, kernel, config_text)

    # --- shared manifests -------------------------------------------------------------------
    def operation(self, kernel: str) -> Record:
        found = self._operations.get(kernel)
        if found is None:
            found = self._operations[kernel] = _record(_uncurated_operation(kernel))
        return found

    def kernel_title(self, kernel: str) -> str:
        curated = self.curation.kernels.get(kernel)
        return kernel if curated is None else curated.title

    def _provider(self, provider: str) -> Provider | None:
        """A provider's curated entry (also where it is not curated for the kernel: its project
        and implementation are still what the curation says of it)."""
        return self.curation.providers.get(provider)

    def _project(self, provider: str) -> Record:
        entry = self._provider(provider)
        if entry is None:  # a provider the curation lacks: a project of its name
            metadata = {"name": f"uncurated-{slug(provider) or UNSPECIFIED}"[:NAME_LIMIT]}
            labels = gap_labels([Gap.PROVIDER])
            return _record(
                manifest("SoftwareProject", {**metadata, "labels": labels}, {"name": provider})
            )
        return _record(
            manifest("SoftwareProject", {"name": entry.project_slug}, dict(entry.project))
        )

    def _implementation(self, kernel_name: str, provider_name: str) -> Record:
        provider = self._provider(provider_name)
        metadata: dict[str, Any] = {
            "name": implementation_name(kernel_name, provider_name),
            "title": f"{self.kernel_title(kernel_name)} · "
            f"{provider_name if provider is None else provider.title}"[:NAME_LIMIT],
        }
        if provider is not None:
            metadata["description"] = provider.description
        if is_baseline(self.curation, provider_name, kernel_name):
            metadata["labels"] = {"role": "baseline"}
        gaps = gaps_of(self.curation, kernel_name, provider_name, "", "")
        gaps = [g for g in gaps if g in (Gap.KERNEL, Gap.PROVIDER)]
        if gaps:
            metadata["labels"] = gap_labels(gaps)
        metadata["sourceRefs"] = [{"url": self.curation.harness["repository"]}]
        implementation = _UNCURATED_IMPLEMENTATION if provider is None else provider.implementation
        spec = {
            "projectRevision": {},
            "operation": {"specDigest": self.operation(kernel_name).digest},
            **{k: v for k, v in implementation.items() if k != "projectRevision"},
        }
        return _record(manifest("ImplementationRevision", metadata, spec))

    def _environment(self, gpu_name: str) -> Record:
        hardware, curated = gpu_hardware(self.curation, gpu_name)
        title = self.curation.gpus[gpu_name].title if curated else gpu_name
        metadata: dict[str, Any] = {
            "name": environment_name(gpu_name),
            "title": f"Liger benchmark host · {title}"[:NAME_LIMIT],
        }
        if not curated:
            metadata["labels"] = gap_labels([Gap.GPU])
        return _record(
            manifest("ExecutionEnvironment", metadata, {"hardware": hardware, "software": {}})
        )

    def _protocol(
        self,
        metric: str,
        mode: str,
        metric_name: str | None = None,
        statistic: str = QUANTILES.primary,
    ) -> Record:
        """The protocol of a curated metric (speed, memory, speed_graph) and pass; `metric_name`
        names a metric other than speed and memory: the curated one, or one the curation lacks,
        stored as `metric`, which gets a protocol of its own. `statistic` is the primary
        statistic its runs report (a layout's: rules.Statistics)."""
        method = self.curation.metrics[metric]
        passing = self.curation.passes.get(mode) or _uncurated_pass(mode)
        memory = is_memory(metric)
        measured = f" · {metric_name}" if metric_name else " · peak memory" if memory else ""
        metadata: dict[str, Any] = {
            "name": protocol_name(mode, memory, metric_name, statistic),
            "title": f"Liger benchmark harness · {passing.title}{measured}"[:NAME_LIMIT],
        }
        notes = method["notes"].format(**{"pass": passing.timed})
        family = method["family"]
        gaps = [Gap.MODE] if mode not in self.curation.passes else []
        if metric_name is not None and metric_name != metric:
            gaps.append(Gap.METRIC)
            family = f"{family}_{axis_name(metric_name)}"[:SHORT_LIMIT]
            notes = f"Metric {metric_name!r}, as the file names it (uncurated). {notes}"
        if gaps:
            metadata["labels"] = gap_labels(gaps)
        spec = {
            "harness": dict(self.curation.harness),
            "measurement": {"timer": method["timer"], "primaryStatistic": statistic},
            "comparability": {"family": family, "notes": notes[:1000]},
        }
        return _record(manifest("BenchmarkProtocol", metadata, spec))

    # --- the workload a row binds -----------------------------------------------------------
    def _workload(self, kernel_name: str, x_name: str, x_text: str, config_text: str) -> Workload:
        """The workload of a row's kernel, x and config: curated when a binding of the curation
        binds them, else uncurated (its parameters as they stand). RowRejected when the config
        is not JSON."""
        config = parse_config(config_text)
        kernel = self.curation.kernels.get(kernel_name)
        if kernel is None:
            return self._uncurated(kernel_name, x_name, x_text, config)
        try:
            binding, bound = binding_of(kernel, x_name, config)
            axes, dtype, scalars = self._bind(kernel, binding, x_text, bound)
            tensors = _tensors(kernel, axes, dtype)
        except Uncurated:
            return self._uncurated(kernel_name, x_name, x_text, config)
        key = case_key(((name, str(axes[name])) for name in sorted(axes)), dtype)
        spec: dict[str, Any] = {
            "operationSpecDigest": self.operation(kernel_name).digest,
            "axes": axes,
            "tensors": tensors,
        }
        if scalars:
            spec["scalars"] = {
                name: {"dtype": "fp32", "value": value} for name, value in scalars.items()
            }
        spec["correctness"] = {"comparator": "not_asserted"}
        metadata = {
            "name": f"{kernel.slug}-{slug(key)}"[:SHORT_LIMIT],
            "title": workload_title(kernel.title, ((n, str(v)) for n, v in axes.items()), dtype),
        }
        record = _record(manifest("WorkloadCase", metadata, spec))
        if binding.named_x:
            # Two models (or labels) may give one workload (same vocab, say): each row stays its
            # own run, its externalId and name carrying the name its x value gives.
            key = f"{key}-{x_text.strip()}"
        return Workload(key, dtype, record, uncurated=False)

    def _uncurated(
        self, kernel_name: str, x_name: str, x_text: str, config: dict[str, Any]
    ) -> Workload:
        """A workload no binding describes: x (under its x_name) and the config as they stand
        (gaps.UncuratedCase: each integer one an axis, the rest in the case key). A later
        curation turns its runs into curated ones on backfill."""
        x_value = x_text.strip()
        swept: Any = int(x_value) if x_value.isdecimal() and x_value.isascii() else x_value
        parameters = {**config, x_name: swept}
        exact = [config, x_name, x_value] if x_name in config else None
        case = UncuratedCase(parameters, exact)
        dtype = config.get("dtype")
        dtype = self.curation.dtypes.get(dtype, "unknown") if isinstance(dtype, str) else "unknown"
        spec = {
            "operationSpecDigest": self.operation(kernel_name).digest,
            "axes": case.identity_axes(),
            "tensors": {},
            "correctness": {"comparator": "not_asserted"},
        }
        title = self.kernel_title(kernel_name)
        name = f"{_kernel_slug(self.curation, kernel_name)}-{slug(case.case_key)}"
        metadata = {
            "name": name[:SHORT_LIMIT],
            "title": f"{title} · uncurated · {case.title}"[:NAME_LIMIT],
            "description": case.description,
            "labels": gap_labels([Gap.CONFIG]),
        }
        record = _record(manifest("WorkloadCase", metadata, spec))
        return Workload(case.case_key, dtype, record, True)

    def _bind(
        self, kernel: Kernel, binding: Binding, x_text: str, config: dict[str, Any]
    ) -> tuple[dict[str, int], str, dict[str, float | int]]:
        values = {k: v for k, v in config.items() if is_integer(v)}
        if binding.x == "model":
            model = self.curation.models.get(x_text.strip())
            if model is None:
                raise Uncurated(f"x_value {x_text[:80]!r} names no curated model")
            values.update({MODEL_PREFIX + name: size for name, size in model.items()})
        elif binding.x == "label":
            if not LABEL.fullmatch(x_text.strip()):
                raise Uncurated(f"x_value {x_text[:80]!r} is not a configuration name")
        else:
            values["x"] = positive_integer(x_text, "x_value")
        try:
            axes = {
                axis: axis_value(axis, expr.evaluate(values)) for axis, expr in binding.axes.items()
            }
        except (ExpressionError, TypeError) as error:
            raise Uncurated(f"{kernel.name}: {error}") from None
        scalars = scalars_of(kernel, config)
        return axes, self._dtype(kernel, binding, config), scalars

    def _dtype(self, kernel: Kernel, binding: Binding, config: dict[str, Any]) -> str:
        if "dtype" not in config:
            default = binding.default_dtype or kernel.default_dtype
            if default is None:
                raise Uncurated(f"{kernel.name}: config names no dtype")
            return default
        dtype = (
            self.curation.dtypes.get(config["dtype"]) if isinstance(config["dtype"], str) else None
        )
        if dtype is None:
            raise Uncurated(f"unknown dtype {config['dtype']!r}")
        return dtype

    def _series(
        self,
        kernel: str,
        provider: str,
        mode: str,
        gpu: str,
        metric_name: str,
        unit: str,
        statistics: Statistics = QUANTILES,
        present: tuple[str, ...] | None = None,
    ) -> Series:
        """What every run of one kernel, provider, pass, GPU and metric (in one unit) shares,
        in one layout (`statistics`), with the statistics its rows hold (`present`: all of the
        layout's when None). A name the curation lacks is a gap of the series (gaps.py), never
        a rejection; only a unit no rule converts is."""
        metric = metric_kind(self.curation, metric_name, unit)
        gaps = gaps_of(self.curation, kernel, provider, mode, gpu)
        named = named_metric(metric_name, metric.kind, metric.uncurated)
        if metric.uncurated:
            gaps.append(Gap.METRIC)
        environment = self.environment(gpu)
        return Series(
            kernel=kernel,
            provider=provider,
            mode=mode,
            gpu=gpu,
            memory=is_memory(metric.kind),
            unit=unit,
            scale=metric.scale,
            kernel_title=self.kernel_title(kernel),
            architecture=environment.manifest["spec"]["hardware"]["architecture"],
            baseline=is_baseline(self.curation, provider, kernel),
            references=(
                self.operation(kernel),
                self.project(provider),
                self.implementation(kernel, provider),
                self.protocol(metric.kind, mode, named, statistics.primary),
                environment,
            ),
            metric=named,
            gaps=tuple(gaps),
            statistics=statistics,
            present=statistics.names if present is None else present,
        )


RUN_HOLES = (
    "v0", "v1", "v2", "s0", "s1", "s2", "observed_at", "external_id", "workload",
    "metadata", "name", "labels",
)  # fmt: skip
METADATA_KEY = '"metadata":'


@dataclass(frozen=True)
class Series:
    """A kernel × provider × pass × GPU × metric: the shared part of its runs.

    A run's canonical JSON differs from its series' other runs only in a few values, so it is
    written by filling the holes of a template the canonical serializer made once per series
    (`run_template`), column-wise for a batch (pipelines/sources/liger/columnar.py).
    tests/liger_oracle.py builds the same record the plain way; the tests hold the two equal
    byte for byte.
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
    metric: str | None = None  # a metric other than speed and memory (rules.named_metric)
    gaps: tuple[Gap, ...] = ()  # what the curation lacks of its names (gaps.py)
    statistics: Statistics = QUANTILES  # its layout's value columns
    present: tuple[str, ...] = QUANTILES.names  # those its rows hold, in the layout's order

    @cached_property
    def references_json(self) -> tuple[bytes, bytes]:
        """The JSON of its references that a row's records list before the workload, and of
        those after it, each joined by commas (`references`)."""
        shared = [r.json_bytes for r in self.references]
        return b",".join(shared[:WORKLOAD_SLOT]), b",".join(shared[WORKLOAD_SLOT:])

    @cached_property
    def run_template(self) -> RunTemplate:
        holes = {name: hole(name) for name in RUN_HOLES}
        # A run's i-th statistic of its layout fills holes v<i> and s<i>; an absent one none.
        at = [self.statistics.names.index(name) for name in self.present]
        spec = self.spec(
            [holes[f"v{i}"] for i in at],
            [holes[f"s{i}"] for i in at],
            holes["observed_at"],
            holes["external_id"],
            holes["workload"],
        )
        document = manifest("BenchmarkRun", holes["metadata"], spec)
        full, meaning = Template.of(document, RUN_HOLES), Template.of(identity(document), RUN_HOLES)
        # Keys sorted: the identity is the manifest without `"metadata":…,` (after "kind").
        lead = full.pieces[0]
        assert full.holes[0] == "metadata" and lead.endswith(METADATA_KEY)
        assert meaning.pieces[0] == lead.removesuffix(METADATA_KEY) + full.pieces[1][1:]
        assert (meaning.pieces[1:], meaning.holes) == (full.pieces[2:], full.holes[1:])
        metadata = {"name": holes["name"], "title": self.title}
        head, tail = external_id_parts(
            self.kernel, self.mode, self.provider, self.gpu, self.memory, self.metric
        )
        return RunTemplate(
            name_head=joined_slugs([pa.array([slug(part)]) for part in self.name_parts])[0].as_py(),
            external_id_head=head,
            external_id_tail=tail,
            manifest=full,
            metadata=(
                Template.of(metadata, RUN_HOLES),
                Template.of({**metadata, "labels": holes["labels"]}, RUN_HOLES),
            ),
            identity_head=lead.removesuffix(METADATA_KEY).encode(),
            metadata_lead=len(lead.encode()) + 1,  # and the comma after the metadata
        )

    def spec(
        self,
        values: list[Any],
        stats: list[Any],
        observed_at: str,
        external_id: str,
        workload_digest: str,
    ) -> dict[str, Any]:
        """A run's spec: the run as the reference importer writes it. `values` and `stats`
        are its present statistics' (stored and as the row wrote them), primary first."""
        metric, unit = stored_metric(self.memory)
        _, _, implementation, protocol, environment = self.references
        spec: dict[str, Any] = {
            "implementationDigest": implementation.digest,
            "workloadDigest": workload_digest,
            "protocolDigest": protocol.digest,
            "environmentDigest": environment.digest,
            "status": STATUS,
        }
        measured = list(zip(self.present, values, strict=True))
        if not self.memory:
            primary, value = measured.pop(0)
            spec["timing"] = {"primaryStatistic": primary, "latencyNs": {primary: value}}
        if measured:
            spec["measurements"] = [
                {"metric": metric, "unit": unit, "statistic": statistic, "value": value}
                for statistic, value in measured
            ]
        spec["sourceNative"] = {
            "source": SOURCE,
            "benchmark": f"{self.kernel}/{self.mode}",
            "externalId": external_id,
            # The row's own numbers, named after its unit and value column (ms_50, mb_mean).
            "metrics": dict(
                zip(self.statistics.native_names(self.unit, self.present), stats, strict=True)
            ),
        }
        spec["observedAt"] = observed_at
        return spec

    @property
    def title(self) -> str:
        return run_title(self.kernel_title, self.provider, self.mode, self.memory, self.metric)

    @property
    def name_parts(self) -> tuple[str, ...]:
        return run_name_parts(
            self.kernel, self.mode, self.provider, self.gpu, self.memory, self.metric
        )

    def facts(
        self,
        values: list[int],
        observed_at: str,
        external_id: str,
        workload: Workload,
        version: str,
    ) -> RunFacts:
        metric, unit = stored_metric(self.memory)
        held = dict(zip(self.present, values, strict=False))
        extra: dict[str, Any] = {"baseline": self.baseline}
        if "mean" in held:
            extra["mean"] = held["mean"]
        return RunFacts(
            metric=metric,
            unit=unit,
            kernel=self.kernel,
            provider=self.provider,
            mode=self.mode,
            gpu=self.gpu,
            architecture=self.architecture,
            dtype=workload.dtype,
            case_key=workload.case_key,
            median=held.get("median"),
            p20=held.get("p20"),
            p80=held.get("p80"),
            observed_at=observed_at,
            external_id=external_id,
            liger_version=version or None,
            origin=ORIGIN,
            extra=extra,
        )


@dataclass(frozen=True, slots=True)
class RunTemplate:
    """A series' run as templates (`Template`): its manifest, whose metadata hole takes one of
    its two metadata templates (without labels, with them); and the constant parts of its runs'
    externalIds and names. A run's digest hashes `identity_head` and then its manifest's bytes
    from `metadata_lead` plus its metadata's length on: the identity, not copied."""

    name_head: str  # the slug of the name's constant parts, joined (rules.joined_slugs)
    external_id_head: str
    external_id_tail: str
    manifest: Template
    metadata: tuple[Template, Template]  # without labels, with labels
    identity_head: bytes
    metadata_lead: int


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


# --- what stands in for a curation the file's names lack (gaps.py) ---------------------------
def _uncurated_operation(kernel: str) -> dict[str, Any]:
    """The OperationSpec of a kernel the curation lacks: its name as the file wrote it, and
    nothing the file does not say (its axes and tensors are unknown)."""
    metadata = {
        "name": f"liger-uncurated-{slug(kernel) or UNSPECIFIED}"[:NAME_LIMIT],
        "title": kernel[:NAME_LIMIT],
        "labels": gap_labels([Gap.KERNEL]),
    }
    spec = {
        "family": (slug(kernel) or UNSPECIFIED)[:SHORT_LIMIT],
        "axes": {},
        "inputs": [{"name": UNSPECIFIED}],
        "outputs": [{"name": UNSPECIFIED}],
        "semantics": {"mutation": "none", "determinism": "unspecified"},
    }
    return manifest("OperationSpec", metadata, spec)


def _kernel_slug(curation: Curation, kernel: str) -> str:
    curated = curation.kernels.get(kernel)
    return curated.slug if curated is not None else f"liger-uncurated-{slug(kernel)}"


def _uncurated_pass(mode: str) -> Pass:
    return Pass(
        title=mode[:SHORT_LIMIT],
        timed=f"the pass the file names {mode[:SHORT_LIMIT]!r} (uncurated)",
    )


# The implementation of a provider the curation lacks: nothing known but that it ran.
_UNCURATED_IMPLEMENTATION: dict[str, Any] = {
    "callable": {"language": UNSPECIFIED},
    "support": {"hardwareArchitectures": [], "dtypes": []},
    "licensing": {},
}


_SHARED_LIMIT = 4
_shared: dict[str, Normalizer] = {}


def shared_normalizer() -> Normalizer:
    """The normalizer of the curation as the files say now, one per curation this process has
    met: its caches (run templates, workloads, shared records) then serve every file the process
    reads, not just one. An edited curation gets a normalizer of its own."""
    curation = load()
    normalizer = _shared.get(curation.fingerprint)
    if normalizer is None:
        if len(_shared) >= _SHARED_LIMIT:
            _shared.pop(next(iter(_shared)))
        normalizer = _shared.setdefault(curation.fingerprint, Normalizer(curation))
    return normalizer


# --- templates ---------------------------------------------------------------------------------
def hole(name: str) -> str:
    """A placeholder string, to be cut out of a serialized document (`Template.of`)."""
    return f"@@kindex-hole:{name}@@"


@dataclass(frozen=True, slots=True)
class Template:
    """A document's canonical JSON (RFC 8785, records.canonical) cut at its holes: `pieces` of
    literal text around `holes`, the names of JSON texts to put in their place."""

    pieces: tuple[str, ...]
    holes: tuple[str, ...]

    @classmethod
    def of(cls, document: Any, names: Sequence[str]) -> Template:
        text = canonical_json(document).decode()
        at = sorted((text.index(json_string(hole(n))), n) for n in names if hole(n) in text)
        pieces, holes, start = [], [], 0
        for position, name in at:
            pieces.append(text[start:position])
            holes.append(name)
            start = position + len(json_string(hole(name)))
        pieces.append(text[start:])
        for piece in pieces:
            assert "@@kindex-hole:" not in piece, "a hole appears twice"
        return cls(tuple(pieces), tuple(holes))

    def fill(self, texts: dict[str, str]) -> str:
        """The document with each hole's JSON text in place (for one document: the oracle)."""
        return (
            "".join(p + texts[h] for p, h in zip(self.pieces, self.holes, strict=False))
            + (self.pieces[-1])
        )


def json_string(text: str) -> str:
    """A string as JSON text; RFC 8785 and orjson escape strings alike (tests/test_canonical.py)."""
    return orjson.dumps(text).decode()

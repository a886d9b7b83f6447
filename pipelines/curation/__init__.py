"""Curated knowledge (kernels, providers, GPUs, protocols) loaded from the YAML files beside this
module, or from the folder `KINDEX_CURATION_DIR` names. A maintainer edits those files; nothing
here names a kernel, provider or GPU.

The curation's fingerprint (a hash of the files) is part of the Liger parser version, so records
made under an older curation are rebuilt, not reused, when a backfill re-processes a file."""

from __future__ import annotations

import ast
import hashlib
import operator
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

Number = int | float

_BINARY_OPERATORS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
}


class ExpressionError(ValueError):
    """An expression names something the row does not have, or is not arithmetic."""


@dataclass(frozen=True, slots=True)
class Expression:
    """Integer arithmetic (+ - * //) over names and number literals, e.g. ``B * T``."""

    text: str
    tree: ast.expr
    names: frozenset[str]

    @classmethod
    def parse(cls, text: str | Number) -> Expression:
        tree = ast.parse(str(text), mode="eval").body
        names = frozenset(node.id for node in ast.walk(tree) if isinstance(node, ast.Name))
        expression = cls(str(text), tree, names)
        expression._check(tree)
        return expression

    def _check(self, node: ast.expr) -> None:
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPERATORS:
            self._check(node.left)
            self._check(node.right)
        elif not isinstance(node, ast.Name | ast.Constant):
            raise ExpressionError(f"unsupported expression {self.text!r}")

    def evaluate(self, values: Mapping[str, Any]) -> Any:
        return self._evaluate(self.tree, values)

    def _evaluate(self, node: ast.expr, values: Mapping[str, Any]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in values:
                raise ExpressionError(f"{node.id} is not bound")
            return values[node.id]
        assert isinstance(node, ast.BinOp)
        return _BINARY_OPERATORS[type(node.op)](
            self._evaluate(node.left, values), self._evaluate(node.right, values)
        )


@dataclass(frozen=True, slots=True)
class Binding:
    """How one `x_name` of a kernel binds workload axes from x and the config."""

    axes: dict[str, Expression]  # title order
    require: dict[str, Any]
    ignore: frozenset[str]
    # Config keys another era of the scripts names otherwise: {key as written: key as bound}.
    aliases: dict[str, str] = field(default_factory=dict)
    # Config keys an older era of the scripts left out, and the value they then always had.
    defaults: dict[str, Any] = field(default_factory=dict)
    # What the x value is: "size" (a number the expressions read as `x`), "model" (the name of
    # a curated model, `models` in kernels.yaml, whose sizes they read as `model_<field>`) or
    # "label" (a name that binds nothing: the config holds every size).
    x: str = "size"
    default_dtype: str | None = None  # the dtype when the config names none, over the kernel's

    @property
    def config_keys(self) -> frozenset[str]:
        used = set().union(*(e.names for e in self.axes.values())) - {"x"}
        used = {name for name in used if not (self.x == "model" and name.startswith(MODEL_PREFIX))}
        return frozenset(used | set(self.require) | self.ignore | set(self.defaults))

    @property
    def named_x(self) -> bool:
        """x is a name (a model or a label), not a size."""
        return self.x != "size"


MODEL_PREFIX = "model_"


@dataclass(frozen=True, slots=True)
class Kernel:
    name: str  # Liger's kernel_name
    operation: dict[str, Any]  # OperationSpec manifest
    bindings: dict[str, Binding]
    scalars: dict[str, Expression]
    default_dtype: str | None
    derived_axes: dict[str, Expression] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return str(self.operation["metadata"]["title"])

    @property
    def slug(self) -> str:
        return str(self.operation["metadata"]["name"])


@dataclass(frozen=True, slots=True)
class Provider:
    name: str
    project_slug: str
    project: dict[str, Any]  # SoftwareProject spec
    title: str
    description: str
    implementation: dict[str, Any]  # ImplementationRevision spec less `operation`
    baseline_rank: int | None  # among a cohort's baselines, lowest first; None: never one
    kernels: frozenset[str] | None

    @property
    def baseline(self) -> bool:
        return self.baseline_rank is not None

    def implements(self, kernel: str) -> bool:
        return self.kernels is None or kernel in self.kernels


@dataclass(frozen=True, slots=True)
class Gpu:
    name: str
    hardware: dict[str, str]
    title: str


@dataclass(frozen=True, slots=True)
class Pass:
    title: str
    timed: str


@dataclass(frozen=True, slots=True)
class Curation:
    kernels: dict[str, Kernel]
    providers: dict[str, Provider]
    gpus: dict[str, Gpu]
    harness: dict[str, str]
    metrics: dict[str, dict[str, str]]  # a metric (speed, memory, ...) -> timer, family, notes
    # speed|memory -> {a row's metric_unit: its factor to integer ns or bytes}
    units: dict[str, dict[str, float]]
    passes: dict[str, Pass]
    dtypes: dict[str, str]  # torch dtype name -> kernelindex dtype
    # Model profiles (benchmark_model_configs.py) an `x: model` binding's x value names:
    # {name: {field: size}}.
    models: dict[str, dict[str, int]]
    # Kernel names that stand for a curated kernel (`kernelNames` in kernels.yaml): {kernel as
    # written: (config key, {its value: curated kernel})}; the key is None for a plain rename.
    kernel_names: dict[str, tuple[str | None, dict[Any, str]]]
    fingerprint: str  # 12 hex digits of the sha256 over the curation files

    def baseline_ranks(self) -> dict[str, int]:
        """Baseline providers and their ranks: a cohort's baseline is its lowest-ranked one."""
        ranks: dict[str, int] = {}
        for name, provider in self.providers.items():
            if provider.baseline_rank is not None:
                ranks[name] = provider.baseline_rank
        return ranks


CURATION_FILES = ("kernels.yaml", "providers.yaml", "gpus.yaml", "protocols.yaml")
CURATION_DIR_VARIABLE = "KINDEX_CURATION_DIR"


def curation_dir() -> Traversable:
    override = os.environ.get(CURATION_DIR_VARIABLE)
    return Path(override) if override else resources.files("pipelines.curation")


def _read_files(folder: Traversable) -> tuple[tuple[str, str], ...]:
    return tuple(
        (name, folder.joinpath(name).read_text(encoding="utf-8")) for name in CURATION_FILES
    )


# Where a kernelNames entry's key is absent from a row's config, its `absent` value picks.
ABSENT = object()


def _kernel_name(entry: Any) -> tuple[str | None, dict[Any, str]]:
    if isinstance(entry, str):
        return None, {None: entry}
    kernels: dict[Any, str] = {value: str(kernel) for value, kernel in entry["kernels"].items()}
    if "absent" in entry:
        kernels[ABSENT] = kernels[entry["absent"]]
    return str(entry["by"]), kernels


def _load_yaml(files: dict[str, str], name: str, pure: bool = False) -> Any:
    # libyaml's parser (ruamel.yaml.clib) reads the files several times faster than the pure
    # one, which every command and run would wait for; ruamel's own resolver still types the scalars
    # (YAML 1.2). tests/test_curation.py holds the two to the same documents.
    return YAML(typ="safe", pure=pure).load(files[name])


def _kernel(name: str, entry: Mapping[str, Any]) -> Kernel:
    operation = {
        "apiVersion": "kernelindex.dev/v1alpha1",
        "kind": "OperationSpec",
        "metadata": entry["operation"]["metadata"],
        "spec": entry["operation"]["spec"],
    }
    bindings = {
        str(x_name): Binding(
            axes={axis: Expression.parse(expr) for axis, expr in binding["axes"].items()},
            require=dict(binding.get("require") or {}),
            ignore=frozenset(binding.get("ignore") or ()),
            aliases=dict(binding.get("aliases") or {}),
            defaults=dict(binding.get("defaults") or {}),
            x=_x_kind(name, str(x_name), binding.get("x", "size")),
            default_dtype=binding.get("defaultDtype"),
        )
        for x_name, binding in entry["bindings"].items()
    }
    derived = {
        axis: Expression.parse(spec["expression"])
        for axis, spec in operation["spec"]["axes"].items()
        if spec.get("role") == "derived"
    }
    return Kernel(
        name=name,
        operation=operation,
        bindings=bindings,
        scalars={k: Expression.parse(v) for k, v in (entry.get("scalars") or {}).items()},
        default_dtype=entry.get("defaultDtype"),
        derived_axes=derived,
    )


X_KINDS = ("size", "model", "label")


def _x_kind(kernel: str, x_name: str, kind: object) -> str:
    if kind not in X_KINDS:
        raise ValueError(f"kernels.yaml: {kernel}/{x_name}: x must be one of {X_KINDS}")
    return str(kind)


def _providers(document: Mapping[str, Any]) -> dict[str, Provider]:
    projects, implementations = document["projects"], document["implementations"]
    providers = {
        name: Provider(
            name=name,
            project_slug=entry["project"],
            project=projects[entry["project"]],
            title=entry["title"],
            description=entry["description"],
            implementation=implementations[entry["implementation"]],
            baseline_rank=_baseline_rank(name, entry.get("baseline")),
            kernels=frozenset(entry["kernels"]) if "kernels" in entry else None,
        )
        for name, entry in document["providers"].items()
    }
    return {**_tagged(providers, document.get("providerTags") or {}, implementations), **providers}


TAGGED_PREFIX = "liger"  # the part of a provider's name a LIGER_BENCH_PROVIDER_TAG replaces


def _tagged(
    providers: Mapping[str, Provider],
    tags: Mapping[str, Mapping[str, str]],
    implementations: Mapping[str, Any],
) -> dict[str, Provider]:
    """The twins the provider tags make of every Liger provider (see providers.yaml)."""
    twins = {}
    for tag, entry in tags.items():
        for name, base in providers.items():
            if not name.startswith(TAGGED_PREFIX):
                continue
            twin = tag + name[len(TAGGED_PREFIX) :]
            twins[twin] = Provider(
                name=twin,
                project_slug=base.project_slug,
                project=base.project,
                title=f"{base.title} ({entry['title']})",
                description=f"{base.description} {entry['description']}",
                implementation=implementations[entry["implementation"]],
                baseline_rank=None,
                kernels=base.kernels,
            )
    return twins


def _baseline_rank(provider: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"providers.yaml: {provider}: baseline must be a rank 1, 2, ...")
    return value


def _gpus(document: Mapping[str, Any]) -> dict[str, Gpu]:
    gpus = {}
    for name, entry in document["gpus"].items():
        hardware = {
            k: str(entry[k])
            for k in ("vendor", "product", "architecture", "formFactor")
            if k in entry
        }
        gpus[name] = Gpu(name=name, hardware=hardware, title=str(entry["title"]))
    return gpus


_PARSING = threading.Lock()


def load() -> Curation:
    """The curation as the files say now; parsed once per distinct content, also when many
    threads start at once (a run's files are processed on several)."""
    contents = _read_files(curation_dir())
    with _PARSING:
        return _parse(contents)


@cache
def _parse(contents: tuple[tuple[str, str], ...]) -> Curation:
    files = dict(contents)
    digest = hashlib.sha256()
    for name, text in contents:
        digest.update(name.encode() + b"\0" + text.encode() + b"\0")
    kernels_doc = _load_yaml(files, "kernels.yaml")
    protocols = _load_yaml(files, "protocols.yaml")
    return Curation(
        kernels={name: _kernel(name, entry) for name, entry in kernels_doc["kernels"].items()},
        providers=_providers(_load_yaml(files, "providers.yaml")),
        gpus=_gpus(_load_yaml(files, "gpus.yaml")),
        harness=dict(protocols["harness"]),
        metrics={str(metric): dict(protocols[metric]) for metric in protocols["units"]},
        units={
            str(metric): {str(unit): float(scale) for unit, scale in units.items()}
            for metric, units in protocols["units"].items()
        },
        passes={name: Pass(**entry) for name, entry in protocols["passes"].items()},
        dtypes=dict(kernels_doc.get("dtypes") or {}),
        kernel_names={
            str(name): _kernel_name(entry)
            for name, entry in (kernels_doc.get("kernelNames") or {}).items()
        },
        models={
            str(name): {str(k): int(v) for k, v in sizes.items()}
            for name, sizes in (kernels_doc.get("models") or {}).items()
        },
        fingerprint=digest.hexdigest()[:12],
    )

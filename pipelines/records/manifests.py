"""The seven kernelindex.dev/v1alpha1 kinds kindex emits, and strict validation against their
schemas.

The JSON Schemas (copied from KernelIndex, Apache-2.0) are the source of truth: unknown fields are
errors. Validators are compiled once per process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from typing import Any, TypeAlias

import jsonschema_rs
from jsonschema import Draft202012Validator

from pipelines import API_VERSION

# A JSON value as a parser reads it, and a manifest read back from a JSON text (the index's
# `manifest` column): what the schemas validate, before anything picks fields out of it.
Json: TypeAlias = "str | int | float | bool | None | list[Json] | dict[str, Json]"
ManifestJson: TypeAlias = "dict[str, Json]"

SCHEMA_FILES: dict[str, str] = {
    "OperationSpec": "operation-spec.v1alpha1.schema.json",
    "WorkloadCase": "workload-case.v1alpha1.schema.json",
    "SoftwareProject": "software-project.v1alpha1.schema.json",
    "ImplementationRevision": "implementation-revision.v1alpha1.schema.json",
    "BenchmarkProtocol": "benchmark-protocol.v1alpha1.schema.json",
    "ExecutionEnvironment": "execution-environment.v1alpha1.schema.json",
    "BenchmarkRun": "benchmark-run.v1alpha1.schema.json",
    "WorkloadSuite": "workload-suite.v1alpha1.schema.json",
}
KINDS = tuple(k for k in SCHEMA_FILES if k != "WorkloadSuite")


class UnknownKind(ValueError):
    pass


@cache
def validator(kind: str) -> Draft202012Validator:
    try:
        name = SCHEMA_FILES[kind]
    except KeyError:
        raise UnknownKind(
            f"unknown kind {kind!r}; expected one of {', '.join(SCHEMA_FILES)}"
        ) from None
    text = resources.files("pipelines.records.schemas").joinpath(name).read_text(encoding="utf-8")
    schema = json.loads(text)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def schema_errors(manifest: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """Yield (JSON pointer, message) for every schema violation of a manifest."""
    kind = manifest.get("kind")
    if manifest.get("apiVersion") != API_VERSION:
        yield "/apiVersion", f"apiVersion must be {API_VERSION!r}"
    if not isinstance(kind, str):
        yield "/kind", "kind is missing"
        return
    for error in validator(kind).iter_errors(dict(manifest)):
        pointer = "".join(
            f"/{str(p).replace('~', '~0').replace('/', '~1')}" for p in error.absolute_path
        )
        yield pointer or "/", error.message


def is_valid(manifest: Mapping[str, Any]) -> bool:
    return next(schema_errors(manifest), None) is None


@cache
def fast_validator(kind: str) -> Any:
    """A compiled validator of a kind's schema (jsonschema-rs: the same JSON Schema 2020-12
    verdicts as `jsonschema`, many times faster); None for a kind kindex does not know."""

    if kind not in SCHEMA_FILES:
        return None
    schemas = resources.files("pipelines.records.schemas")
    text = schemas.joinpath(SCHEMA_FILES[kind]).read_text("utf-8")
    return jsonschema_rs.validator_for(json.loads(text))


def first_schema_error(manifest: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first (JSON pointer, message) of a manifest's schema violations, or None: the compiled
    validator decides, and only a manifest it refuses is walked again for the message."""
    kind = manifest.get("kind")
    fast = fast_validator(kind) if isinstance(kind, str) else None
    if fast is not None and manifest.get("apiVersion") == API_VERSION and fast.is_valid(manifest):
        return None
    return next(schema_errors(manifest), None)

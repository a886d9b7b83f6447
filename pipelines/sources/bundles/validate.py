"""Strict validation of one authored manifest: canonical values, the v1alpha1 schema, its digest."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from jsonschema.exceptions import ValidationError

from pipelines import API_VERSION
from pipelines.records.canonical import manifest_digest
from pipelines.records.manifests import SCHEMA_FILES, validator
from pipelines.records.rules import Reason
from pipelines.sources.bundles.canonicalize import Problem, canonicalize
from pipelines.sources.bundles.reader import escape_pointer_token

DIGEST_PATTERN = "^sha256:[0-9a-f]{64}$"

# When a manifest has several problems, its reason is the most specific one.
REASON_PRIORITY = (
    Reason.DUPLICATE_KEY,
    Reason.CUSTOM_TAG,
    Reason.NON_STRING_KEY,
    Reason.UNKNOWN_KIND,
    Reason.WRONG_SECTION,
    Reason.AMBIGUOUS_DURATION,
    Reason.BAD_TIMESTAMP,
    Reason.UNKNOWN_FIELD,
    Reason.BAD_DIGEST,
    Reason.SCHEMA_VIOLATION,
    Reason.NON_CANONICAL_NUMBER,
)
MAX_DETAIL_PROBLEMS = 10


@dataclass(slots=True)
class CheckedManifest:
    """A manifest after canonicalization and validation. `digest` is set whenever the spec can be
    hashed, even for an invalid manifest, so dependents can be told what is wrong with it."""

    kind: str | None
    manifest: Any
    digest: str | None
    problems: list[Problem] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def reason(self) -> str | None:
        return main_problem(self.problems).reason if self.problems else None

    @property
    def pointer(self) -> str:
        return main_problem(self.problems).pointer if self.problems else ""

    @property
    def detail(self) -> str | None:
        return describe(self.problems) if self.problems else None


def main_problem(problems: list[Problem]) -> Problem:
    def rank(problem: Problem) -> int:
        try:
            return REASON_PRIORITY.index(problem.reason)
        except ValueError:
            return len(REASON_PRIORITY)

    return min(problems, key=rank)


def describe(problems: list[Problem]) -> str:
    shown = [f"{p.pointer or '/'}: {p.detail}" for p in problems[:MAX_DETAIL_PROBLEMS]]
    if len(problems) > MAX_DETAIL_PROBLEMS:
        shown.append(f"... and {len(problems) - MAX_DETAIL_PROBLEMS} more")
    return "; ".join(shown)


def check_manifest(value: Any, expected_kind: str | None = None) -> CheckedManifest:
    """Canonicalize, validate and hash one manifest as authored."""
    if not isinstance(value, dict):
        problem = Problem("", Reason.SCHEMA_VIOLATION, "a manifest must be a mapping")
        return CheckedManifest(None, value, None, [problem])
    kind = value.get("kind")
    if not isinstance(kind, str) or kind not in SCHEMA_FILES:
        detail = f"kind {kind!r} is not one of {', '.join(SCHEMA_FILES)}"
        return CheckedManifest(None, value, None, [Problem("/kind", Reason.UNKNOWN_KIND, detail)])
    manifest, problems = canonicalize(value)
    if expected_kind is not None and kind != expected_kind:
        detail = f"expected a {expected_kind} here, found a {kind}"
        problems.append(Problem("/kind", Reason.WRONG_SECTION, detail))
    problems.extend(schema_problems(manifest))
    digest = None
    if isinstance(manifest.get("spec"), dict):
        try:
            digest = manifest_digest(manifest)
        except Exception as error:  # rfc8785 refuses numbers outside the I-JSON domain
            problems.append(Problem("/spec", Reason.NON_CANONICAL_NUMBER, str(error)))
    return CheckedManifest(kind, manifest, digest, problems)


def schema_problems(manifest: Mapping[str, Any]) -> Iterator[Problem]:
    if manifest.get("apiVersion") != API_VERSION:
        yield Problem("/apiVersion", Reason.SCHEMA_VIOLATION, f"apiVersion must be {API_VERSION!r}")
    for error in validator(str(manifest["kind"])).iter_errors(dict(manifest)):
        yield from classify(error)


def _pointer(path: Any) -> str:
    return "".join("/" + escape_pointer_token(p) for p in path)


def classify(error: ValidationError) -> Iterator[Problem]:
    """unknown_field for fields the schema does not define, bad_digest for malformed digests,
    schema_violation for everything else."""
    base = _pointer(error.absolute_path)
    if error.validator in ("additionalProperties", "unevaluatedProperties") and isinstance(
        error.instance, dict
    ):
        known = set(error.schema.get("properties", {})) if isinstance(error.schema, dict) else set()
        extra = [key for key in error.instance if key not in known] or ["?"]
        for key in extra:
            pointer = f"{base}/{escape_pointer_token(key)}"
            yield Problem(pointer, Reason.UNKNOWN_FIELD, f"unknown field {key!r}")
        return
    if (
        error.validator == "pattern"
        and isinstance(error.schema, dict)
        and error.schema.get("pattern") == DIGEST_PATTERN
    ):
        yield Problem(base, Reason.BAD_DIGEST, f"{error.instance!r} is not sha256:<64 hex>")
        return
    yield Problem(base, Reason.SCHEMA_VIOLATION, error.message)

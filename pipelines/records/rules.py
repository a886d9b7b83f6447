"""The rules every source's records obey, each stated once: safe integers, the duration units,
JavaScript's rounding, names and slugs with their limits, and the quarantine reason codes.

Where a rule has a column-wise form (the Liger source's fast path, pipelines/sources/liger/
columnar.py, applies it to whole columns), that form sits beside the scalar one, so the two
cannot drift apart.
"""

from __future__ import annotations

import math
import re
from enum import StrEnum
from functools import cache, lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# --- numbers ---------------------------------------------------------------------------------
# The largest integer a JSON number (a double) holds exactly: RFC 8785 has no exact form past it.
MAX_SAFE_INTEGER = 2**53 - 1


def is_safe_integer(value: object) -> bool:
    """An int (not a bool) that JSON holds exactly."""
    return type(value) is int and abs(value) <= MAX_SAFE_INTEGER


# A duration unit as harnesses and bundles write it, in nanoseconds.
DURATION_NS: dict[str, float] = {"ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}


def half_up(value: float) -> int:
    """JavaScript's Math.round (DESIGN.md §1): the nearest integer, halves toward +infinity.
    Measured from the floor, so that adding 0.5 cannot round a large value up twice. Raises
    ValueError or OverflowError for a value that is no finite number."""
    floor = math.floor(value)
    return floor + 1 if value - floor >= 0.5 else floor


def half_up_columns(values: np.ndarray) -> np.ndarray:
    """`half_up` element-wise, still as floats (NaN stays NaN: an absent value)."""
    floor = np.floor(values)
    with np.errstate(invalid="ignore"):  # inf - inf: past 2**53, refused by the caller
        rounded: np.ndarray = floor + (values - floor >= 0.5)
    return rounded


def safe_columns(stored: np.ndarray) -> np.ndarray:
    """Which rows (the last axis) JSON holds exactly, `stored` being whole numbers; an absent
    value (NaN) is no number to hold."""
    return np.asarray(np.asarray((stored <= MAX_SAFE_INTEGER) | np.isnan(stored)).all(axis=-1))


# --- names -----------------------------------------------------------------------------------
UNSPECIFIED = "unspecified"  # what a field the schema requires says when the source does not
NAME_LIMIT = 200  # metadata names, titles and label values
SHORT_LIMIT = 100  # the reference importer's cut of a run's name; versions and families

_SLUG_BREAK = re.compile(r"[^a-z0-9]+")
_NAME_BREAK = re.compile(r"[^a-z0-9._-]+")
_KEY_BREAK = re.compile(r"[^a-z0-9_]+")


@lru_cache(maxsize=4096)
def slug(text: str) -> str:
    """Lowercase, every run of other characters one hyphen, none at the ends (may be empty)."""
    return _SLUG_BREAK.sub("-", text.lower()).strip("-")


def joined_slugs(slugs: list[pa.Array]) -> pa.Array:
    """`slug("-".join(parts))` row by row, from the slugs of its parts: a slug has no hyphen at
    either end, so the slugs joined by hyphens are the slug of the parts joined, but where a
    part slugs to nothing and leaves two hyphens to merge, or one at an end to strip."""
    joined = pc.binary_join_element_wise(*slugs, "-")
    if all(pc.min(pc.binary_length(part)).as_py() for part in slugs):
        return joined
    return pc.utf8_trim(pc.replace_substring_regex(joined, "-{2,}", "-"), "-")


def name_of(*parts: str, empty: str = UNSPECIFIED, limit: int = NAME_LIMIT) -> str:
    """A metadata name (`[a-z0-9._-]`, no separator at either end) of the parts joined by `-`,
    at most `limit` characters; `empty` when nothing is left."""
    text = "-".join(p for p in parts if p)
    name = _NAME_BREAK.sub("-", text.lower()).strip("-._")
    return (name or empty)[:limit].rstrip("-._")


@cache  # few distinct texts: the names of axes, tensors, labels and statistics
def key_of(text: str) -> str:
    """An identifier the schema allows as a key, an axis or an enum-like value
    (`^[a-z][a-z0-9_]*$`): `D` is `d`, `2x` is `x_2x`."""
    key = _KEY_BREAK.sub("_", text.lower()).strip("_")
    if not key or not key[0].isalpha():
        key = f"x_{key}" if key else UNSPECIFIED
    return key


def family_of(text: str) -> str:
    """An operation family (`^[a-z0-9][a-z0-9-]*$`)."""
    return slug(text) or UNSPECIFIED


# --- quarantine reasons ----------------------------------------------------------------------
class Reason(StrEnum):
    """Every reason a source quarantines a row, a record or a manifest for: the index's
    `quarantine.reason` (README lists the Liger source's for users)."""

    # The bytes cannot be read at all (any source).
    UNRECOGNIZED_FORMAT = "unrecognized_format"  # no source recognizes them
    TOO_LARGE = "too_large"
    TOO_DEEP = "too_deep"
    TOO_MANY_ALIASES = "too_many_aliases"
    ENCODING = "encoding"  # not UTF-8 (JSON and bundles)
    JSON_SYNTAX = "json_syntax"
    YAML_SYNTAX = "yaml_syntax"
    EMPTY = "empty"
    NOT_A_BUNDLE = "not_a_bundle"

    # One place of a readable document is wrong.
    DUPLICATE_KEY = "duplicate_key"
    CUSTOM_TAG = "custom_tag"
    NON_STRING_KEY = "non_string_key"
    NON_FINITE_NUMBER = "non_finite_number"  # NaN or Infinity where a number was read

    # A Liger CSV row.
    WRONG_COLUMN_COUNT = "wrong_column_count"  # not as many fields as the header
    BAD_ENCODING = "bad_encoding"  # not UTF-8 (pipelines/sources/liger/read.py)
    UNPARSEABLE_ROW = "unparseable_row"  # CSV that does not parse (read.py)
    FIELD_TOO_LARGE = "field_too_large"  # a field over the Liger source's FIELD_LIMIT
    # A unit no metric of protocols.yaml `units` converts, or one another metric's: a number
    # kindex cannot store. (A name the curation lacks is no reason: pipelines/curation/gaps.py.)
    UNKNOWN_METRIC = "unknown_metric"
    BAD_CONFIG_JSON = "bad_config_json"  # extra_benchmark_config_str is not a JSON object
    BAD_NUMBER = "bad_number"  # not a number, or out of range
    NON_POSITIVE_VALUE = "non_positive_value"  # zero or negative

    # A record of a harness's file.
    MALFORMED_RECORD = "malformed_record"  # not the shape the format writes
    MISSING_FIELD = "missing_field"
    BAD_VALUE = "bad_value"  # a value out of its range or of the wrong type
    UNKNOWN_UNIT = "unknown_unit"  # a duration or aggregate unit not known here
    UNKNOWN_METRIC_UNIT = "unknown_metric_unit"  # a metric whose unit is not known here
    AMBIGUOUS_VALUES = "ambiguous_values"  # several values for one statistic
    AGGREGATE_METRIC = "aggregate_metric"  # restates the file's runs (an average, a status)
    DUPLICATE_AGGREGATE = "duplicate_aggregate"
    MEASUREMENT_FAILED = "measurement_failed"  # the harness wrote that it failed to measure
    SKIPPED_STATE = "skipped_state"
    NO_STATES = "no_states"
    INVALID_DEFINITION = "invalid_definition"
    AWAITING_DEFINITION = "awaiting_definition"  # a trace whose definition has not arrived
    INVALID_RECORD = "invalid_record"  # the manifest built from it fails the schema

    # A manifest of a bundle.
    UNKNOWN_FIELD = "unknown_field"
    SCHEMA_VIOLATION = "schema_violation"
    UNKNOWN_KIND = "unknown_kind"
    BAD_DIGEST = "bad_digest"
    AMBIGUOUS_DURATION = "ambiguous_duration"
    NON_CANONICAL_NUMBER = "non_canonical_number"
    WRONG_SECTION = "wrong_section"
    DUPLICATE = "duplicate"  # the same run (one digest) twice in a bundle
    # A run (or a workload/implementation) depends on something it cannot have.
    DANGLING_DIGEST = "dangling_digest"
    INVALID_DEPENDENCY = "invalid_dependency"

    # Any source.
    BAD_TIMESTAMP = "bad_timestamp"  # not the format's timestamp, or no such time
    DUPLICATE_EXTERNAL_ID = "duplicate_external_id"  # an earlier run of the file had its id

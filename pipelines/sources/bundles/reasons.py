"""Reason codes for refused bundles and quarantined manifests (the index's `quarantine.reason`)."""

# The text cannot be read at all.
TOO_LARGE = "too_large"
TOO_DEEP = "too_deep"
TOO_MANY_ALIASES = "too_many_aliases"
YAML_SYNTAX = "yaml_syntax"
JSON_SYNTAX = "json_syntax"
ENCODING = "encoding"
EMPTY = "empty"
NOT_A_BUNDLE = "not_a_bundle"

# One place of a readable document is wrong.
DUPLICATE_KEY = "duplicate_key"
CUSTOM_TAG = "custom_tag"
NON_STRING_KEY = "non_string_key"

# One manifest is wrong.
UNKNOWN_FIELD = "unknown_field"
SCHEMA_VIOLATION = "schema_violation"
UNKNOWN_KIND = "unknown_kind"
BAD_DIGEST = "bad_digest"
AMBIGUOUS_DURATION = "ambiguous_duration"
BAD_TIMESTAMP = "bad_timestamp"
NON_CANONICAL_NUMBER = "non_canonical_number"
WRONG_SECTION = "wrong_section"

# A run (or a workload/implementation) depends on something it cannot have.
DANGLING_DIGEST = "dangling_digest"
INVALID_DEPENDENCY = "invalid_dependency"

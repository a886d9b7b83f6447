"""The fast canonical path is byte-identical to the RFC 8785 reference implementation."""

from __future__ import annotations

import json

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st
from liger_support import RECORD_ORDER, vectors

from pipelines.records.canonical import (
    canonical_json,
    canonical_json_reference,
    identity_json,
    manifest_digest,
    number_text,
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_documents = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5)
    ),
    max_leaves=30,
)
latency_like = st.floats(min_value=1e-7, max_value=1e17, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(json_documents)
def test_fast_path_equals_reference_on_generated_documents(document: object) -> None:
    assert canonical_json(document) == canonical_json_reference(document)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["ms_20", "ms_50", "ms_80", "é", "\U0001f600", "\ue000"]), latency_like
    )
)
def test_fast_path_equals_reference_near_the_float_boundaries(document: dict[str, float]) -> None:
    assert canonical_json(document) == canonical_json_reference(document)


@settings(max_examples=1000, deadline=None)
@given(
    st.floats(allow_nan=False, allow_infinity=False)
    | latency_like
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
)
def test_number_text_equals_reference(number: float | int) -> None:
    """The numbers the run templates splice into canonical JSON print as RFC 8785 prints them."""
    assert number_text(number) == rfc8785.dumps(number).decode()


def test_number_text_at_the_edges_of_its_fast_forms() -> None:
    for number in (1e-4, 9.999e-5, 1e16, 9999999999999998.0, 2.0**53, -(2.0**53), 5.0, -0.0):
        assert number_text(number) == rfc8785.dumps(number).decode(), number


def test_ecmascript_number_forms() -> None:
    assert canonical_json({"b": 1e-06, "a": 4096.0}) == b'{"a":4096,"b":0.000001}'
    assert canonical_json(1e21) == b"1e+21"


def test_seed_environment_digest() -> None:
    environment = {
        "apiVersion": "kernelindex.dev/v1alpha1",
        "kind": "ExecutionEnvironment",
        "metadata": {"name": "ignored-by-identity"},
        "spec": {
            "hardware": {"vendor": "nvidia", "product": "NVIDIA B200", "architecture": "sm_100"},
            "software": {},
        },
    }
    assert manifest_digest(environment) == (
        "sha256:ad459e643ef802f7008f1fa8915785c905d05abbfdb5eb0328be214f8d9f3a8b"
    )


def test_every_vector_canonical_form_matches_reference_and_fast_path() -> None:
    checked = 0
    for vector in vectors():
        if vector["outcome"] != "run":
            continue
        for kind in RECORD_ORDER:
            expected = vector[kind]["canonical"].encode()
            manifest = vector[kind]["manifest"]
            assert identity_json(manifest) == expected
            assert rfc8785.dumps(json.loads(expected)) == expected
            checked += 1
    assert checked == 7 * sum(1 for v in vectors() if v["outcome"] == "run")

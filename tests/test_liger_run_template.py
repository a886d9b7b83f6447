"""Liger runs are written by filling a per-series template (pipelines/sources/liger/normalize.py);
they
must equal, digest and manifest, the runs built as dicts and canonicalized by the reference
RFC 8785 serializer: on every row of the shared CSV and on generated rows."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from liger_oracle import ReferenceNormalizer
from liger_support import LIGER_CSV

from pipelines.records import Record
from pipelines.sources.liger.normalize import Normalizer, RowRejected, split_identity

TEMPLATED = Normalizer()
REFERENCE = ReferenceNormalizer()


def assert_same_run(templated: Record, reference: Record) -> None:
    assert templated.digest == reference.digest
    assert orjson.loads(templated.manifest_json) == reference.manifest
    assert orjson.loads(orjson.dumps(templated.json_fragment)) == reference.as_json()
    assert templated == reference


def shared_rows() -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(LIGER_CSV.read_text(encoding="utf-8"))))


def test_every_shared_row_equals_the_reference() -> None:
    rows = shared_rows()
    for row in rows:
        (templated, *_), _ = TEMPLATED.normalize(row)
        (reference, *_), _ = REFERENCE.normalize(row)
        assert_same_run(templated, reference)
    assert len(rows) == 2448


# Generated rows: one latency and one memory row of the shared file, with other statistics,
# timestamps and version labels (quotes, backslashes, control characters, non-ASCII).
BASE_ROWS = [r for r in shared_rows() if r["liger_version"]]
LATENCY = next(r for r in BASE_ROWS if r["metric_name"] == "speed")
MEMORY = next(r for r in BASE_ROWS if r["metric_name"] == "memory")
statistics = st.floats(min_value=1e-9, max_value=1e9, allow_nan=False, allow_infinity=False)
number_texts = statistics.flatmap(
    lambda v: st.sampled_from([repr(v), f"{v:.3e}", f"{v:f}", f"{v:.17g}", f"{v:.0f}"])
)
timestamps = st.integers(min_value=0, max_value=80 * 365 * 86400).map(
    lambda s: (datetime(1990, 1, 1) + timedelta(seconds=s)).strftime("%Y-%m-%d %H:%M:%S")
)


@settings(max_examples=400, deadline=None)
@given(
    base=st.sampled_from([LATENCY, MEMORY]),
    medians=st.tuples(number_texts, number_texts, number_texts),
    timestamp=timestamps,
    version=st.text(max_size=12),
)
def test_generated_rows_equal_the_reference(
    base: dict[str, str], medians: tuple[str, str, str], timestamp: str, version: str
) -> None:
    row = dict(base, timestamp=timestamp, liger_version=version)
    row["y_value_50"], row["y_value_20"], row["y_value_80"] = medians
    try:
        (templated, *_), _ = TEMPLATED.normalize(row)
    except RowRejected as rejected:  # e.g. "0.000" is not positive: both paths reject alike
        try:
            REFERENCE.normalize(row)
        except RowRejected as again:
            assert again.reason == rejected.reason
            return
        raise
    (reference, *_), _ = REFERENCE.normalize(row)
    assert_same_run(templated, reference)


def test_a_run_identity_is_its_manifest_without_the_metadata() -> None:
    """The batched path hashes a run's identity from its manifest's bytes after the metadata
    (normalize.split_identity); it refuses templates where that would not be the identity."""
    series = TEMPLATED.series("geglu", "liger", "full", "NVIDIA H100 80GB HBM3", "speed", "ms")
    template = series.run_template
    spec = template.spec % {
        "v0": "1", "v1": "2", "v2": "3", "s0": "0.1", "s1": "0.2", "s2": "0.3",
        "observed_at": '"2024-01-01T00:00:00Z"', "external_id": '"x%y"', "workload": '"w"',
    }  # fmt: skip
    metadata = '{"name":"n%%"}'
    identity = (template.identity % {"spec": spec}).encode()
    manifest = (template.manifest % {"metadata": metadata, "spec": spec}).encode()
    assert identity == template.identity_head + manifest[template.metadata_lead + len(metadata) :]
    head, lead = split_identity(template.identity, template.manifest)
    assert (head, lead) == (template.identity_head, template.metadata_lead)
    for identity_template, manifest_template in [
        ('{"a":1,"spec":%(spec)s}', '{"a":2,"metadata":%(metadata)s,"spec":%(spec)s}'),
        ('{"a":1,"spec":%(spec)s}', '{"a":1,"spec":%(spec)s}'),
        ('{"spec":%(spec)s}', '{"metadata":%(metadata)s,"spec":%(spec)s,"z":1}'),
        ('{"a":%(v0)s,"spec":%(spec)s}', '{"a":%(v0)s,"metadata":%(metadata)s,"spec":%(spec)s}'),
    ]:
        with pytest.raises(AssertionError):
            split_identity(identity_template, manifest_template)

"""Liger runs are written by filling a per-series template (pipelines/sources/liger/model.py); they
must equal, digest and manifest, the runs built as dicts and canonicalized by the reference
RFC 8785 serializer (tests/liger_oracle.py): on generated rows here, on every row of the shared
CSV in tests/sources/liger/test_liger_columnar.py."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from liger_oracle import row_outcomes
from liger_support import LIGER_CSV

from pipelines.records import Record
from pipelines.sources.liger.model import Normalizer
from pipelines.sources.liger.normalize import normalize_bytes

NORMALIZER = Normalizer()


def assert_same_run(templated: Record, reference: Record) -> None:
    assert templated.digest == reference.digest
    assert templated.manifest_json == reference.manifest_json
    assert templated.json_bytes == reference.json_bytes
    assert templated == reference


def shared_rows() -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(LIGER_CSV.read_text(encoding="utf-8"))))


def one_row_file(row: dict[str, str]) -> bytes:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(row))
    writer.writeheader()
    writer.writerow(row)
    return out.getvalue().encode()


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
    version=st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12),
)
def test_generated_rows_equal_the_reference(
    base: dict[str, str], medians: tuple[str, str, str], timestamp: str, version: str
) -> None:
    row = dict(base, timestamp=timestamp, liger_version=version)
    row["y_value_50"], row["y_value_20"], row["y_value_80"] = medians
    data = one_row_file(row)
    (templated,) = normalize_bytes(data, NORMALIZER)
    (reference,) = row_outcomes(data, NORMALIZER)
    # e.g. "0.000" is not positive: both paths reject alike
    assert (templated.status, templated.reason) == (reference.status, reference.reason)
    if templated.run is not None and reference.run is not None:
        assert_same_run(templated.run, reference.run)


def test_a_run_identity_is_its_manifest_without_the_metadata() -> None:
    """The batched path hashes a run's identity from its manifest's bytes after the metadata
    (model.RunTemplate): the identity's bytes are the template's identity_head and then those."""
    series = NORMALIZER.series("geglu", "liger", "full", "NVIDIA H100 80GB HBM3", "speed", "ms")
    template = series.run_template
    texts = {
        "v0": "1", "v1": "2", "v2": "3", "s0": "0.1", "s1": "0.2", "s2": "0.3",
        "observed_at": '"2024-01-01T00:00:00Z"', "external_id": '"x%y"', "workload": '"w"',
        "metadata": '{"name":"n%%"}',
    }  # fmt: skip
    manifest = template.manifest.fill(texts).encode()
    identity = orjson.dumps(
        {k: v for k, v in orjson.loads(manifest).items() if k != "metadata"},
        option=orjson.OPT_SORT_KEYS,
    )
    skip = template.metadata_lead + len(texts["metadata"])
    assert identity == template.identity_head + manifest[skip:]

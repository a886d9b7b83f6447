"""Worker bundles through snapshots, record objects and the published index (real SeaweedFS)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from bundle_support import (
    FIXTURE,
    MISSING_DIGEST,
    billion_laughs,
    fixture,
    json_bytes,
    over_size,
    ten_run_bundle,
    ten_thousand_deep,
    yaml_bytes,
)
from index_support import fingerprints, index_settings, query

from pipelines.index.local import open_index
from pipelines.ingest import IngestSummary, ingest_paths
from pipelines.records.rules import Reason
from pipelines.worker import BundleWriter, manifest

__all__ = ["index_settings"]


def ingest(settings: Any, store: Any, files: dict[str, bytes]) -> IngestSummary:
    """Write each (name, bytes) under the test's home and ingest them, in order, in one call."""
    folder = Path(settings.home) / "drop"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in files.items():
        path = folder / name
        path.write_bytes(data)
        paths.append(path)
    return ingest_paths(paths, settings, progress=False, store=store)


def rows(settings: Any, sql: str) -> list[dict[str, Any]]:
    con = open_index(settings)
    try:
        cursor = con.execute(sql)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    finally:
        con.close()


def test_fixture_bundle_lands_in_runs_with_the_digests_it_names(
    s3_store: Any, index_settings: Any
) -> None:
    summary = ingest(index_settings, s3_store, {"example-fixture.yaml": FIXTURE.read_bytes()})
    assert summary.files[0].source == "worker-bundle"
    assert (summary.files[0].runs, summary.files[0].quarantined) == (1, 0)
    bundle = fixture()
    named = bundle["runs"][0]["run"]["spec"]
    [run] = rows(index_settings, "SELECT * FROM runs")
    assert {k: run[k] for k in ("implementation_digest", "workload_digest")} == {
        "implementation_digest": named["implementationDigest"],
        "workload_digest": named["workloadDigest"],
    }
    assert (run["protocol_digest"], run["environment_digest"]) == (
        named["protocolDigest"],
        named["environmentDigest"],
    )
    operation = bundle["workloads"][0]["spec"]["operationSpecDigest"]
    assert run["operation_digest"] == operation
    assert run["source_key"] == "incoming/example-fixture.yaml"
    assert run["bundle_pointer"] == "/runs/0/run"
    # What a worker measured, apart from what a CSV reported.
    assert (run["origin"], run["metric"], run["unit"], run["status"]) == (
        "measured",
        "latency",
        "ns",
        "passed",
    )
    assert (run["kernel"], run["provider"], run["gpu"], run["case_key"]) == (
        "rmsnorm",
        "meridian-kernels",
        "NVIDIA B200 SXM",
        "tokens2048-hidden4096-bf16",
    )
    statistics = ("median", "samples", "p05", "p95", "minimum", "maximum", "mad")
    assert [run[c] for c in statistics] == [8120, 200, 8072, 8151, 8054, 8390, 24]
    assert (run["ci95_low"], run["ci95_high"]) == (8095, 8151)
    assert (run["driver"], run["cuda_toolkit"], run["framework"], run["framework_version"]) == (
        "580.00",
        "13.1",
        "pytorch",
        "2.9",
    )
    assert json.loads(run["device_settings"]) == {"clocksLocked": True, "persistenceMode": True}
    assert json.loads(run["software"])["operatingSystem"] == "Ubuntu 24.04"
    assert (run["correctness_comparator"], run["matched_ratio"]) == ("elementwise_close", 1.0)
    assert (run["gpu_count"], run["gpu_memory_bytes"]) == (1, 206158430208)
    assert run["protocol_family"] == "example_fixed_clock"
    # Every manifest the run references is in its table, under the digest the bundle names.
    assert query(
        index_settings,
        "SELECT digest, driver, cuda_toolkit, framework_version FROM environments",
    ) == [(named["environmentDigest"], "580.00", "13.1", "2.9")]
    assert query(index_settings, "SELECT digest FROM operations") == [(operation,)]
    assert query(index_settings, "SELECT digest, operation_digest FROM workloads") == [
        (named["workloadDigest"], operation)
    ]
    assert query(index_settings, "SELECT digest FROM implementations") == [
        (named["implementationDigest"],)
    ]
    assert query(index_settings, "SELECT project_name FROM projects") == [("Meridian Kernels",)]
    assert query(index_settings, "SELECT source, rows, runs FROM snapshots") == [
        ("worker-bundle", 1, 1)
    ]


@pytest.mark.parametrize("encode", [json_bytes, yaml_bytes], ids=["json", "yaml"])
def test_ten_runs_two_bad_index_eight_and_redropping_changes_nothing(
    s3_store: Any, index_settings: Any, encode: Any
) -> None:
    data = encode(ten_run_bundle())
    ingest(index_settings, s3_store, {"ten-runs.bundle": data})
    assert query(index_settings, "SELECT count(*), count(DISTINCT median) FROM runs") == [(8, 8)]
    quarantined = query(
        index_settings,
        "SELECT reason, pointer, source_key, raw IS NOT NULL FROM quarantine ORDER BY pointer",
    )
    assert quarantined == [
        (
            Reason.DANGLING_DIGEST,
            "/runs/3/run/spec/workloadDigest",
            "incoming/ten-runs.bundle",
            True,
        ),
        (Reason.UNKNOWN_FIELD, "/runs/7/run/spec/speedup", "incoming/ten-runs.bundle", True),
    ]
    assert query(index_settings, "SELECT count(*) FROM runs WHERE median IN (8003, 8007)") == [(0,)]
    before = fingerprints(index_settings)
    again = ingest(index_settings, s3_store, {"ten-runs.bundle": data})
    assert again.files[0].reused and not again.index.published
    assert fingerprints(index_settings) == before


def test_hostile_documents_are_quarantined_and_the_rest_of_the_ingest_lands(
    s3_store: Any, index_settings: Any
) -> None:
    summary = ingest(
        index_settings,
        s3_store,
        {
            "laughs.yaml": billion_laughs(),
            "deep.json": ten_thousand_deep(),
            "huge.yaml": over_size(),
            "example-fixture.yaml": FIXTURE.read_bytes(),
        },
    )
    assert [(f.source, f.runs, f.quarantined) for f in summary.files] == [
        ("worker-bundle", 0, 1),
        ("worker-bundle", 0, 1),
        ("worker-bundle", 0, 1),
        ("worker-bundle", 1, 0),
    ]
    assert query(
        index_settings, "SELECT source_key, reason, pointer FROM quarantine ORDER BY source_key"
    ) == [
        ("incoming/deep.json", Reason.TOO_DEEP, ""),
        ("incoming/huge.yaml", Reason.TOO_LARGE, ""),
        ("incoming/laughs.yaml", Reason.TOO_MANY_ALIASES, ""),
    ]
    assert query(index_settings, "SELECT source_key FROM runs") == [
        ("incoming/example-fixture.yaml",)
    ]
    # The quarantine keeps a bounded preview of the raw text, never the whole file.
    [(longest,)] = query(index_settings, "SELECT max(length(raw)) FROM quarantine")
    assert longest <= 4096


def manifests_only(bundle: dict[str, Any]) -> bytes:
    """The bundle's operation and workload as a multi-document YAML stream (no runs)."""
    return b"---\n".join(yaml_bytes(m) for m in bundle["operations"] + bundle["workloads"])


def runs_without_operation_and_workload(bundle: dict[str, Any]) -> bytes:
    slim = {k: v for k, v in bundle.items() if k not in ("operations", "workloads")}
    return json_bytes(slim)


def test_lone_manifests_land_and_a_later_bundle_may_name_them(
    s3_store: Any, index_settings: Any
) -> None:
    bundle = fixture()
    first = ingest(index_settings, s3_store, {"rmsnorm-manifests.yaml": manifests_only(bundle)})
    assert (first.files[0].runs, first.files[0].quarantined, first.files[0].rows) == (0, 0, 2)
    assert first.files[0].manifests_by_kind == {"OperationSpec": 1, "WorkloadCase": 1}
    operation = bundle["workloads"][0]["spec"]["operationSpecDigest"]
    assert query(index_settings, "SELECT digest FROM operations") == [(operation,)]
    assert query(index_settings, "SELECT count(*) FROM runs") == [(0,)]
    # Alone, the slim bundle's run and implementation dangle; with the index behind it, they land.
    second = ingest(
        index_settings, s3_store, {"runs.json": runs_without_operation_and_workload(bundle)}
    )
    assert (second.files[0].runs, second.files[0].quarantined) == (1, 0)
    run_digest = bundle["runs"][0]["run"]["spec"]
    assert query(index_settings, "SELECT workload_digest, origin FROM runs") == [
        (run_digest["workloadDigest"], "measured")
    ]
    assert query(index_settings, "SELECT count(*) FROM workloads") == [(1,)]
    assert query(index_settings, "SELECT count(*) FROM implementations") == [(1,)]


def test_an_earlier_file_of_the_same_ingest_counts_as_known(
    s3_store: Any, index_settings: Any
) -> None:
    bundle = fixture()
    summary = ingest(
        index_settings,
        s3_store,
        {
            "a-manifests.yaml": manifests_only(bundle),
            "b-runs.json": runs_without_operation_and_workload(bundle),
        },
    )
    assert [(f.runs, f.quarantined) for f in summary.files] == [(0, 0), (1, 0)]


def test_a_run_naming_what_nobody_holds_is_quarantined(s3_store: Any, index_settings: Any) -> None:
    bundle = fixture()
    bundle["runs"][0]["run"]["spec"]["workloadDigest"] = MISSING_DIGEST
    summary = ingest(index_settings, s3_store, {"dangling.json": json_bytes(bundle)})
    assert (summary.files[0].runs, summary.quarantined_by_reason) == (
        0,
        {Reason.DANGLING_DIGEST: 1},
    )
    # The bundle's valid manifests still reach their tables.
    assert query(index_settings, "SELECT count(*) FROM operations") == [(1,)]


def two_protocol_bundle() -> bytes:
    """One workload and environment; `torch` (a baseline provider) and meridian under protocol A,
    meridian again under protocol B."""
    bundle = fixture()
    item = bundle["runs"][0]
    writer = BundleWriter(environment=item["environment"])
    meridian = bundle["implementations"][0]["manifest"]
    torch = copy.deepcopy(meridian)
    torch["metadata"]["name"] = "torch-rmsnorm"
    torch["spec"]["callable"]["symbol"] = "torch_rmsnorm"
    torch_project = manifest(
        "SoftwareProject",
        "torch",
        {
            "name": "PyTorch",
            "repository": "https://example.invalid/pytorch/pytorch",
            "host": {"kind": "other", "id": "example.invalid/pytorch/pytorch"},
        },
    )
    protocol_a = item["protocol"]
    protocol_b = copy.deepcopy(protocol_a)
    protocol_b["metadata"]["name"] = "other-protocol"
    protocol_b["spec"]["comparability"]["family"] = "other_family"
    protocol_b["spec"]["measurement"]["timer"] = "host_wall_clock"
    common = {"workload": bundle["workloads"][0], "operation": bundle["operations"][0]}
    runs = [
        (torch, torch_project, protocol_a, 20_000, "2026-08-01T12:00:00Z"),
        (meridian, bundle["projects"][0], protocol_a, 8_000, "2026-08-01T12:00:00Z"),
        # Later, so it would supersede the run above if protocols were mixed.
        (meridian, bundle["projects"][0], protocol_b, 9_000, "2026-08-02T12:00:00Z"),
    ]
    for implementation, project, protocol, latency, observed_at in runs:
        writer.add_run(
            implementation=implementation,
            project=project,
            protocol=protocol,
            samples_ns=[latency + i for i in range(-5, 6)],
            observed_at=observed_at,
            **common,
        )
    return writer.dumps("yaml")


def test_cohorts_and_speedups_never_mix_protocols(s3_store: Any, index_settings: Any) -> None:
    ingest(index_settings, s3_store, {"two-protocols.yaml": two_protocol_bundle()})
    assert query(index_settings, "SELECT provider, count(*) FROM runs GROUP BY 1 ORDER BY 1") == [
        ("meridian-kernels", 2),
        ("torch", 1),
    ]
    cohorts = rows(index_settings, "SELECT runs, providers FROM cohorts ORDER BY runs")
    assert [(c["runs"], c["providers"]) for c in cohorts] == [
        (1, ["meridian-kernels"]),
        (2, ["meridian-kernels", "torch"]),
    ]
    # The same case measured under another protocol is not a re-measurement: nothing superseded.
    assert query(index_settings, "SELECT count(*) FROM latest_runs") == [(3,)]
    speedups = rows(index_settings, "SELECT * FROM speedups")
    assert [(s["provider"], s["baseline_provider"], s["speedup"]) for s in speedups] == [
        ("meridian-kernels", "torch", 2.5)
    ]
    [protocol_a] = query(
        index_settings, "SELECT protocol_digest FROM runs WHERE provider = 'torch'"
    )
    assert speedups[0]["protocol_digest"] == protocol_a[0]

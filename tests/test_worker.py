"""The writer GPU workers import: statistics against numpy, the environment, a valid bundle."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from index_support import index_settings, query

from pipelines.index.publish import publish_index
from pipelines.ingest import process_snapshot
from pipelines.intake.snapshots import take_snapshot
from pipelines.sources import normalize_object
from pipelines.sources.bundles.normalize import normalize_bundle_bytes
from pipelines.sources.bundles.reader import read_documents
from pipelines.sources.bundles.validate import check_manifest
from pipelines.worker import BundleWriter, InvalidBundle, capture_environment, summarize_ns
from pipelines.worker.environment import parse_nvidia_smi, sm_architecture
from pipelines.worker.stats import median_rank_interval

__all__ = ["index_settings"]

FIXTURE = Path(__file__).parent / "data" / "kernelindex" / "submissions" / "example-fixture.yaml"


def round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


@pytest.mark.parametrize("n", [1, 2, 5, 6, 7, 50, 200, 1001, 6000])
def test_statistics_match_numpy(n: int) -> None:
    rng = random.Random(n)
    samples = [8000 + rng.lognormvariate(3, 1) for _ in range(n)]
    summary = summarize_ns(samples)
    x = np.array(samples)
    median = np.median(x)
    assert summary.samples == n
    assert summary.median == round_half_up(median)
    assert summary.mean == round_half_up(x.mean())
    assert summary.p05 == round_half_up(np.percentile(x, 5))
    assert summary.p95 == round_half_up(np.percentile(x, 95))
    assert (summary.minimum, summary.maximum) == (round_half_up(x.min()), round_half_up(x.max()))
    assert summary.mad == round_half_up(np.median(np.abs(x - median)))
    if n < 6:
        assert summary.confidence95 is None
    else:
        low, high = median_rank_interval(n)  # type: ignore[misc]
        ordered = np.sort(x)
        assert summary.confidence95 == (
            round_half_up(ordered[low - 1]),
            round_half_up(ordered[high - 1]),
        )
        assert summary.confidence95[0] <= summary.median <= summary.confidence95[1]


@pytest.mark.parametrize("n", [6, 10, 20, 200, 999])
def test_median_interval_is_the_tightest_with_95_percent_coverage(n: int) -> None:
    ranks = median_rank_interval(n)
    assert ranks is not None
    low, high = ranks
    assert high == n - low + 1

    def coverage(rank: int) -> float:
        tail = sum(math.comb(n, k) for k in range(rank)) / 2**n
        return 1 - 2 * tail

    assert coverage(low) >= 0.95
    assert low + 1 > n // 2 or coverage(low + 1) < 0.95


def test_large_sample_interval_uses_the_normal_approximation_sensibly() -> None:
    low, high = median_rank_interval(10_000)  # type: ignore[misc]
    assert 4900 < low < 4903 and high == 10_000 - low + 1


def test_integer_samples_and_bad_samples() -> None:
    assert summarize_ns([5, 1, 3]).median == 3
    with pytest.raises(ValueError):
        summarize_ns([])
    with pytest.raises(ValueError):
        summarize_ns([1.0, float("nan")])


def test_nvidia_smi_output_is_parsed() -> None:
    text = "NVIDIA H200, 143771, 570.124.06, 9.0\nNVIDIA H200, 143771, 570.124.06, 9.0\n"
    gpus = parse_nvidia_smi(text)
    assert len(gpus) == 2
    assert (gpus[0].product, gpus[0].memory_bytes, gpus[0].driver, gpus[0].architecture) == (
        "NVIDIA H200",
        143771 * 2**20,
        "570.124.06",
        "sm_90",
    )
    assert sm_architecture("10.0") == "sm_100"


def test_environment_is_a_valid_manifest_and_says_when_there_is_no_gpu() -> None:
    environment = capture_environment()
    checked = check_manifest(environment)
    assert checked.valid, checked.detail
    hardware = environment["spec"]["hardware"]
    if parse_nvidia_smi("") == [] and hardware["vendor"] == "none":
        assert environment["metadata"]["labels"] == {"accelerator": "none"}
        assert hardware["product"].startswith("no GPU")
    else:
        assert hardware["vendor"] == "nvidia" and hardware["architecture"].startswith("sm_")
    assert environment["spec"]["software"]["operatingSystem"]


def fixture() -> dict[str, Any]:
    return read_documents(FIXTURE.read_bytes()).documents[0].value


def writer_with_two_runs() -> tuple[BundleWriter, list[list[float]]]:
    bundle = fixture()
    writer = BundleWriter(environment=capture_environment())
    rng = random.Random(7)
    all_samples = []
    for tokens in (2048, 4096):
        workload = bundle["workloads"][0] | {"metadata": {"name": f"rmsnorm-h4096-tokens-{tokens}"}}
        workload["spec"] = workload["spec"] | {"axes": {"tokens": tokens, "hidden": 4096}}
        samples = [tokens * 4 + rng.gauss(0, 30) ** 2 for _ in range(200)]
        all_samples.append(samples)
        writer.add_run(
            implementation=bundle["implementations"][0]["manifest"],
            workload=workload,
            protocol=bundle["runs"][0]["protocol"],
            samples_ns=samples,
            operation=bundle["operations"][0],
            project=bundle["projects"][0],
            correctness={"comparator": "elementwise_close", "matchedRatio": 1.0},
        )
    return writer, all_samples


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_writer_uploads_to_s3_and_the_index_has_software_and_numpy_statistics(
    fmt: str, s3_store: Any, index_settings: Any
) -> None:
    writer, all_samples = writer_with_two_runs()
    info = writer.upload(s3_store, format=fmt)  # type: ignore[arg-type]
    assert info.key.startswith("incoming/worker-bundles/") and info.key.endswith("." + fmt)
    data = s3_store.get_bytes(info.key)
    result = normalize_object(info.key, data)
    assert result.source == "worker-bundle"
    outcomes = list(result.outcomes)
    assert [o.status for o in outcomes] == ["ok", "ok"]
    for outcome in outcomes:
        assert outcome.facts is not None and outcome.facts.origin == "measured"
        assert outcome.facts.kernel == "rmsnorm" and outcome.facts.provider == "meridian-kernels"
    # Shared manifests are written once.
    bundle = read_documents(data).documents[0].value
    assert [
        len(bundle[s]) for s in ("projects", "operations", "workloads", "implementations", "runs")
    ] == [1, 1, 2, 1, 2]
    # Re-uploading the same bytes writes the same key.
    assert writer.upload(s3_store, format=fmt).key == info.key  # type: ignore[arg-type]

    # The uploaded object through snapshot, records and a published index.
    snapshot = take_snapshot(s3_store, index_settings, info.key, etag=info.etag)
    process_snapshot(s3_store, index_settings, snapshot)
    publish_index(s3_store, index_settings)
    columns = "samples, median, mean, p05, p95, minimum, maximum, mad, ci95_low, ci95_high"
    indexed = query(
        index_settings,
        f"SELECT {columns}, origin, software, driver, framework_version FROM runs ORDER BY median",
    )
    software = capture_environment()["spec"]["software"]
    for row, samples in zip(indexed, all_samples, strict=True):
        assert row[:10] == numpy_statistics(samples)
        assert row[10] == "measured"
        assert json.loads(row[11]) == software
        assert row[12] == software.get("driver")
        assert row[13] == software.get("framework", {}).get("version")


def numpy_statistics(samples: list[float]) -> tuple[int, ...]:
    """(samples, median, mean, p05, p95, min, max, MAD, CI95 low, CI95 high) by numpy."""
    x = np.sort(np.array(samples))
    median = np.median(x)
    ranks = median_rank_interval(len(x))
    assert ranks is not None
    return (
        len(x),
        round_half_up(median),
        round_half_up(x.mean()),
        round_half_up(np.percentile(x, 5)),
        round_half_up(np.percentile(x, 95)),
        round_half_up(x.min()),
        round_half_up(x.max()),
        round_half_up(np.median(np.abs(x - median))),
        round_half_up(x[ranks[0] - 1]),
        round_half_up(x[ranks[1] - 1]),
    )


def test_writer_refuses_to_write_a_bundle_kindex_would_quarantine(tmp_path: Path) -> None:
    bundle = fixture()
    writer = BundleWriter(environment=capture_environment())
    protocol = bundle["runs"][0]["protocol"]
    protocol = protocol | {"spec": protocol["spec"] | {"speed": "fast"}}
    writer.add_run(
        implementation=bundle["implementations"][0]["manifest"],
        workload=bundle["workloads"][0],
        protocol=protocol,
        samples_ns=[1, 2, 3],
        operation=bundle["operations"][0],
    )
    with pytest.raises(InvalidBundle) as caught:
        writer.write(str(tmp_path / "b.yaml"))
    assert caught.value.outcomes[0].reason == "unknown_field"
    assert not (tmp_path / "b.yaml").exists()


def test_writer_without_operation_needs_the_index_to_know_it(tmp_path: Path) -> None:
    bundle = fixture()
    writer = BundleWriter(environment=capture_environment())
    writer.add_run(
        implementation=bundle["implementations"][0]["manifest"],
        workload=bundle["workloads"][0],
        protocol=bundle["runs"][0]["protocol"],
        samples_ns=[10.0] * 10,
    )
    with pytest.raises(InvalidBundle):
        writer.write(str(tmp_path / "a.json"), format="json")
    operation = bundle["workloads"][0]["spec"]["operationSpecDigest"]
    data = writer.write(
        str(tmp_path / "a.json"), format="json", known_digest={operation}.__contains__
    )
    assert [o.status for o in normalize_bundle_bytes(data, {operation}.__contains__)] == ["ok"]

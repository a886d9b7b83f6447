"""A curation gap in a Liger CSV (a GPU, provider, kernel, pass, metric or config shape the
curation lacks) is an uncurated run, named as the file named it, with real axes; never a
quarantine row. The curated rows beside it keep their digests, and a curation that grows turns
the run into its curated form."""

from __future__ import annotations

from pathlib import Path

import pytest
from index_support import curation
from liger_oracle import row_outcomes
from liger_support import HEADER
from test_liger_bad_inputs import GOOD, GOOD_FIELDS, row_with

from pipelines.curation import load
from pipelines.records import RowOutcome
from pipelines.records.manifests import first_schema_error
from pipelines.sources.liger.model import Normalizer, parser_version
from pipelines.sources.liger.normalize import normalize_bytes

__all__ = ["curation"]  # the fixture, imported for pytest

KINDS = ("BenchmarkRun", "OperationSpec", "SoftwareProject", "ImplementationRevision",
         "WorkloadCase", "BenchmarkProtocol", "ExecutionEnvironment")  # fmt: skip


def normalize_text(*rows: str, normalizer: Normalizer | None = None) -> list[RowOutcome]:
    return list(normalize_bytes("\n".join([HEADER, *rows, ""]).encode(), normalizer))


def assert_valid(outcome: RowOutcome) -> None:
    assert outcome.status == "ok", outcome.detail
    assert [r.kind for r in outcome.records] == list(KINDS)
    for record in outcome.records:
        assert first_schema_error(record.manifest) is None, (record.kind, record.manifest)


GAPS = [
    (dict(gpu_name="AMD Instinct MI999X"), "gpu"),
    (dict(kernel_provider="cutlass"), "provider"),
    (dict(kernel_provider="megatron-fused"), "provider"),  # curated for another kernel only
    (dict(kernel_name="flash_attention_9000"), "kernel,config"),  # no kernel, no binding
    (dict(kernel_operation_mode="sideways"), "mode"),
    (dict(metric_name="speed_cold"), "metric"),
    (dict(x_name="D", x_value="64"), "config"),
    (dict(gpu_name="NVIDIA H300", kernel_provider="triton"), "provider,gpu"),
]


@pytest.mark.parametrize(("changes", "gaps"), GAPS)
def test_a_curation_gap_is_an_uncurated_run_and_the_rest_of_the_file_lands(
    changes: dict[str, str], gaps: str
) -> None:
    row = row_with(**changes)
    good, run, later = normalize_text(GOOD, row, row_with(timestamp="2026-05-27 17:14:31"))
    for outcome in (good, run, later):
        assert_valid(outcome)
    (alone,) = normalize_text(GOOD)
    assert [r.digest for r in good.records] == [r.digest for r in alone.records]
    labels = run.records[0].manifest["metadata"]["labels"]
    assert labels == {"curation": "uncurated", "uncurated": gaps, "liger_version": "0.8.0"}
    assert "curation" not in good.records[0].manifest["metadata"].get("labels", {})
    # Named as the file named it.
    assert run.facts is not None and good.facts is not None
    expected = {**dict(zip(HEADER.split(","), GOOD_FIELDS, strict=True)), **changes}
    assert (run.facts.kernel, run.facts.provider, run.facts.mode, run.facts.gpu) == (
        expected["kernel_name"],
        expected["kernel_provider"],
        expected["kernel_operation_mode"],
        expected["gpu_name"],
    )
    # The numbers are the row's own, stored as a curated run's are.
    assert (run.facts.median, run.facts.p20, run.facts.p80) == (
        good.facts.median,
        good.facts.p20,
        good.facts.p80,
    )
    assert run.records[0].digest != good.records[0].digest
    assert run.facts.external_id != good.facts.external_id
    # The batch path and the row-by-row oracle agree byte for byte.
    data = "\n".join([HEADER, GOOD, row, ""]).encode()
    oracle = list(row_outcomes(data))
    produced = list(normalize_bytes(data))
    assert [r.json_line() for r in produced] == [r.json_line() for r in oracle]


def test_an_uncurated_gpu_keeps_its_name_and_guesses_nothing() -> None:
    (run,) = normalize_text(row_with(gpu_name="AMD Instinct MI999X"))
    environment = run.records[6].manifest
    assert environment["spec"]["hardware"] == {
        "vendor": "unspecified",
        "product": "AMD Instinct MI999X",
        "architecture": "unspecified",
    }
    assert environment["metadata"]["labels"] == {"curation": "uncurated", "uncurated": "gpu"}
    assert run.facts is not None and run.facts.architecture == "unspecified"


def test_an_uncurated_kernel_provider_metric_and_pass_are_named_as_written() -> None:
    (kernel,) = normalize_text(row_with(kernel_name="deepseek_v4_rope"))
    operation = kernel.records[1].manifest
    assert operation["metadata"]["title"] == "deepseek_v4_rope"
    assert operation["metadata"]["labels"]["uncurated"] == "kernel"
    (provider,) = normalize_text(row_with(kernel_provider="cutlass"))
    assert provider.records[2].manifest["spec"]["name"] == "cutlass"
    assert provider.facts is not None and provider.facts.extra["baseline"] is False
    (metric,) = normalize_text(row_with(metric_name="speed_cold"))
    protocol = metric.records[5].manifest
    assert protocol["metadata"]["labels"] == {"curation": "uncurated", "uncurated": "metric"}
    assert protocol["spec"]["comparability"]["family"].endswith("_speed_cold")
    assert metric.facts is not None and metric.facts.external_id.endswith("/speed_cold")
    assert metric.facts.metric == "latency" and metric.facts.unit == "ns"
    (mode,) = normalize_text(row_with(kernel_operation_mode="sideways"))
    assert mode.records[5].manifest["metadata"]["labels"]["uncurated"] == "mode"


def test_speed_graph_is_a_curated_metric_of_its_own() -> None:
    """benchmark_rope_backends.py's `speed_graph` (CUDA-graph replay, ms): a curated run beside
    the do_bench run of the same row, never its duplicate nor in its protocol."""
    speed, graph = normalize_text(GOOD, row_with(metric_name="speed_graph"))
    assert_valid(graph)
    assert graph.facts is not None and speed.facts is not None
    assert "curation" not in graph.records[0].manifest["metadata"].get("labels", {})
    assert graph.facts.external_id == speed.facts.external_id + "/speed_graph"
    assert graph.records[5].digest != speed.records[5].digest
    protocol = graph.records[5].manifest["spec"]
    assert protocol["comparability"]["family"] == "liger_kernel_bench_cuda_graph"
    assert protocol["measurement"]["timer"] == "cuda_graph_replay"
    assert graph.facts.median == speed.facts.median  # ms to integer ns, as speed
    data = "\n".join([HEADER, GOOD, row_with(metric_name="speed_graph"), ""]).encode()
    oracle = [r.json_line() for r in row_outcomes(data)]
    assert [r.json_line() for r in normalize_bytes(data)] == oracle


def test_a_config_picking_no_curated_kernel_is_that_kernel_uncurated() -> None:
    """`dyt` names a curated kernel by its config's `beta`; a beta no one curated keeps the
    name the file wrote."""
    config = '{"beta": null, "hidden_size": 4096, "dtype": "torch.float32"}'
    (run,) = normalize_text(row_with(kernel_name="dyt", extra_benchmark_config_str=config))
    assert_valid(run)
    assert run.facts is not None and run.facts.kernel == "dyt"


def test_an_uncurated_workload_has_the_swept_value_and_the_config_keys_as_axes() -> None:
    bf16 = '{"H": 4096, "dtype": "torch.bfloat16"}'
    row = row_with(x_name="D", x_value="64", extra_benchmark_config_str=bf16)
    (run,) = normalize_text(row)
    workload = run.records[4].manifest
    axes = workload["spec"]["axes"]
    assert {k: v for k, v in axes.items() if k != "uncurated_settings"} == {"d": 64, "h": 4096}
    assert run.facts is not None
    assert run.facts.case_key == "uncurated-d64-h4096-dtype=torch.bfloat16"
    assert run.facts.dtype == "bf16"
    assert workload["metadata"]["labels"] == {"curation": "uncurated", "uncurated": "config"}
    # A setting that is no size (the dtype) still tells two workloads apart.
    fp32 = row_with(x_name="D", x_value="64", extra_benchmark_config_str=bf16.replace("b", "f"))
    (other,) = normalize_text(fp32)
    assert other.records[4].digest != run.records[4].digest
    # Sizes alone: the workload's axes are exactly them.
    (sizes,) = normalize_text(row_with(x_name="D", x_value="128", extra_benchmark_config_str="{}"))
    assert sizes.records[4].manifest["spec"]["axes"] == {"d": 128}
    # Names that meet as one axis (B and b) keep two cases apart by their digest.
    clash = row_with(x_name="B", x_value="2", extra_benchmark_config_str='{"b": 3}')
    again = row_with(x_name="B", x_value="3", extra_benchmark_config_str='{"b": 2}')
    (one,), (two,) = normalize_text(clash), normalize_text(again)
    assert one.records[4].digest != two.records[4].digest


def test_a_grown_curation_turns_an_uncurated_run_into_the_curated_one(curation: Path) -> None:
    """Ingest with a GPU uncurated, curate it, normalize again: the curated run, digest for
    digest the run of that GPU curated from the start; the parser version tells a backfill to
    rebuild it."""
    gpu = "NVIDIA GeForce RTX 2080 Ti"
    row = row_with(gpu_name=gpu)
    before = load()
    (uncurated,) = normalize_text(row, normalizer=Normalizer(before))
    assert uncurated.records[0].manifest["metadata"]["labels"]["uncurated"] == "gpu"
    gpus = curation / "gpus.yaml"
    gpus.write_text(
        gpus.read_text()
        + f"  {gpu}: {{vendor: nvidia, product: {gpu}, architecture: sm_75, title: RTX 2080 Ti}}\n"
    )
    after = load()
    assert parser_version(after) != parser_version(before)
    (curated,) = normalize_text(row, normalizer=Normalizer(after))
    assert_valid(curated)
    assert "curation" not in curated.records[0].manifest["metadata"]["labels"]
    assert curated.records[6].manifest["spec"]["hardware"]["architecture"] == "sm_75"
    assert curated.facts is not None and uncurated.facts is not None
    assert curated.facts.external_id == uncurated.facts.external_id  # the same row, now curated
    assert curated.records[0].digest != uncurated.records[0].digest


SAMPLE = Path(__file__).parents[2] / "data" / "liger" / "curation_gaps_sample.csv"


def _without(folder: Path, name: str, *drops: str) -> None:
    """Drop from a curation file every line holding one of `drops` (and a provider's block)."""
    lines = (folder / name).read_text().splitlines(keepends=True)
    kept, skipping = [], False
    for line in lines:
        if skipping and line.startswith("    "):
            continue
        skipping = False
        if any(drop in line for drop in drops):
            skipping = line.rstrip().endswith(":")  # a block: its indented lines go too
            continue
        kept.append(line)
    (folder / name).write_text("".join(kept))


def test_real_rows_an_older_curation_lacked_are_curated_runs() -> None:
    """Rows of forks' committed Liger CSVs (tests/data/NOTICE.md): each a run of the curation
    now, GPUs under their vendors' names with their architectures."""
    outcomes = list(normalize_bytes(SAMPLE.read_bytes()))
    assert len(outcomes) == 82
    gpus = load().gpus
    for outcome in outcomes:
        assert_valid(outcome)
        assert outcome.facts is not None
        run = outcome.records[0].manifest
        assert "curation" not in run["metadata"].get("labels", {}), outcome.raw
        hardware = outcome.records[6].manifest["spec"]["hardware"]
        assert hardware == gpus[outcome.facts.gpu].hardware
    archs = {o.facts.gpu: o.facts.architecture for o in outcomes if o.facts is not None}
    assert archs["NVIDIA A100 80GB PCIe"] == "sm_80"
    assert archs["NVIDIA B300 SXM6 AC"] == "sm_103"
    assert archs["NVIDIA GeForce RTX 5060 Ti"] == "sm_120"
    kernels = {o.facts.kernel for o in outcomes if o.facts is not None}
    assert "dyt_beta=True" in kernels and "dyt" not in kernels


def test_without_their_curation_the_real_rows_are_uncurated_runs_not_quarantine(
    curation: Path,
) -> None:
    """The same rows against the curation as it was before them: every row still lands, as an
    uncurated run saying what is missing; none is quarantined."""
    _without(curation, "gpus.yaml", "A100 80GB PCIe", "B300 SXM6 AC", "RTX 5060 Ti")
    _without(curation, "providers.yaml", "  torchcompile:")
    _without(curation, "kernels.yaml", "absent: true", "defaults:")
    outcomes = list(normalize_bytes(SAMPLE.read_bytes(), Normalizer(load())))
    gaps: dict[str, int] = {}
    for outcome in outcomes:
        assert_valid(outcome)
        labels = outcome.records[0].manifest["metadata"]["labels"]
        assert labels["curation"] == "uncurated", outcome.raw
        gaps[labels["uncurated"]] = gaps.get(labels["uncurated"], 0) + 1
    assert set(gaps) == {"gpu", "provider", "provider,gpu", "kernel,config", "config"}

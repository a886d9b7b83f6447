"""The real Liger corpus, sampled: every row becomes a run, digest for digest with KernelIndex's
importer where it imports the row, and a schema-valid record of kindex's own where it skips it.

tests/data/liger/corpus_sample.csv holds one row of each (kernel, provider, pass, metric, x_name,
config keys, GPU, reference outcome) of the shared corpus (three HEAD CSVs, gh-pages runs, history
versions); tests/data/vectors/corpus_sample.reference.jsonl gives each row's reference outcome and
where it came from. benchmarks/liger_coverage.py measures the same over the whole corpus.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from liger_support import DATA, HEADER, RECORD_ORDER

from pipelines.curation import CURATION_DIR_VARIABLE, CURATION_FILES, curation_dir, load
from pipelines.records.manifests import schema_errors
from pipelines.sources.liger.columnar import normalized_batches, write_json_lines
from pipelines.sources.liger.model import shared_normalizer
from pipelines.sources.liger.normalize import normalize_bytes

SAMPLE = DATA / "liger" / "corpus_sample.csv"
REFERENCE = DATA / "vectors" / "corpus_sample.reference.jsonl"
KINDS = dict(
    zip(
        (
            "BenchmarkRun",
            "OperationSpec",
            "SoftwareProject",
            "ImplementationRevision",
            "WorkloadCase",
            "BenchmarkProtocol",
            "ExecutionEnvironment",
        ),
        RECORD_ORDER,
        strict=True,
    )
)


@cache
def reference() -> dict[int, dict[str, Any]]:
    lines = REFERENCE.read_text(encoding="utf-8").splitlines()
    return {d["line"]: d for d in map(json.loads, lines)}


@cache
def batch_lines() -> dict[int, dict[str, Any]]:
    """The production path's `kindex normalize` lines of the sample, by source line."""
    out = io.BytesIO()
    with SAMPLE.open("rb") as stream:
        for batch in normalized_batches(stream, rows=300):  # several batches
            write_json_lines(batch, out)
    return {d["source_line"]: d for d in map(json.loads, out.getvalue().splitlines())}


def rows() -> list[dict[str, str]]:
    with SAMPLE.open(encoding="utf-8", newline="") as stream:
        return list(csv.DictReader(stream))


def digests(line: dict[str, Any]) -> dict[str, str]:
    return {KINDS[r["kind"]]: r["digest"] for r in line["records"]}


def external_id(line: dict[str, Any]) -> str:
    return str(line["records"][0]["manifest"]["spec"]["sourceNative"]["externalId"])


def test_every_row_of_the_sample_becomes_a_run() -> None:
    lines = batch_lines()
    assert len(lines) == len(reference()) == len(rows())
    quarantined = {n: (d["reason"]) for n, d in lines.items() if d["status"] != "ok"}
    assert quarantined == {}


def test_rows_the_reference_imports_keep_its_digests_for_all_seven_kinds() -> None:
    imported = {n: d for n, d in reference().items() if d["outcome"] == "run"}
    assert len(imported) > 400
    for number, expected in imported.items():
        line = batch_lines()[number]
        assert digests(line) == {k: expected[k] for k in RECORD_ORDER}, expected["source"]
        assert external_id(line) == expected["externalId"], expected["source"]


def test_the_sample_covers_what_was_newly_curated() -> None:
    """The rows the reference skips as uncurated are all in the sample, and are runs."""
    skipped = Counter(d["reason"] for d in reference().values() if d["outcome"] == "skip")
    assert set(skipped) >= {"uncuratedKernels", "unknownGpu", "unknownProvider", "unknownConfig"}
    sample = rows()
    assert {r["kernel_name"] for r in sample} >= {
        "dyt", "dyt_beta=True", "dyt_beta=False", "poly_norm", "qwen2vl_mrope", "dpo_loss",
    }  # fmt: skip
    assert {r["gpu_name"] for r in sample} >= {
        "NVIDIA H200", "NVIDIA H100 NVL", "NVIDIA A100-SXM4-40GB",
    }  # fmt: skip
    assert {r["kernel_provider"] for r in sample} >= {
        "liger_triton", "liger_cutile", "liger_cutedsl", "liger-fp32-accum",
        "liger_cutile_fused_add_rms_norm", "liger_triton_rms_norm",
    }  # fmt: skip
    assert "no-grad-forward" in {r["kernel_operation_mode"] for r in sample}
    assert "model_config" in {r["x_name"] for r in sample}
    assert any('"bsz"' in r["extra_benchmark_config_str"] for r in sample)


def test_kindex_own_records_validate_and_never_collide() -> None:
    """Rows the reference skips (memory, uncurated) become records that validate against the
    schemas; no two runs share a digest or an externalId, and a memory run never shares its
    protocol with a speed run."""
    seen: set[str] = set()
    runs: set[str] = set()
    ids: set[str] = set()
    protocols: dict[str, set[str]] = {"latency": set(), "memory": set()}
    for line in batch_lines().values():
        for record in line["records"]:
            if record["digest"] not in seen:
                seen.add(record["digest"])
                assert list(schema_errors(record["manifest"])) == [], record["kind"]
        run = line["records"][0]["manifest"]
        metric = "memory" if run["spec"]["sourceNative"]["metrics"].get("mb_50") else "latency"
        protocols[metric].add(digests(line)["protocol"])
        runs.add(digests(line)["run"])
        ids.add(external_id(line))
    assert len(runs) == len(ids) == len(batch_lines())
    assert protocols["memory"] and not protocols["memory"] & protocols["latency"]


def test_identity_is_stable_across_files() -> None:
    """A row's records depend on the row alone: alone in a file, or among others, in any
    batch, it gives the same digests and externalId."""
    sample = SAMPLE.read_text(encoding="utf-8").splitlines()
    for number in (2, 100, len(sample) // 2, len(sample)):
        alone = list(normalize_bytes(f"{HEADER}\n{sample[number - 1]}\n".encode()))
        assert alone[0].status == "ok"
        line = batch_lines()[number]
        assert alone[0].run is not None and alone[0].run.digest == digests(line)["run"]
        assert alone[0].facts is not None and alone[0].facts.external_id == external_id(line)


def _row(**fields: str) -> str:
    columns = HEADER.split(",")
    base = dict.fromkeys(columns, "")
    base.update(
        kernel_provider="liger",
        kernel_operation_mode="forward",
        metric_name="speed",
        metric_unit="ms",
        x_label="x",
        y_value_50="0.5",
        y_value_20="0.4",
        y_value_80="0.6",
        gpu_name="NVIDIA H200",
        timestamp="2026-07-22 07:43:19",
        liger_version="0.8.0",
    )
    base.update(fields)
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="").writerow([base[c] for c in columns])
    return buffer.getvalue()


def _outcomes(*rows: str) -> list[Any]:
    return list(normalize_bytes("\n".join([HEADER, *rows, ""]).encode()))


def test_a_config_value_picks_the_kernel_a_name_stands_for() -> None:
    """`dyt` with beta true is the kernel Liger once named `dyt_beta=True` (kernelNames): the
    same OperationSpec; a beta the curation does not name names no curated kernel."""

    def dyt(beta: object) -> str:
        config = {"hidden_size": 4096, "dtype": "torch.bfloat16", "beta": beta, "bsz": 1}
        return _row(kernel_name="dyt", x_name="BT", x_value="1024", **_config(config))

    named = _row(
        kernel_name="dyt_beta=True",
        x_name="hidden_size",
        x_value="4096",
        timestamp="2025-07-11 00:47:05",
        **_config({"BT": 1024, "dtype": "torch.bfloat16", "beta": True}),
    )
    new, old, odd = _outcomes(dyt(True), named, dyt("yes"))
    assert new.status == old.status == "ok"
    assert new.facts.kernel == "dyt_beta=True"
    assert new.records[1].digest == old.records[1].digest  # one OperationSpec
    assert new.records[4].digest == old.records[4].digest  # tokens 1024 × hidden 4096
    # A value no one curated: the kernel as the file names it, uncurated, never a guess.
    assert odd.status == "ok" and odd.facts.kernel == "dyt"
    assert odd.records[0].manifest["metadata"]["labels"]["uncurated"] == "kernel,config"


def _config(config: dict[str, Any]) -> dict[str, str]:
    return {"extra_benchmark_config_str": json.dumps(config)}


def test_model_config_x_names_a_curated_model() -> None:
    """x_name=model_config: x names a model profile; two models of one vocabulary give one
    workload but two runs; a model no one curated is never guessed: its row is an uncurated
    run, its parameters as they stand."""

    def row(model: str) -> str:
        config = _config({"bsz": 1, "seq_len": 2048})
        return _row(kernel_name="cross_entropy", x_name="model_config", x_value=model, **config)

    seven, fourteen, llama, unknown = _outcomes(
        row("qwen2.5_7b"), row("qwen2.5_14b"), row("llama_3_8b"), row("qwen9_1t")
    )
    assert seven.status == fourteen.status == llama.status == "ok"
    assert seven.records[4].digest == fourteen.records[4].digest != llama.records[4].digest
    assert seven.records[4].manifest["spec"]["axes"] == {"tokens": 2048, "vocab": 152064}
    assert seven.facts.external_id != fourteen.facts.external_id
    case = "tokens2048-vocab152064-fp32-qwen2.5_7b"
    assert seven.facts.external_id.endswith(f"/{case}/2026-07-22-07-43-19")
    assert unknown.status == "ok" and unknown.facts.case_key.startswith("uncurated-")
    assert unknown.records[0].manifest["metadata"]["labels"]["curation"] == "uncurated"
    workload = unknown.records[4].manifest
    assert workload["metadata"]["labels"] == {"curation": "uncurated", "uncurated": "config"}
    assert json.loads(workload["metadata"]["description"]) == {
        "bsz": 1, "seq_len": 2048, "model_config": "qwen9_1t"
    }  # fmt: skip
    assert list(schema_errors(workload)) == []


SWIGLU = {"hidden_size": 4096, "intermediate_size": 11008, "dtype": "torch.bfloat16"}


@pytest.mark.parametrize(
    ("config", "status"),
    [
        ({"bsz": 2, **SWIGLU, "hidden_act": "silu", "seq_len": 8}, "ok"),
        ({"B": 2, **SWIGLU, "hidden_act": "silu"}, "ok"),
        ({"B": 2, "bsz": 2, **SWIGLU, "hidden_act": "silu"}, "uncurated"),
    ],
)
def test_a_config_key_alias_binds_as_the_key_it_stands_for(
    config: dict[str, Any], status: str
) -> None:
    """swiglu's `bsz` (current scripts) is `B` (older ones): one workload; both at once is a
    shape no one curated: an uncurated run."""
    old = _config({"B": 2, **SWIGLU, "hidden_act": "silu"})
    reference_row, row = _outcomes(
        _row(kernel_name="swiglu", x_name="T", x_value="512", **old),
        _row(
            kernel_name="swiglu",
            x_name="T",
            x_value="512",
            timestamp="2026-07-22 07:43:20",
            **_config(config),
        ),
    )
    assert row.status == "ok"
    if status == "ok":
        assert row.records[4].digest == reference_row.records[4].digest
    else:
        assert row.facts.case_key.startswith("uncurated-")


def test_provider_tags_twin_every_liger_provider() -> None:
    """LIGER_BENCH_PROVIDER_TAG renames: each tag twins every liger* provider, for the same
    kernels, never as a baseline."""
    providers = load().providers
    for tag in ("liger_triton", "liger_cutile", "liger_cutedsl"):
        for name, base in providers.items():
            if name.startswith("liger") and not name.startswith(("liger_triton", "liger_cut")):
                twin = providers[tag + name[len("liger") :]]
                assert twin.kernels == base.kernels and not twin.baseline
    assert providers["liger_cutile"].implementation["callable"] == {"language": "cutile"}


SCRIPT_SHAPES = DATA / "liger" / "script_shapes.csv"


def test_every_shape_the_current_scripts_write_becomes_a_valid_run() -> None:
    """Rows in the shapes of Liger's current benchmark scripts (token-length and model-config
    sweeps, kernels the corpus has no rows of: attn_res, mhc_*, grpo_loss_kernel_*, mlp, ...):
    each a run whose records validate, none colliding with another."""
    outcomes = list(normalize_bytes(SCRIPT_SHAPES.read_bytes()))
    assert len(outcomes) == 65
    assert [(o.source_line, o.reason) for o in outcomes if o.status != "ok"] == []
    for outcome in outcomes:
        for record in outcome.records:
            assert list(schema_errors(record.manifest)) == [], (outcome.source_line, record.kind)
    assert len({o.facts.external_id for o in outcomes if o.facts}) == len(outcomes)
    by_kernel = {(o.facts.kernel, o.facts.case_key) for o in outcomes if o.facts}
    # renames keep one kernel across Liger's renames; a model config binds the model's sizes
    assert ("fused_linear_cpo_loss", "batch4-hidden4096-seq1024-vocab128256-bf16") in by_kernel
    assert ("layer_norm", "hidden5120-rows1024-bf16-qwen2.5_14b") in by_kernel
    assert ("embedding", "batch16-hidden4096-seq512-vocab128256-bf16") in by_kernel


def test_a_metric_unit_is_one_line_of_protocols_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit no one curated is quarantined; added to protocols.yaml's `units`, its rows are
    runs in the stored unit (ns), with the row's own numbers named after its unit. The shared
    normalizer every file uses follows the edit: the edited curation gets its own."""
    config = _config({"M": 4096, "dtype": "torch.bfloat16", "eps": 1e-6})
    row = _row(kernel_name="rms_norm", x_name="H", x_value="1024", metric_unit="us", **config)
    (before,) = _outcomes(row)
    unedited = shared_normalizer()
    assert (before.status, before.reason) == ("quarantined", "unknown_metric")
    for name in CURATION_FILES:
        text = curation_dir().joinpath(name).read_text(encoding="utf-8")
        if name == "protocols.yaml":
            text = text.replace("speed: {ms: 1000000}", "speed: {ms: 1000000, us: 1000}")
        (tmp_path / name).write_text(text, encoding="utf-8")
    monkeypatch.setenv(CURATION_DIR_VARIABLE, str(tmp_path))
    (after,) = _outcomes(row)
    assert after.status == "ok"
    assert shared_normalizer() is not unedited
    assert shared_normalizer().curation.fingerprint == load().fingerprint
    spec = after.records[0].manifest["spec"]
    assert spec["timing"]["latencyNs"]["median"] == 500
    assert spec["sourceNative"]["metrics"] == {"us_50": 0.5, "us_20": 0.4, "us_80": 0.6}


def test_files_share_one_normalizer_and_its_caches() -> None:
    """Every file a process reads uses the same normalizer while the curation stays: a series
    or workload the first file built (its run template, its records) is the one the next file
    uses, not built again."""
    config = _config({"M": 4096, "dtype": "torch.bfloat16", "eps": 1e-6})
    row = _row(kernel_name="rms_norm", x_name="H", x_value="1024", **config)
    data = "\n".join([HEADER, row, ""]).encode()
    (first,) = [batch.runs for batch in normalized_batches(io.BytesIO(data))]
    (second,) = [batch.runs for batch in normalized_batches(io.BytesIO(data))]
    assert first is not None and second is not None
    assert shared_normalizer() is shared_normalizer()
    assert second.series[0] is first.series[0]
    assert second.workloads[0] is first.workloads[0]

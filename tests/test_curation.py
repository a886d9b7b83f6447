"""The curation files load alike through libyaml's parser (the one kindex uses) and ruamel's pure
Python parser: the fast path changes no kernel, provider, GPU or protocol."""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

import pipelines.curation
from pipelines.curation import (
    CURATION_DIR_VARIABLE,
    CURATION_FILES,
    _load_yaml,
    _read_files,
    curation_dir,
    load,
)
from pipelines.records import RowOutcome
from pipelines.records.manifests import first_schema_error
from pipelines.sources import SourceContext, normalize_object


@pytest.mark.parametrize("name", CURATION_FILES)
def test_c_parser_reads_the_files_as_the_pure_parser(name: str) -> None:
    files = dict(_read_files(curation_dir()))
    assert YAML(typ="safe").Parser.__module__.startswith("ruamel.yaml.clib")  # C parser present
    assert _load_yaml(files, name) == _load_yaml(files, name, pure=True)


def test_threads_that_start_together_parse_an_edited_curation_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's files start on several threads at once: they wait for one parse of a curation
    none has seen, not each parse it."""
    folder = tmp_path / "curation"
    folder.mkdir()
    for name, text in _read_files(curation_dir()):
        folder.joinpath(name).write_text(text + ("\n# edited\n" if name == "gpus.yaml" else ""))
    monkeypatch.setenv(CURATION_DIR_VARIABLE, str(folder))
    parsed: list[str] = []

    def slow_load(files: dict[str, str], name: str, pure: bool = False) -> Any:
        parsed.append(name)
        time.sleep(0.05)  # a wide window for the other threads to miss the cache too
        return _load_yaml(files, name, pure)

    monkeypatch.setattr(pipelines.curation, "_load_yaml", slow_load)
    start = threading.Barrier(8)

    def load_when_all_started(_: int) -> str:
        start.wait()
        return load().fingerprint

    with ThreadPoolExecutor(8) as pool:
        fingerprints = set(pool.map(load_when_all_started, range(8)))

    assert len(fingerprints) == 1
    assert sorted(parsed) == sorted(CURATION_FILES)


# --- one policy for a curation gap, in every source (pipelines/curation/gaps.py) -------------
def _kernelbench(*hardware: str) -> bytes:
    """A KernelBench timing file, one problem per GPU name, and a malformed problem last."""
    level = {
        f"{i + 1}_p.py": {
            "mean": 2.5,
            "std": 0.1,
            "min": 2.4,
            "max": 2.9,
            "num_trials": 100,
            "hardware": name,
            "device": "cuda:0",
        }  # fmt: skip
        for i, name in enumerate(hardware)
    }
    level["9_bad.py"] = {"mean": "fast", "num_trials": 3, "hardware": hardware[0]}
    return json.dumps({"level1": level}).encode()


def _harness_outcomes(data: bytes) -> list[RowOutcome]:
    context = SourceContext(received_at="2026-01-01T00:00:00Z")
    return list(normalize_object("incoming/timing.json", data, context=context).outcomes)


def _by_kind(outcome: RowOutcome) -> dict[str, dict[str, Any]]:
    return {r.kind: r.manifest for r in outcome.records}


def test_a_harness_keeps_an_uncurated_gpu_as_liger_does_and_quarantines_only_the_malformed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KernelBench: a GPU gpus.yaml lacks is an uncurated run labelled as Liger's are; a curated
    one (AMD's own name) gets its curated hardware; only the malformed record is quarantined.
    Curating the GPU turns the run into the curated form."""
    new = "NVIDIA GeForce RTX 2080 Ti"
    uncurated, amd, bad = _harness_outcomes(_kernelbench(new, "AMD Instinct MI300X"))
    assert (uncurated.status, amd.status, bad.status) == ("ok", "ok", "quarantined")
    assert bad.reason and bad.reason != "unknown_gpu"
    run, environment = (
        _by_kind(uncurated)["BenchmarkRun"],
        _by_kind(uncurated)["ExecutionEnvironment"],
    )
    assert run["metadata"]["labels"] == {"curation": "uncurated", "uncurated": "gpu"}
    assert environment["metadata"]["labels"] == {"curation": "uncurated", "uncurated": "gpu"}
    assert environment["spec"]["hardware"] == {
        "vendor": "unspecified",
        "product": new,
        "architecture": "unspecified",
    }
    assert uncurated.facts is not None and uncurated.facts.gpu == new
    assert _by_kind(amd)["ExecutionEnvironment"]["spec"]["hardware"] == {
        "vendor": "amd",
        "product": "AMD Instinct MI300X",
        "architecture": "gfx942",
    }
    assert "labels" not in _by_kind(amd)["BenchmarkRun"]["metadata"]
    for outcome in (uncurated, amd):
        for record in outcome.records:
            assert first_schema_error(record.manifest) is None

    folder = tmp_path / "curation"
    folder.mkdir()
    for name, text in _read_files(curation_dir()):
        (folder / name).write_text(text)
    with (folder / "gpus.yaml").open("a") as gpus:
        gpus.write(f"  {new}: {{vendor: nvidia, product: {new}, architecture: sm_75, title: x}}\n")
    monkeypatch.setenv(CURATION_DIR_VARIABLE, str(folder))
    curated, _, _ = _harness_outcomes(_kernelbench(new, "AMD Instinct MI300X"))
    assert "labels" not in _by_kind(curated)["BenchmarkRun"]["metadata"]
    assert _by_kind(curated)["ExecutionEnvironment"]["spec"]["hardware"]["architecture"] == "sm_75"


def test_one_gpu_name_is_one_environment_in_every_source() -> None:
    """A GPU the curation lacks is the same hardware whichever source saw it (gaps.py)."""
    from pipelines.sources.liger.model import Normalizer

    name = "NVIDIA GeForce RTX 2080 Ti"
    (harness, _) = _harness_outcomes(_kernelbench(name))
    liger = Normalizer().environment(name).manifest
    assert (
        liger["spec"]["hardware"] == _by_kind(harness)["ExecutionEnvironment"]["spec"]["hardware"]
    )
    assert liger["metadata"]["labels"] == {"curation": "uncurated", "uncurated": "gpu"}


def test_the_curated_gpus_are_named_as_their_vendors_name_them() -> None:
    """Each entry's product and architecture fit its vendor: sm_XY for NVIDIA, gfxNNN for AMD."""
    gpus = load().gpus
    for entry in gpus.values():
        vendor, architecture = entry.hardware["vendor"], entry.hardware["architecture"]
        assert vendor in ("nvidia", "amd")
        assert re.fullmatch(
            r"sm_\d{2,3}" if vendor == "nvidia" else r"gfx9[0-9a-f]{2}", architecture
        )
    assert gpus["AMD Instinct MI355X"].hardware["architecture"] == "gfx950"
    assert gpus["NVIDIA A100 80GB PCIe"].hardware["architecture"] == "sm_80"

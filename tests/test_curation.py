"""The curation files load alike through libyaml's parser (the one kindex uses) and ruamel's pure
Python parser: the fast path changes no kernel, provider, GPU or protocol."""

from __future__ import annotations

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

"""The curation files load alike through libyaml's parser (the one kindex uses) and ruamel's pure
Python parser: the fast path changes no kernel, provider, GPU or protocol."""

from __future__ import annotations

import pytest
from ruamel.yaml import YAML

from pipelines.curation import CURATION_FILES, _load_yaml, _read_files, curation_dir


@pytest.mark.parametrize("name", CURATION_FILES)
def test_c_parser_reads_the_files_as_the_pure_parser(name: str) -> None:
    files = dict(_read_files(curation_dir()))
    assert YAML(typ="safe").Parser.__module__.startswith("ruamel.yaml.clib")  # C parser present
    assert _load_yaml(files, name) == _load_yaml(files, name, pure=True)

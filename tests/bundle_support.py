"""Worker bundles for the index tests: the example fixture, variants of it, and hostile texts."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from pipelines.sources.bundles.reader import DEFAULT_MAX_BYTES, read_documents

DATA = Path(__file__).parent / "data" / "kernelindex"
FIXTURE = DATA / "submissions" / "example-fixture.yaml"
MISSING_DIGEST = "sha256:" + "0" * 64


def fixture() -> dict[str, Any]:
    """The example fixture bundle as a mapping (a fresh copy each call)."""
    return read_documents(FIXTURE.read_bytes()).documents[0].value


def yaml_bytes(value: Any) -> bytes:
    stream = io.StringIO()
    YAML(typ="safe", pure=True).dump(value, stream)
    return stream.getvalue().encode()


def json_bytes(value: Any) -> bytes:
    return json.dumps(value, indent=1).encode()


def ten_run_bundle() -> dict[str, Any]:
    """The fixture's run ten times (distinct medians); run 3 names a workload nobody holds and
    run 7 has a field the schema does not know."""
    bundle = fixture()
    template = bundle["runs"][0]
    runs = []
    for index in range(10):
        item = copy.deepcopy(template)
        item["run"]["metadata"]["name"] = f"run-{index}"
        item["run"]["spec"]["timing"]["latencyNs"]["median"] = 8000 + index
        runs.append(item)
    runs[3]["run"]["spec"]["workloadDigest"] = MISSING_DIGEST
    runs[7]["run"]["spec"]["speedup"] = 2
    bundle["runs"] = runs
    return bundle


def billion_laughs(levels: int = 10) -> bytes:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(1, levels):
        refs = ", ".join([f"*a{level - 1}"] * 10)
        lines.append(f"a{level}: &a{level} [{refs}]")
    return ("\n".join(lines) + "\n").encode()


def ten_thousand_deep() -> bytes:
    """A JSON bundle (it claims to be one: a list of runs) nested 10,000 deep."""
    return b'{"runs": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"


def over_size() -> bytes:
    """A YAML bundle one byte over the reader's limit (mostly a comment)."""
    head = b"runs: []\n# "
    return head + b"x" * (DEFAULT_MAX_BYTES + 1 - len(head))

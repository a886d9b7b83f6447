"""The safe reader: YAML 1.2 core values, strictness, and bounds on hostile documents."""

from __future__ import annotations

import resource
import tracemalloc

import pytest

from pipelines.records.rules import Reason
from pipelines.sources.bundles.normalize import normalize_bundle_bytes
from pipelines.sources.bundles.reader import ReadError, ReadLimits, read_documents


def one(text: str | bytes):
    result = read_documents(text)
    assert len(result.documents) == 1
    return result.documents[0]


def test_yaml_12_core_values_keep_timestamps_as_strings() -> None:
    doc = one(
        "a: 2026-08-01T12:00:00Z\nb: yes\nc: 0x10\nd: 1.0\ne: ~\nf: !!str 1\ng: '1'\n"
        "h: 0o17\ni: 1e3\nj: true\n"
    )
    assert doc.value == {
        "a": "2026-08-01T12:00:00Z",
        "b": "yes",
        "c": 16,
        "d": 1.0,
        "e": None,
        "f": "1",
        "g": "1",
        "h": 15,
        "i": 1000.0,
        "j": True,
    }
    assert not doc.defects


def test_duplicate_yaml_key_is_a_defect_with_pointer_and_line() -> None:
    doc = one("spec:\n  name: First\n  name: Second\n")
    assert doc.value == {"spec": {"name": "First"}}
    [defect] = doc.defects
    assert (defect.reason, defect.pointer, defect.line) == (Reason.DUPLICATE_KEY, "/spec/name", 3)


def test_duplicate_json_key_is_a_defect_with_pointer() -> None:
    result = read_documents('{\n "a": 1,\n "b": [0, {"d": 1, "d": 2}]\n}')
    assert result.format == "json"
    [defect] = result.documents[0].defects
    assert (defect.reason, defect.pointer, defect.line) == (Reason.DUPLICATE_KEY, "/b/1/d", 3)


def test_yaml_flow_mapping_that_is_not_json_reads_as_yaml() -> None:
    result = read_documents("{a: 1, b: [x, y]}")
    assert result.format == "yaml"
    assert result.documents[0].value == {"a": 1, "b": ["x", "y"]}


def test_custom_tags_and_non_string_keys_are_defects() -> None:
    doc = one("a: !!python/object:os.system x\nb: !foo [1]\n1: x\nc: !!binary aGk=\n")
    found = {(d.reason, d.pointer) for d in doc.defects}
    assert found == {
        (Reason.CUSTOM_TAG, "/a"),
        (Reason.CUSTOM_TAG, "/b"),
        (Reason.NON_STRING_KEY, "/1"),
        (Reason.CUSTOM_TAG, "/c"),
    }


def test_small_aliases_are_shared_values() -> None:
    doc = one("base: &p {x: 1}\nuse: *p\n")
    assert doc.value["use"] == {"x": 1}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a: [1, 2\n", Reason.YAML_SYNTAX),
        ('{"a": 1,, }', Reason.JSON_SYNTAX),
        ("a: *nowhere\n", Reason.YAML_SYNTAX),
        (b"a: \xff\xfe\n", Reason.ENCODING),
    ],
)
def test_unreadable_text_raises_a_reason(text: str | bytes, reason: str) -> None:
    with pytest.raises(ReadError) as caught:
        read_documents(text)
    assert caught.value.reason == reason


def billion_laughs(levels: int = 10) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(1, levels):
        refs = ", ".join([f"*a{level - 1}"] * 10)
        lines.append(f"a{level}: &a{level} [{refs}]")
    return "\n".join(lines) + "\n"


def deep_block_yaml(depth: int) -> str:
    return "".join(" " * i + "k:\n" for i in range(depth))


HOSTILE = {
    "billion_laughs": (billion_laughs(), Reason.TOO_MANY_ALIASES),
    "flow_10000_deep_yaml": ("a: " + "[" * 10_000 + "]" * 10_000, Reason.TOO_DEEP),
    "json_10000_deep": ("[" * 10_000 + "]" * 10_000, Reason.TOO_DEEP),
    "json_object_10000_deep": ('{"a":' * 10_000 + "1" + "}" * 10_000, Reason.TOO_DEEP),
    "block_2000_deep_yaml": (deep_block_yaml(2000), Reason.TOO_DEEP),
    "many_aliases": (
        "a: &a x\nb: [" + ", ".join(["*a"] * 20_001) + "]\n",
        Reason.TOO_MANY_ALIASES,
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_documents_are_refused_with_little_memory(name: str) -> None:
    text, reason = HOSTILE[name]
    tracemalloc.start()
    try:
        outcomes = list(normalize_bundle_bytes(text.encode()))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [(o.status, o.reason) for o in outcomes] == [("quarantined", reason)]
    # Memory bound, not a timing: refusing costs about as much as holding the text.
    assert peak < 10 * len(text) + 2_000_000, peak


def test_over_size_document_is_refused_before_parsing() -> None:
    limits = ReadLimits(max_bytes=1024)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ReadError) as caught:
        read_documents(b"a: " + b"x" * 2048, limits)
    assert caught.value.reason == Reason.TOO_LARGE
    big = b"k: " + b"x" * (16 * 1024 * 1024)
    [outcome] = normalize_bundle_bytes(big)
    assert outcome.reason == Reason.TOO_LARGE
    # No copy of the 16 MiB text was decoded or parsed (ru_maxrss is in KiB on Linux).
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 40 * 1024


def test_multi_document_stream_defects_are_prefixed_by_document() -> None:
    result = read_documents("a: 1\n---\nb: 1\nb: 2\n")
    assert [d.value for d in result.documents] == [{"a": 1}, {"b": 1}]
    assert [d.pointer for d in result.documents[1].defects] == ["/1/b"]

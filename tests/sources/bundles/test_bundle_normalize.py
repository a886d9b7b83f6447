"""Worker bundles: the fixture ingests, invalid examples are refused with their reason, partial
acceptance keeps the valid rest, authoring conveniences become canonical values."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from bundle_support import ten_run_bundle

from pipelines.records.canonical import manifest_digest
from pipelines.records.rules import Reason
from pipelines.sources import normalize_object
from pipelines.sources.bundles.canonicalize import AmbiguousDuration, canonicalize, duration_ns
from pipelines.sources.bundles.normalize import PARSER_VERSION, normalize_bundle_bytes
from pipelines.sources.bundles.reader import read_documents
from pipelines.sources.bundles.validate import check_manifest

DATA = Path(__file__).parents[2] / "data" / "kernelindex"
FIXTURE = DATA / "submissions" / "example-fixture.yaml"


def fixture() -> dict[str, Any]:
    return read_documents(FIXTURE.read_bytes()).documents[0].value


def as_json(bundle: dict[str, Any]) -> bytes:
    return json.dumps(bundle, indent=1).encode()


def test_fixture_ingests_and_its_digests_match_the_ones_it_names() -> None:
    outcomes = list(normalize_bundle_bytes(FIXTURE.read_bytes()))
    assert [(o.status, o.pointer) for o in outcomes] == [("ok", "/runs/0/run")]
    [outcome] = outcomes
    by_kind = {r.kind: r for r in outcome.records}
    assert outcome.records[0].kind == "BenchmarkRun"
    assert set(by_kind) == {
        "BenchmarkRun",
        "ImplementationRevision",
        "WorkloadCase",
        "BenchmarkProtocol",
        "ExecutionEnvironment",
        "OperationSpec",
        "SoftwareProject",
    }
    for record in outcome.records:
        assert record.digest == manifest_digest(record.manifest)
    bundle = fixture()
    run_spec = bundle["runs"][0]["run"]["spec"]
    assert by_kind["ImplementationRevision"].digest == run_spec["implementationDigest"]
    assert by_kind["WorkloadCase"].digest == run_spec["workloadDigest"]
    assert by_kind["BenchmarkProtocol"].digest == run_spec["protocolDigest"]
    assert by_kind["ExecutionEnvironment"].digest == run_spec["environmentDigest"]
    operation = by_kind["OperationSpec"].digest
    assert bundle["workloads"][0]["spec"]["operationSpecDigest"] == operation
    assert bundle["implementations"][0]["manifest"]["spec"]["operation"]["specDigest"] == operation
    # The run starts on the line of `runs[0].run` in the file.
    lines = FIXTURE.read_text().splitlines()
    assert lines[outcome.source_line - 1].strip() == "apiVersion: kernelindex.dev/v1alpha1"
    assert lines[outcome.source_line - 2].strip() == "- run:"


def test_fixture_run_facts_carry_what_csvs_do_not() -> None:
    [outcome] = normalize_bundle_bytes(FIXTURE.read_bytes())
    facts = outcome.facts
    assert facts is not None
    assert (facts.metric, facts.unit, facts.origin) == ("latency", "ns", "measured")
    assert (facts.kernel, facts.provider, facts.gpu, facts.architecture) == (
        "rmsnorm",
        "meridian-kernels",
        "NVIDIA B200 SXM",
        "sm_100",
    )
    assert (facts.dtype, facts.case_key, facts.median) == (
        "bf16",
        "tokens2048-hidden4096-bf16",
        8120,
    )
    assert facts.observed_at == "2026-08-01T12:00:00Z"
    extra = facts.extra
    assert extra["software"]["driver"] == "580.00"
    assert extra["software"]["cudaToolkit"] == "13.1"
    assert extra["software"]["framework"] == {"name": "pytorch", "version": "2.9"}
    assert extra["settings"] == {"clocksLocked": True, "persistenceMode": True}
    assert (extra["samples"], extra["p05"], extra["p95"], extra["mad"]) == (200, 8072, 8151, 24)
    assert (extra["ci95_low"], extra["ci95_high"]) == (8095, 8151)
    assert extra["correctness"]["matchedRatio"] == 1.0


def test_same_bundle_as_json_gives_the_same_records() -> None:
    yaml_outcomes = list(normalize_bundle_bytes(FIXTURE.read_bytes()))
    json_outcomes = list(normalize_bundle_bytes(as_json(fixture())))
    assert [r.digest for r in json_outcomes[0].records] == [
        r.digest for r in yaml_outcomes[0].records
    ]
    assert json_outcomes[0].source_line > 1


@pytest.mark.parametrize(
    ("name", "reason", "pointer"),
    [
        ("unknown-field.yaml", Reason.UNKNOWN_FIELD, "/spec/popularity"),
        ("duplicate-key.yaml", Reason.DUPLICATE_KEY, "/spec/name"),
        ("bad-digest.yaml", Reason.BAD_DIGEST, "/spec/operationSpecDigest"),
        ("ambiguous-duration.yaml", Reason.AMBIGUOUS_DURATION, "/spec/timing/latencyNs/median"),
    ],
)
def test_invalid_examples_are_rejected_with_their_reason(
    name: str, reason: str, pointer: str
) -> None:
    outcomes = list(normalize_bundle_bytes((DATA / "examples" / "invalid" / name).read_bytes()))
    assert [(o.status, o.reason, o.pointer) for o in outcomes] == [("quarantined", reason, pointer)]


@pytest.mark.parametrize("path", sorted((DATA / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_valid_examples_validate(path: Path) -> None:
    [document] = read_documents(path.read_bytes()).documents
    assert not document.defects
    checked = check_manifest(document.value)
    assert checked.valid, checked.detail
    assert checked.digest == manifest_digest(checked.manifest)


def test_example_implementation_digest_is_of_its_canonical_form() -> None:
    # The example run names the implementation by the digest of its *canonical* form: support.axes
    # sorted by code unit ("hidden == 4096" before "tokens >= 1"), not as authored.
    [implementation] = read_documents(
        (DATA / "examples" / "implementation-revision.yaml").read_bytes()
    ).documents
    [run] = read_documents((DATA / "examples" / "benchmark-run.yaml").read_bytes()).documents
    named = run.value["spec"]["implementationDigest"]
    assert manifest_digest(implementation.value) != named
    assert check_manifest(implementation.value).digest == named


def test_examples_as_one_stream_resolve_each_other() -> None:
    # The examples form a consistent set except the run, whose implementation has source and
    # build variants the fixture's does not: run and implementation agree on that digest.
    names = [
        "operation-spec",
        "workload-case",
        "implementation-revision",
        "benchmark-protocol",
        "execution-environment",
        "software-project",
        "benchmark-run",
    ]
    stream = b"---\n".join((DATA / "examples" / f"{n}.yaml").read_bytes() for n in names)
    outcomes = list(normalize_bundle_bytes(stream))
    assert all(o.status == "ok" for o in outcomes), [(o.pointer, o.detail) for o in outcomes]
    [run] = [o for o in outcomes if o.facts is not None]
    assert run.pointer == "/6"
    assert {r.kind for r in run.records} >= {
        "OperationSpec",
        "WorkloadCase",
        "ImplementationRevision",
    }
    # The project is not tied to the run by a digest: it comes as its own outcome.
    assert [o.records[0].kind for o in outcomes if o.facts is None] == ["SoftwareProject"]


@pytest.mark.parametrize("encode", [as_json, None], ids=["json", "yaml"])
def test_ten_runs_with_two_bad_ones_index_eight(encode: Any) -> None:
    bundle = ten_run_bundle()
    if encode is None:
        import io

        from ruamel.yaml import YAML

        stream = io.StringIO()
        YAML(typ="safe", pure=True).dump(bundle, stream)
        data = stream.getvalue().encode()
    else:
        data = encode(bundle)
    outcomes = list(normalize_bundle_bytes(data))
    ok = [o for o in outcomes if o.status == "ok"]
    bad = [o for o in outcomes if o.status == "quarantined"]
    assert len(ok) == 8 and all(o.facts is not None for o in ok)
    assert sorted((o.reason, o.pointer) for o in bad) == [
        (Reason.DANGLING_DIGEST, "/runs/3/run/spec/workloadDigest"),
        (Reason.UNKNOWN_FIELD, "/runs/7/run/spec/speedup"),
    ]
    assert all(o.raw for o in bad)
    # Deterministic: the same bytes give the same outcomes.
    again = list(normalize_bundle_bytes(data))
    assert [(o.status, [r.digest for r in o.records]) for o in again] == [
        (o.status, [r.digest for r in o.records]) for o in outcomes
    ]


def test_run_naming_a_digest_the_index_knows_is_ok() -> None:
    bundle = ten_run_bundle()
    missing = "sha256:" + "0" * 64
    known = {missing}
    outcomes = list(normalize_bundle_bytes(as_json(bundle), known_digest=known.__contains__))
    run3 = next(o for o in outcomes if o.pointer and o.pointer.startswith("/runs/3"))
    assert run3.status == "ok"
    assert "WorkloadCase" not in {r.kind for r in run3.records[1:]} or all(
        r.digest != missing for r in run3.records
    )


def test_invalid_workload_quarantines_itself_and_its_runs() -> None:
    bundle = fixture()
    bundle["workloads"][0]["metadata"]["color"] = "blue"  # metadata: the digest stays the same
    outcomes = list(normalize_bundle_bytes(as_json(bundle)))
    found = {(o.status, o.reason, o.pointer) for o in outcomes}
    assert ("quarantined", Reason.UNKNOWN_FIELD, "/workloads/0/metadata/color") in found
    assert ("quarantined", Reason.INVALID_DEPENDENCY, "/runs/0/run/spec/workloadDigest") in found
    assert not [o for o in outcomes if o.facts is not None]


def test_changed_spec_makes_the_named_digest_dangle() -> None:
    bundle = fixture()
    bundle["workloads"][0]["spec"]["axes"]["tokens"] = 4096
    outcomes = list(normalize_bundle_bytes(as_json(bundle)))
    assert [(o.reason, o.pointer) for o in outcomes if o.status != "ok"] == [
        (Reason.DANGLING_DIGEST, "/runs/0/run/spec/workloadDigest")
    ]


def test_bad_embedded_protocol_takes_its_run_with_it() -> None:
    bundle = fixture()
    bundle["runs"][0]["protocol"]["spec"]["measurement"]["warmupDuration"] = "8.12 us"
    [outcome] = [o for o in normalize_bundle_bytes(as_json(bundle)) if o.status == "quarantined"]
    assert outcome.reason == Reason.AMBIGUOUS_DURATION
    assert outcome.pointer == "/runs/0/protocol/spec/measurement/warmupDuration"


def test_duplicate_key_quarantines_only_its_manifest() -> None:
    text = FIXTURE.read_text().replace(
        "      name: Meridian Kernels\n", "      name: Meridian Kernels\n      name: Other\n", 1
    )
    outcomes = list(normalize_bundle_bytes(text.encode()))
    assert [(o.status, o.reason, o.pointer) for o in outcomes if o.status != "ok"] == [
        ("quarantined", Reason.DUPLICATE_KEY, "/projects/0/spec/name")
    ]
    assert any(o.facts is not None for o in outcomes)


def test_unknown_bundle_section_and_run_field_are_reported() -> None:
    bundle = fixture()
    bundle["extras"] = []
    bundle["runs"][0]["notes"] = "x"
    outcomes = list(normalize_bundle_bytes(as_json(bundle)))
    assert {(o.reason, o.pointer) for o in outcomes if o.status != "ok"} == {
        (Reason.UNKNOWN_FIELD, "/extras"),
        (Reason.UNKNOWN_FIELD, "/runs/0/notes"),
    }


def test_duplicate_run_in_one_bundle_is_quarantined() -> None:
    bundle = fixture()
    bundle["runs"].append(copy.deepcopy(bundle["runs"][0]))
    outcomes = list(normalize_bundle_bytes(as_json(bundle)))
    assert [(o.status, o.reason) for o in outcomes] == [("ok", None), ("quarantined", "duplicate")]


@pytest.mark.parametrize(
    ("value", "ns"),
    [
        ("8 us", 8000),
        ("8µs", 8000),
        ("8120 ns", 8120),
        ("1.5 ms", 1_500_000),
        ("2 s", 2 * 10**9),
        (8120, 8120),
        (8120.0, 8120),
        ("0.5 us", 500),
    ],
)
def test_durations_become_integer_nanoseconds(value: Any, ns: int) -> None:
    assert duration_ns(value) == ns


@pytest.mark.parametrize(
    "value", ["8.12 us", "0.0000005 ms", "0.1 ns", 8120.5, "9007199254740993 ns"]
)
def test_ambiguous_durations_are_rejected(value: Any) -> None:
    with pytest.raises(AmbiguousDuration):
        duration_ns(value)


def test_authored_run_durations_hash_like_integers() -> None:
    run = fixture()["runs"][0]["run"]
    authored = copy.deepcopy(run)
    authored["spec"]["timing"]["latencyNs"] = {
        "median": "8.12 us",
        "p05": "8072 ns",
        "p95": 8151,
        "minimum": "8054ns",
        "maximum": "8390 ns",
        "mad": "24 ns",
        "confidence95": ["8095 ns", "8151 ns"],
    }
    checked = check_manifest(authored)
    assert checked.reason == Reason.AMBIGUOUS_DURATION
    authored["spec"]["timing"]["latencyNs"]["median"] = "8120 ns"
    checked = check_manifest(authored)
    assert checked.valid, checked.detail
    assert checked.digest == manifest_digest(run)


def test_set_like_lists_are_sorted_by_code_unit_and_deduplicated() -> None:
    implementation = fixture()["implementations"][0]["manifest"]
    authored = copy.deepcopy(implementation)
    support = authored["spec"]["support"]
    support["hardwareArchitectures"] = ["sm_90", "sm_100", "sm_90"]
    support["productsTested"] = ["\U0001f600 GPU", "\uff21 GPU", "NVIDIA B200 SXM"]
    canonical, problems = canonicalize(authored)
    assert not problems
    assert canonical["spec"]["support"]["hardwareArchitectures"] == ["sm_100", "sm_90"]
    # U+1F600 is a surrogate pair (D83D...) and sorts before U+FF21 by UTF-16 code unit.
    assert canonical["spec"]["support"]["productsTested"] == [
        "NVIDIA B200 SXM",
        "\U0001f600 GPU",
        "\uff21 GPU",
    ]
    assert authored["spec"]["support"]["hardwareArchitectures"] == ["sm_90", "sm_100", "sm_90"]
    assert canonical["spec"]["support"]["axes"] == ["hidden == 4096", "tokens >= 1"]
    # Order as authored does not change the identity.
    shuffled = copy.deepcopy(implementation)
    shuffled["spec"]["support"]["axes"].reverse()
    assert check_manifest(shuffled).digest == check_manifest(implementation).digest


def test_observed_at_with_an_offset_is_rejected_and_z_kept_as_written() -> None:
    run = fixture()["runs"][0]["run"]
    offset = copy.deepcopy(run)
    offset["spec"]["observedAt"] = "2026-08-01T14:00:00+02:00"
    assert check_manifest(offset).reason == Reason.BAD_TIMESTAMP
    millis = copy.deepcopy(run)
    millis["spec"]["observedAt"] = "2026-08-01T12:00:00.250Z"
    checked = check_manifest(millis)
    assert checked.valid and checked.manifest["spec"]["observedAt"] == "2026-08-01T12:00:00.250Z"


def test_wrong_kind_in_a_section_is_reported() -> None:
    bundle = fixture()
    bundle["operations"].append(copy.deepcopy(bundle["projects"][0]))
    outcomes = list(normalize_bundle_bytes(as_json(bundle)))
    assert {(o.reason, o.pointer) for o in outcomes if o.status != "ok"} == {
        (Reason.WRONG_SECTION, "/operations/1/kind")
    }


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", Reason.EMPTY),
        (b"just a string\n", Reason.NOT_A_BUNDLE),
        (b"- 1\n- 2\n", Reason.NOT_A_BUNDLE),
    ],
)
def test_content_that_is_not_a_bundle_is_quarantined(data: bytes, reason: str) -> None:
    assert [o.reason for o in normalize_bundle_bytes(data)] == [reason]


def test_sources_dispatch_bundles_by_content_not_name() -> None:
    result = normalize_object("incoming/results.dat", FIXTURE.read_bytes())
    assert (result.source, result.parser_version) == ("worker-bundle", PARSER_VERSION)
    assert [o.status for o in result.outcomes] == ["ok"]
    result = normalize_object("incoming/r", as_json(fixture()))
    assert result.source == "worker-bundle"
    csv = (Path(__file__).parents[2] / "data" / "liger").glob("*.csv")
    first = next(iter(csv), None)
    if first is not None:
        assert normalize_object("incoming/x.csv", first.read_bytes()[:20000]).source == "liger-csv"


def test_bundle_validate_command(capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines.cli import main

    assert main(["bundle", "validate", str(FIXTURE)]) == 0
    bad = DATA / "examples" / "invalid" / "unknown-field.yaml"
    assert main(["bundle", "validate", str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"{bad}:2: /spec/popularity: unknown_field:" in out

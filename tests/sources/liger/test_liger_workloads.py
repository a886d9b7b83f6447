"""The one workload builder (`Normalizer.workload`) over the shared CSV's configs and every
curated binding, mutated configs and odd x values: a schema-valid WorkloadCase whose digest is
its canonical identity's (curated, or uncurated: its parameters as they stand), or a
quarantine for a malformed row, never anything else. Digest-for-digest parity with KernelIndex's
importer is test_liger_parity.py's and test_liger_corpus.py's (beside this file)."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from typing import Any

from liger_support import LIGER_CSV

from pipelines.curation import Binding, Kernel
from pipelines.records.canonical import MAX_SAFE_INTEGER, canonical_json_reference, identity
from pipelines.records.canonical import digest_of_canonical as sha256_digest
from pipelines.records.manifests import schema_errors
from pipelines.sources.liger.model import Normalizer
from pipelines.sources.liger.rules import RowRejected

NORMALIZER = Normalizer()
CURATION = NORMALIZER.curation
Key = tuple[str, str, str, str]  # kernel_name, x_name, x_value, extra_benchmark_config_str

# x texts: plain sizes, forms the number grammar accepts, ones it rejects, and integers past
# 2**53 (which the generic path cannot canonicalize: the fast one must fail the same way).
X_TEXTS = [
    *("1", "2", "3", "7", "64", "1024", "4096", "131072"),
    *("4096.0", "8192.000", "1e3", "+5", " 12 ", ".5e1", "5.", "\u0663"),
    *("0", "0.0", "-3", "1.5", "abc", "", "nan", "inf", "1e400", "0x10", "1_000", "9" * 400),
    *(str(MAX_SAFE_INTEGER), str(MAX_SAFE_INTEGER + 1), str(MAX_SAFE_INTEGER + 2), str(10**20)),
]
FEW_X_TEXTS = ["1", "4096", "1e3", "1.5", "0", "abc", str(MAX_SAFE_INTEGER + 2)]

# Config values a mutation puts in place of (or beside) a key.
ODD_VALUES: list[Any] = [
    *(1e-06, 1e-5, 1e21, 0.1, 5e-324, 1.7976931348623157e308, 4096.0, -0.0, math.nan),
    *(2**53 - 1, 2**53 + 1, 2**64, -1, 0, 3, True, False, None),
    *("4096", "torch.float16", "bf16", "", [1], {"a": 1}, {"a": [1.5e-7, None]}),
]
DTYPES: list[Any] = [*CURATION.dtypes, "torch.int8", "float16", 16, None]


def csv_families() -> list[tuple[str, str, str]]:
    rows = csv.DictReader(io.StringIO(LIGER_CSV.read_text(encoding="utf-8")))
    keys = {(r["kernel_name"], r["x_name"], r["extra_benchmark_config_str"]) for r in rows}
    return sorted(k for k in keys if k[0] in CURATION.kernels)


CSV_FAMILIES = csv_families()
BINDINGS = [(k.name, x_name) for k in CURATION.kernels.values() for x_name in k.bindings]


def scalar_names(kernel: Kernel) -> set[str]:
    """The config keys the kernel's scalars read."""
    return set().union(*(e.names for e in kernel.scalars.values()))


def config_names(kernel: Kernel, binding: Binding) -> list[str]:
    """The config keys a binding's axes and the kernel's scalars read."""
    names = set().union(*(e.names for e in binding.axes.values()), scalar_names(kernel))
    return sorted(names - {"x"})


def assert_valid(key: Key) -> str:
    """The workload of a kernel, x and config: a schema-valid record whose digest is its
    canonical identity's, curated or uncurated; or a rejection for a malformed row. Returns
    what it was, for the sweeps to check what they covered."""
    try:
        workload = NORMALIZER.workload(*key)
    except RowRejected as rejected:
        assert rejected.reason in MALFORMED, (key, rejected.reason)
        return str(rejected.reason)
    manifest = workload.record.manifest
    # Many x texts and configs of a sweep make the same manifest: check each one once.
    as_text = json.dumps(manifest, sort_keys=True)
    if as_text not in SCHEMA_CHECKED:
        assert list(schema_errors(manifest)) == [], key
        SCHEMA_CHECKED.add(as_text)
    assert workload.record.digest == sha256_digest(canonical_json_reference(identity(manifest)))
    assert workload.uncurated == workload.case_key.startswith("uncurated-")
    return "uncurated" if workload.uncurated else "ok"


SCHEMA_CHECKED: set[str] = set()
MALFORMED = {"bad_number", "non_positive_value", "bad_config_json"}


def text(config: dict[str, Any]) -> str:
    return json.dumps(config)  # NaN and infinities print as JS literals: bad_config_json


def test_shared_configs_with_every_x() -> None:
    reasons = Counter(
        assert_valid((kernel, x_name, x_text, config))
        for kernel, x_name, config in CSV_FAMILIES
        for x_text in X_TEXTS
    )
    assert set(reasons) == {"ok", "uncurated", "bad_number", "non_positive_value"}


def test_mutated_shared_configs() -> None:
    """Each shared config with a key dropped, or a key's value (or a new key) odd."""
    reasons: Counter[str] = Counter()
    for kernel, x_name, config_text in CSV_FAMILIES:
        config = json.loads(config_text)
        mutations = [{k: v for k, v in config.items() if k != key} for key in config]
        mutations += [{**config, key: value} for key in [*config, "q"] for value in ODD_VALUES]
        for mutated in mutations:
            for x_text in ("4096", "0", "abc"):  # x texts are swept per binding below
                reasons[assert_valid((kernel, x_name, x_text, text(mutated)))] += 1
    assert set(reasons) == {
        "ok",
        "uncurated",
        "bad_number",
        "non_positive_value",
        "bad_config_json",
    }


def test_every_curated_binding() -> None:
    """Configs made for each binding (sizes 2, 3, 5, ...; scalars 1e-06) with each dtype."""
    for kernel_name, x_name in BINDINGS:
        kernel = CURATION.kernels[kernel_name]
        binding = kernel.bindings[x_name]
        base: dict[str, Any] = dict(binding.require)
        for size, name in zip(
            (2, 3, 5, 7, 11, 13, 17), config_names(kernel, binding), strict=False
        ):
            base[name] = 1e-06 if name in scalar_names(kernel) else size
        # Every x text with the binding's config as it stands; a few with each dtype.
        for dtype in ["absent", *DTYPES]:
            config = base if dtype == "absent" else {**base, "dtype": dtype}
            for x_text in X_TEXTS if dtype == "absent" else FEW_X_TEXTS:
                assert_valid((kernel_name, x_name, x_text, text(config)))
    assert assert_valid(("softmax", "not-a-binding", "4096", '{"M": 2}')) == "uncurated"


def test_uncurated_workloads_differ_by_every_parameter() -> None:
    """Two configs the curation does not know that differ in any parameter, even one the
    schema has no place for (a text, a float), are two workloads."""
    base = {"M": 2, "dtype": "torch.float16", "eps": 1e-6}
    keys = [
        ("softmax", "not-a-binding", "4096", text(config))
        for config in (base, {**base, "dtype": "bf16"}, {**base, "eps": 1e-5}, {**base, "M": 3})
    ]
    digests = {NORMALIZER.workload(*key).record.digest for key in keys}
    assert len(digests) == len(keys)

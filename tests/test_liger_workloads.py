"""Workloads built from a cached family (`Normalizer._workload`: config-only parts once, JSON
spliced around each x's axes and tensors) equal the generic build (`reference_workload`) exactly:
the records (digest, manifest dict and its key order, manifest JSON), case key, dtype and slugs,
or the same error (RowRejected reason and detail, whichever check wins first). Over the shared
CSV's configs and every curated binding, mutated configs, odd x values and edited curations."""

from __future__ import annotations

import copy
import csv
import dataclasses
import io
import json
import math
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from liger_support import LIGER_CSV

from pipelines.curation import Binding, Curation, Expression, Kernel
from pipelines.records.canonical import MAX_SAFE_INTEGER, canonical_json_reference, identity
from pipelines.records.canonical import digest_of_canonical as sha256_digest
from pipelines.sources.liger.normalize import Normalizer, RowRejected, Workload, json_string

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


def outcome(build: Callable[[], Workload]) -> tuple[Any, ...]:
    """Everything a build yields, or what it raised."""
    try:
        workload = build()
    except RowRejected as rejected:
        return ("rejected", rejected.reason, rejected.detail)
    except Exception as error:  # the generic path lets some errors through; so must the fast
        return ("error", type(error), str(error))
    record = workload.record
    return (
        "ok",
        workload.case_key,
        workload.dtype,
        workload.case_slug,
        workload.digest_json,
        record.kind,
        record.digest,
        record.manifest,
        orjson.dumps(record.manifest),  # unsorted: the dicts' key order, which json_bytes prints
        record.manifest_json,
        record.json_bytes,
    )


def assert_same(normalizer: Normalizer, key: Key) -> str:
    """The fast build equals the reference one; returns the outcome's reason (or error type),
    for the sweeps to check what they covered."""
    fast = outcome(partial(normalizer._workload, *key))
    assert fast == outcome(partial(normalizer.reference_workload, *key)), key
    if fast[0] == "rejected":
        return str(fast[1])
    if fast[0] == "error":
        return str(fast[1].__name__)
    workload = normalizer._workload(*key)
    manifest = workload.record.manifest
    assert workload.record.digest == sha256_digest(canonical_json_reference(identity(manifest)))
    assert (
        workload.record.manifest_json
        == orjson.dumps(manifest, option=orjson.OPT_SORT_KEYS).decode()
    )
    assert workload.digest_json == json_string(workload.record.digest)
    return "ok"


def text(config: dict[str, Any]) -> str:
    return json.dumps(config)  # NaN and infinities print as JS literals: bad_config_json


# --- the fast path is the one taken --------------------------------------------------------------
def test_every_shared_family_splices() -> None:
    """Otherwise the comparisons below would hold the generic path against itself."""
    for kernel, x_name, config in CSV_FAMILIES:
        family = NORMALIZER.family(kernel, x_name, config)
        assert family is not None and family.cases is not None, (kernel, x_name)
        assert family.workload("4096") is not None


# --- deterministic sweeps ------------------------------------------------------------------------
def test_shared_configs_with_every_x() -> None:
    reasons = Counter(
        assert_same(NORMALIZER, (kernel, x_name, x_text, config))
        for kernel, x_name, config in CSV_FAMILIES
        for x_text in X_TEXTS
    )
    # Sizes past 2**53 - 1 are rejected too, not raised (no other error escapes).
    assert set(reasons) == {"ok", "bad_number", "non_positive_value", "unknown_config_shape"}


def mutations(config: dict[str, Any], kernel: Kernel) -> list[dict[str, Any]]:
    """The config with one key replaced, removed or added, and with other dtypes."""
    keys = sorted({*config, *scalar_names(kernel), "dtype", "eps", "extra", "x"})
    mutated = [{**config, key: value} for key in keys for value in ODD_VALUES]
    mutated += [{k: v for k, v in config.items() if k != key} for key in config]
    mutated += [{**config, "dtype": dtype} for dtype in DTYPES]
    mutated += [{**config, "dtype": "torch.int8", "eps": "tiny"}, {**config, "nested": {"B": 2}}]
    return mutated


def test_mutated_shared_configs() -> None:
    reasons: Counter[str] = Counter()
    for kernel_name, x_name, config_text in CSV_FAMILIES:
        kernel = CURATION.kernels[kernel_name]
        for config in mutations(json.loads(config_text), kernel):
            for x_text in FEW_X_TEXTS:
                reasons[assert_same(NORMALIZER, (kernel_name, x_name, x_text, text(config)))] += 1
    assert set(reasons) == {
        "ok",
        "bad_config_json",
        "unknown_config_shape",
        "bad_number",
        "non_positive_value",
    }


@pytest.mark.parametrize(
    "config_text",
    ["", "{", "[]", "null", "4096", '"B"', '{"B": NaN}', '{"B": 1e999}', '{"B": 2, "B": 3.0}'],
)
def test_unusual_config_texts(config_text: str) -> None:
    for kernel, x_name in BINDINGS:
        for x_text in FEW_X_TEXTS:
            assert_same(NORMALIZER, (kernel, x_name, x_text, config_text))


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
        for dtype in [*DTYPES, "absent"]:
            config = base if dtype == "absent" else {**base, "dtype": dtype}
            for x_text in X_TEXTS:
                assert_same(NORMALIZER, (kernel_name, x_name, x_text, text(config)))
    assert_same(NORMALIZER, ("softmax", "not-a-binding", "4096", '{"M": 2}'))


def test_error_order_when_several_apply() -> None:
    """A bad x wins over bad scalars, which win over a bad dtype; those over derived axes."""
    layer_norm = '{"M": 8, "eps": "tiny", "dtype": "torch.int8"}'
    cases = [
        (("layer_norm", "N", "0", layer_norm), "x_value must be positive"),
        (("layer_norm", "N", "8", layer_norm), "scalar eps"),
        (("layer_norm", "N", "8", '{"M": 8, "eps": 1e-06, "dtype": "i8"}'), "unknown dtype"),
        (("softmax", "N", "abc", '{"M": 0, "dtype": "torch.int8"}'), "x_value is not a number"),
        (("softmax", "N", "8", '{"M": 0, "dtype": "torch.int8"}'), "axis rows"),
        # head_dim = hidden // q_heads = 0: a derived axis fails last
        (
            (
                "rope",
                "H",
                "8",
                '{"seq_len": 4, "num_q_heads": 16, "num_kv_heads": 2, "dtype": "torch.float32"}',
            ),
            "axis head_dim",
        ),
    ]
    for key, detail in cases:
        fast = outcome(partial(NORMALIZER._workload, *key))
        assert fast == outcome(partial(NORMALIZER.reference_workload, *key))
        assert fast[0] == "rejected" and detail in fast[2], fast


# --- generated workloads -------------------------------------------------------------------------
# Mostly plain values, so that most workloads build; the odd ones a quarter of the time.
rarely = st.sampled_from([False, False, False, True])
sizes = st.integers(min_value=1, max_value=2**17)
odd_sizes = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**53 - 1, 2**53, 2**26, 2**27, 4096.0, 0, -1]),
)
scalar_values = st.one_of(
    st.floats(min_value=1e-9, max_value=1e-4),
    st.floats(min_value=1e-9, max_value=1e-4),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e-06, 1e21, 0.5, 0.1, 2**53, 2**53 + 1, True, "0.1"]),
)
odd_values = st.one_of(st.sampled_from(ODD_VALUES), odd_sizes, st.floats(), st.text(max_size=3))
plain_x = st.integers(min_value=1, max_value=2**20).map(str)
x_texts = st.one_of(
    *[plain_x] * 6,
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(min_value=0, max_value=1e20).map(repr),
    st.sampled_from(X_TEXTS),
    st.text(alphabet="0123456789.e+- ", max_size=6),
)


@st.composite
def workload_keys(draw: st.DrawFn) -> tuple[str, str, str, list[str]]:
    """A curated binding, a config made for it then (sometimes) mutated, and some x texts."""
    kernel_name, x_name = draw(st.sampled_from(BINDINGS))
    kernel = CURATION.kernels[kernel_name]
    binding = kernel.bindings[x_name]
    config: dict[str, Any] = dict(binding.require)
    names = config_names(kernel, binding)
    for name in names:
        config[name] = draw(scalar_values if name in scalar_names(kernel) else sizes)
    if names and draw(rarely):
        config[draw(st.sampled_from(names))] = draw(odd_sizes)
    for name in sorted(binding.ignore):
        if draw(st.booleans()):
            config[name] = draw(odd_values)
    if not draw(rarely):
        config["dtype"] = draw(st.sampled_from(sorted(CURATION.dtypes)))
    elif draw(st.booleans()):
        config["dtype"] = draw(st.sampled_from(DTYPES))
    if draw(rarely):
        config.pop(draw(st.sampled_from(sorted(config) or ["dtype"])), None)
    if draw(rarely):
        extra_keys = st.sampled_from(sorted({*config, "dtype", "eps", "extra", "x"}))
        config.update(draw(st.dictionaries(extra_keys, odd_values, min_size=1, max_size=2)))
    xs = draw(st.lists(x_texts, min_size=1, max_size=4))
    return kernel_name, x_name, text(config), xs


@settings(max_examples=1500, deadline=None)
@given(workload_keys())
def test_generated_workloads(drawn: tuple[str, str, str, list[str]]) -> None:
    kernel, x_name, config_text, xs = drawn
    for x_text in xs:  # several x of one family: its cached parts serve them all
        assert_same(NORMALIZER, (kernel, x_name, x_text, config_text))


# --- curations at the edges of what the splice may print ----------------------------------------
CurationEdit = Callable[[Curation], Curation]


def kernel_edit(edit: Callable[[Kernel], Kernel]) -> CurationEdit:
    """An edit of layer_norm (binding N: rows = M, hidden = x; scalar eps)."""

    def apply(curation: Curation) -> Curation:
        kernel = curation.kernels["layer_norm"]
        fresh = dataclasses.replace(kernel, operation=copy.deepcopy(kernel.operation))
        return dataclasses.replace(curation, kernels={**curation.kernels, kernel.name: edit(fresh)})

    return apply


def binding_axes(**expressions: str) -> CurationEdit:
    def edit(kernel: Kernel) -> Kernel:
        binding = kernel.bindings["N"]
        axes = {**binding.axes, **{a: Expression.parse(e) for a, e in expressions.items()}}
        return dataclasses.replace(kernel, bindings={"N": dataclasses.replace(binding, axes=axes)})

    return kernel_edit(edit)


def renamed_axis(name: str) -> CurationEdit:
    def edit(kernel: Kernel) -> Kernel:
        binding = kernel.bindings["N"]
        axes = {name if a == "rows" else a: e for a, e in binding.axes.items()}
        for entry in kernel.operation["spec"]["inputs"]:
            shape = entry["tensor"]["shape"]
            shape[:] = [name if dim == "rows" else dim for dim in shape]
        return dataclasses.replace(kernel, bindings={"N": dataclasses.replace(binding, axes=axes)})

    return kernel_edit(edit)


def literal_dims(*dims: Any) -> CurationEdit:
    def edit(kernel: Kernel) -> Kernel:
        kernel.operation["spec"]["inputs"][0]["tensor"]["shape"].extend(dims)
        return kernel

    return kernel_edit(edit)


def tensor_dtype(dtype: Any) -> CurationEdit:
    def edit(kernel: Kernel) -> Kernel:
        kernel.operation["spec"]["inputs"][0]["tensor"]["dtype"] = dtype
        return kernel

    return kernel_edit(edit)


def scalars(**expressions: str) -> CurationEdit:
    def edit(kernel: Kernel) -> Kernel:
        parsed = {name: Expression.parse(e) for name, e in expressions.items()}
        return dataclasses.replace(kernel, scalars=parsed)

    return kernel_edit(edit)


def derived_axes(**expressions: str) -> CurationEdit:
    def edit(kernel: Kernel) -> Kernel:
        parsed = {name: Expression.parse(e) for name, e in expressions.items()}
        return dataclasses.replace(kernel, derived_axes=parsed)

    return kernel_edit(edit)


def dtypes(fp16: str, default: str | None = None) -> CurationEdit:
    def apply(curation: Curation) -> Curation:
        edited = kernel_edit(lambda k: dataclasses.replace(k, default_dtype=default))(curation)
        return dataclasses.replace(edited, dtypes={**curation.dtypes, "torch.float16": fp16})

    return apply


@pytest.mark.parametrize(
    ("edit", "splices"),
    [
        (renamed_axis("r\u00f6ws"), False),
        # RFC 8785 sorts keys by UTF-16 code units (a surrogate pair before U+E000); orjson not
        (lambda c: binding_axes(**{"\ue000": "M"})(renamed_axis("\U0001f600")(c)), False),
        (renamed_axis("-Odd_ %d axis-"), True),  # slug's stripped ends, %-format escapes
        (binding_axes(**{"%s": "M", "Z_": "x + M"}), True),
        (binding_axes(hidden="x // 0"), True),  # ZeroDivisionError escapes, in order
        (binding_axes(hidden="x * M * M * M"), True),  # past 2**53 for some x
        (binding_axes(rows="M // 0"), False),  # a config-only axis fails: the generic path
        (binding_axes(rows="M * 0"), False),
        (derived_axes(half="hidden // 2"), True),
        (derived_axes(none="hidden // 0"), True),
        # With M = 10**2500, rows has too many digits to print: the generic path fails on the
        # case key before it reaches the derived axis.
        (lambda c: derived_axes(none="hidden // 0")(binding_axes(rows="M * M")(c)), True),
        (literal_dims(MAX_SAFE_INTEGER, True, -1), True),
        (literal_dims("nope"), True),  # KeyError on lookup, as in the generic path
        (literal_dims(2.0), True),
        (tensor_dtype("fl\u00f6at"), False),
        (tensor_dtype(16), False),
        (scalars(eps="eps", big="M + 9007199254740992"), False),  # no RFC 8785 form
        (scalars(eps="eps", bad="M // 0"), False),
        (scalars(eps="M * eps", beta="2", gamma="0.000001"), True),
        (dtypes("-FP%16_"), True),
        (dtypes("fp16\u00e9", default="fp32"), False),
    ],
)
def test_edited_curations(edit: CurationEdit, splices: bool) -> None:
    normalizer = Normalizer(edit(CURATION))
    configs = [
        '{"M": 3, "eps": 0.5, "dtype": "torch.float16"}',
        '{"M": 4096, "eps": 1e-06, "dtype": "torch.bfloat16"}',
        '{"M": 4096, "eps": 1e-06}',
        '{"M": 1%s, "eps": 1e-06, "dtype": "torch.float16"}' % ("0" * 2500),
    ]
    family = normalizer.family("layer_norm", "N", configs[0])
    assert (family is not None and family.cases is not None) == splices
    for config in configs:
        for x_text in X_TEXTS:
            assert_same(normalizer, ("layer_norm", "N", x_text, config))

"""What a source does with a name the curation does not know: the one policy, stated once.

A GPU, provider, kernel, pass, metric or config shape the curation lacks is a curation gap, not
a data error: the record becomes an uncurated run, named as the file named it, never a
quarantine row (quarantine holds malformed records only). Every source that reads names
against the curation applies this module: the Liger CSV (pipelines/sources/liger/, its
column-wise path included) and the harness formats (pipelines/sources/measured.py, where only
the GPU is curated: a harness names its own operations and implementations). A GPU-worker
bundle states its own manifests, hardware included, and is read as authored: nothing in it is
looked up, so nothing is a gap. A run with a gap carries the labels `curation: uncurated` and
`uncurated: <the gaps>`; the manifest that stands in for the missing curation carries them
too. Since the curation's fingerprint is part of a source's parser version, a backfill after
the curation grows rebuilds such a run in its curated form.

Nothing is guessed for a gap: an uncurated GPU keeps its name as the product and says
`unspecified` where the curation would have said the vendor and architecture (the
architecture a harness reports is kept); an uncurated workload's axes are its parameters as they
stand (the swept value and each integer config key), with its other settings in its case key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from pipelines.curation import Curation
from pipelines.records.rules import NAME_LIMIT, UNSPECIFIED, is_safe_integer
from pipelines.records.rules import key_of as axis_name

CURATION_LABEL = "curation"  # metadata.labels key: "uncurated" on every run with a gap
UNCURATED = "uncurated"  # its value; also the key that lists the gaps ("gpu,provider")


class Gap(StrEnum):
    """What the curation may lack for a record, in the order a record names them."""

    KERNEL = "kernel"
    PROVIDER = "provider"
    MODE = "mode"
    GPU = "gpu"
    METRIC = "metric"
    CONFIG = "config"  # a config shape (x and config) no binding describes


GAP_ORDER = tuple(Gap)


def gap_labels(gaps: Iterable[Gap]) -> dict[str, str]:
    """The labels of a record with these gaps: none without any."""
    found = set(gaps)
    if not found:
        return {}
    listed = ",".join(g.value for g in GAP_ORDER if g in found)
    return {CURATION_LABEL: UNCURATED, UNCURATED: listed}


# --- GPUs ------------------------------------------------------------------------------------
def gpu_hardware(
    curation: Curation, name: str, architecture: str | None = None
) -> tuple[dict[str, Any], bool]:
    """The hardware a GPU name stands for and whether the curation knows it (gpus.yaml, the one
    vocabulary: a name it knows gets its curated hardware whichever source saw it). An uncurated
    name is its own product; the vendor is unspecified and the architecture is the one the
    source reported, if any."""
    gpu = curation.gpus.get(name.strip())
    if gpu is not None:
        return dict(gpu.hardware), True
    hardware = {
        "vendor": UNSPECIFIED,
        "product": name.strip()[:NAME_LIMIT] or UNSPECIFIED,
        "architecture": architecture or UNSPECIFIED,
    }
    return hardware, False


# --- uncurated workloads ---------------------------------------------------------------------
def _is_size(value: Any) -> bool:
    return is_safe_integer(value)


def _setting_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


class UncuratedCase:
    """A workload no curated binding describes, from its parameters as the file wrote them
    ({name: value}: the swept value under its x_name, the config's keys): each integer one an
    axis, each other one a setting. The case key writes them all out; where two names would
    give one axis, or the key would be too long to read, a digest of the exact parameters keeps
    two cases apart."""

    KEY_LIMIT = 160

    def __init__(self, parameters: Mapping[str, Any], exact: Any = None) -> None:
        """`exact`: what the file wrote, where `parameters` lost some of it (a config key
        named like the x value's axis): the case's digest and description are of that."""
        self.parameters = dict(parameters)
        axes: dict[str, int] = {}
        settings: dict[str, str] = {}
        clash = False
        for name, value in sorted(self.parameters.items()):
            key = axis_name(name)
            clash |= key in axes or key in settings
            if _is_size(value):
                axes[key] = value
            else:
                settings[key] = _setting_text(value)
        self.axes = dict(sorted(axes.items()))
        self.settings = dict(sorted(settings.items()))
        clash |= exact is not None
        written = json.dumps(
            self.parameters if exact is None else exact, sort_keys=True, ensure_ascii=False
        )
        self.description = written[:2000]
        self.digest = hashlib.sha256(written.encode()).hexdigest()[:12]
        readable = "-".join(
            [f"{k}{v}" for k, v in self.axes.items()]
            + [f"{k}={v}" for k, v in self.settings.items()]
        )
        if clash or len(readable) > self.KEY_LIMIT or len(written) > 2000:
            readable = f"{readable[: self.KEY_LIMIT]}-{self.digest}".lstrip("-")
        self.case_key = f"{UNCURATED}-{readable}" if readable else UNCURATED

    def identity_axes(self) -> dict[str, int]:
        """The workload's axes: its sizes, and where it has settings (a dtype, a flag) or the
        sizes alone do not tell it apart, the settings' digest under `uncurated_settings`:
        a workload's identity holds integers only."""
        if not self.settings and not self.case_key.endswith(self.digest):
            return dict(self.axes)
        return {**self.axes, f"{UNCURATED}_settings": int(self.digest, 16)}

    @property
    def title(self) -> str:
        bound = ", ".join(
            [f"{k}={v}" for k, v in self.axes.items()]
            + [f"{k}={v}" for k, v in self.settings.items()]
        )
        return bound[:NAME_LIMIT]

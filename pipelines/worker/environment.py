"""The ExecutionEnvironment a worker runs in: GPU, driver, CUDA, framework and library versions.

Sources, in order: `nvidia-smi` (product, memory, count, driver, compute capability), torch when
importable (the same facts plus its CUDA build), installed distributions (torch, triton, ...).
Without a GPU the manifest still validates and says so: vendor `none`, a product naming the CPU,
and the label `accelerator: none`.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from pipelines import API_VERSION
from pipelines.records.rules import NAME_LIMIT, SHORT_LIMIT, slug

NVIDIA_SMI_QUERY = "name,memory.total,driver_version,compute_cap"
LIBRARIES = (
    "torch",
    "triton",
    "liger-kernel",
    "numpy",
    "transformers",
    "flash-attn",
    "cuda-python",
)
COMMAND_TIMEOUT_S = 10


@dataclass(frozen=True, slots=True)
class Gpu:
    product: str
    memory_bytes: int | None
    driver: str | None
    architecture: str | None  # sm_XY


def sm_architecture(compute_capability: str) -> str | None:
    """`9.0` -> `sm_90`, `10.0` -> `sm_100`."""
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", compute_capability)
    return f"sm_{match.group(1)}{match.group(2)}" if match else None


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Parse `nvidia-smi --query-gpu=<NVIDIA_SMI_QUERY> --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4 or not fields[0]:
            continue
        name, memory_mib, driver, capability = fields
        memory = (
            int(float(memory_mib) * 2**20) if re.fullmatch(r"\d+(\.\d+)?", memory_mib) else None
        )
        gpus.append(Gpu(name, memory, driver or None, sm_architecture(capability)))
    return gpus


def query_nvidia_smi() -> list[Gpu]:
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return []
    try:
        done = subprocess.run(
            [binary, f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_nvidia_smi(done.stdout) if done.returncode == 0 else []


def query_torch() -> tuple[list[Gpu], str | None]:
    """GPUs as torch sees them, and the CUDA version torch was built with."""
    try:
        import torch  # noqa: PLC0415  optional: a worker may have no torch
    except Exception:
        return [], None
    cuda = getattr(torch.version, "cuda", None)
    try:
        if not torch.cuda.is_available():
            return [], cuda
        gpus = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append(
                Gpu(props.name, int(props.total_memory), None, f"sm_{props.major}{props.minor}")
            )
        return gpus, cuda
    except Exception:
        return [], cuda


def library_versions() -> dict[str, str]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[re.sub(r"[^a-z0-9_]", "_", name.lower())] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def operating_system() -> str:
    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME") or platform.platform()
    except OSError:
        return platform.platform()


def cpu_description() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _slug(text: str) -> str:
    return (slug(text) or "unknown")[:SHORT_LIMIT]


def capture_environment(name: str | None = None) -> dict[str, Any]:
    """An ExecutionEnvironment manifest for the machine this runs on."""
    smi = query_nvidia_smi()
    torch_gpus, torch_cuda = query_torch()
    gpus = smi or torch_gpus
    libraries = library_versions()
    software: dict[str, Any] = {"operatingSystem": operating_system(), "kernel": platform.release()}
    labels = {}
    if gpus:
        first = gpus[0]
        architecture = first.architecture or (torch_gpus[0].architecture if torch_gpus else None)
        hardware: dict[str, Any] = {
            "vendor": "nvidia",
            "product": first.product,
            "architecture": architecture or "unknown",
            "count": sum(1 for gpu in gpus if gpu.product == first.product),
        }
        if first.memory_bytes:
            hardware["memoryBytes"] = first.memory_bytes
        if first.driver:
            software["driver"] = first.driver
    else:
        hardware = {
            "vendor": "none",
            "product": f"no GPU ({cpu_description()})"[:NAME_LIMIT],
            "architecture": _slug(platform.machine()).replace("-", "_") or "unknown",
        }
        labels["accelerator"] = "none"
    if torch_cuda:
        software["cudaToolkit"] = torch_cuda
    if "torch" in libraries:
        software["framework"] = {"name": "pytorch", "version": libraries.pop("torch")}
    if libraries:
        software["libraries"] = libraries
    metadata_: dict[str, Any] = {"name": name or _slug(f"worker-{hardware['product']}")}
    if labels:
        metadata_["labels"] = labels
    return {
        "apiVersion": API_VERSION,
        "kind": "ExecutionEnvironment",
        "metadata": metadata_,
        "spec": {"hardware": hardware, "software": software},
    }

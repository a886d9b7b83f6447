"""PyTorch OSS benchmark v3 records: not read yet."""

from __future__ import annotations

from collections.abc import Iterator

from pipelines.sources.measured import Entry
from pipelines.sources.source import HarnessSource, SourceContext


class PyTorchBenchmarkV3(HarnessSource):
    name = "pytorch-benchmark-v3"
    format_version = "kindex-pytorch-v3/1"

    def recognize(self, key: str, data: bytes) -> str | None:
        return "not PyTorch OSS benchmark v3 records"

    def entries(self, data: bytes, context: SourceContext) -> Iterator[Entry]:
        return iter(())

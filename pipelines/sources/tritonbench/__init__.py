"""TritonBench --output-json: not read yet."""

from __future__ import annotations

from collections.abc import Iterator

from pipelines.sources.measured import Entry
from pipelines.sources.source import HarnessSource, SourceContext


class TritonBenchJson(HarnessSource):
    name = "tritonbench-json"
    format_version = "kindex-tritonbench/1"

    def recognize(self, key: str, data: bytes) -> str | None:
        return "not TritonBench --output-json"

    def entries(self, data: bytes, context: SourceContext) -> Iterator[Entry]:
        return iter(())

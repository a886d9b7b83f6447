"""Google Benchmark JSON: not read yet."""

from __future__ import annotations

from collections.abc import Iterator

from pipelines.sources.measured import Entry
from pipelines.sources.source import HarnessSource, SourceContext


class GoogleBenchmarkJson(HarnessSource):
    name = "google-benchmark-json"
    format_version = "kindex-gbench/1"

    def recognize(self, key: str, data: bytes) -> str | None:
        return "not Google Benchmark JSON"

    def entries(self, data: bytes, context: SourceContext) -> Iterator[Entry]:
        return iter(())

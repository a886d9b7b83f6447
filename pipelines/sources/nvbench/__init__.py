"""nvbench JSON: not read yet."""

from __future__ import annotations

from collections.abc import Iterator

from pipelines.sources.measured import Entry
from pipelines.sources.source import HarnessSource, SourceContext


class NvbenchJson(HarnessSource):
    name = "nvbench-json"
    format_version = "kindex-nvbench/1"

    def recognize(self, key: str, data: bytes) -> str | None:
        return "not nvbench JSON"

    def entries(self, data: bytes, context: SourceContext) -> Iterator[Entry]:
        return iter(())

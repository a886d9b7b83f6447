"""FlashInfer-Trace (traces, definitions, solutions): not read yet."""

from __future__ import annotations

from collections.abc import Iterator

from pipelines.sources.measured import Entry
from pipelines.sources.source import HarnessSource, SourceContext


class FlashInferTrace(HarnessSource):
    name = "flashinfer-trace"
    format_version = "kindex-flashinfer/1"

    def recognize(self, key: str, data: bytes) -> str | None:
        return "not FlashInfer-Trace (traces, definitions, solutions)"

    def entries(self, data: bytes, context: SourceContext) -> Iterator[Entry]:
        return iter(())

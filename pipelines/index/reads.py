"""Object versions read: which key (and ETag, version) each snapshot was read as.

The same bytes dropped under two keys are one snapshot but two reads; retraction is judged per
key, so the index needs every read. Each read is a small JSON object beside the record set it was
processed into: `records/<parser_version>/<snapshot hex>/reads/<read id>.json`.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class ObjectRead:
    snapshot_digest: str
    bucket: str
    source_key: str
    etag: str
    version_id: str | None
    size: int
    last_modified: datetime  # the object version's LastModified (server clock)
    taken_at: datetime  # when kindex read it
    parser_version: str
    source: str
    processed_at: datetime | None = None  # when this parser version made the record set

    @property
    def read_id(self) -> str:
        text = "\x1f".join([self.bucket, self.source_key, self.etag, self.version_id or ""])
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def to_json(self) -> bytes:
        data = asdict(self) | {"read_id": self.read_id}
        return orjson.dumps(data, option=orjson.OPT_SORT_KEYS | orjson.OPT_UTC_Z)

    @classmethod
    def from_json(cls, data: bytes) -> ObjectRead:
        fields: dict[str, Any] = orjson.loads(data)
        fields.pop("read_id", None)
        for name in ("last_modified", "taken_at", "processed_at"):
            if fields.get(name) is not None:
                fields[name] = datetime.fromisoformat(fields[name])
        return cls(**fields)

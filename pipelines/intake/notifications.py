"""Placeholder of the change-notification interface (the feeds land on their own branch)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from pipelines.settings import Settings


@dataclass(frozen=True, slots=True)
class ObjectChange:
    key: str
    etag: str | None
    size: int | None
    last_modified: datetime | None
    deleted: bool


@dataclass(frozen=True, slots=True)
class ChangePage:
    changes: list[ObjectChange]
    cursor: str
    receipts: tuple[str, ...] = ()


class ChangeFeed(Protocol):
    name: str

    def poll(self, cursor: str | None, limit: int) -> ChangePage: ...

    def acknowledge(self, page: ChangePage) -> None: ...


def change_feed(settings: Settings) -> ChangeFeed | None:
    return None

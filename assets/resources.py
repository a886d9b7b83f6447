"""The one resource every kindex asset and sensor uses: settings and an object store."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

from dagster import ConfigurableResource

if TYPE_CHECKING:
    from pipelines.settings import Settings
    from pipelines.storage.base import ObjectStore


class KindexResource(ConfigurableResource):
    """Settings from the KINDEX_* environment and one S3 client per run, reused by every step
    (creating a boto3 session costs 100-580 ms)."""

    @cached_property
    def settings(self) -> Settings:
        from pipelines.settings import Settings

        return Settings.from_env()

    @cached_property
    def store(self) -> ObjectStore:
        from pipelines.storage.s3 import S3Store

        return S3Store.from_settings(self.settings)

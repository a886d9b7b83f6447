"""The one resource every kindex asset and sensor uses: settings and an object store."""

from __future__ import annotations

import os
from functools import cached_property
from typing import TYPE_CHECKING

from dagster import ConfigurableResource, EnvVar

from pipelines.intake.ledger import Ledger
from pipelines.intake.notifications import change_feed
from pipelines.settings import ENV_PREFIX, SETTING_NAMES, Settings
from pipelines.storage.s3 import S3Store

if TYPE_CHECKING:
    from pipelines.intake.notifications import ChangeFeed
    from pipelines.storage.base import ObjectStore


class KindexResource(ConfigurableResource["KindexResource"]):
    """Settings from the KINDEX_* environment and one S3 client per run, reused by every step
    (creating a boto3 session costs 100-580 ms). Each setting is a field, set from its
    variable with EnvVar (`from_env`), so the Dagster UI shows the configuration and which
    variable each value comes from; a field left unset keeps the setting's default."""

    home: str | None = None
    s3_endpoint: str | None = None
    bucket: str | None = None
    s3_region: str | None = None
    s3_path_style: str | None = None
    s3_port: str | None = None
    incoming_prefix: str | None = None
    snapshot_prefix: str | None = None
    records_prefix: str | None = None
    index_prefix: str | None = None
    catalog_uri: str | None = None
    index_retention_versions: str | None = None
    notifications: str | None = None
    sqs_queue_url: str | None = None

    @classmethod
    def from_env(cls) -> KindexResource:
        """Every setting whose KINDEX_* variable is set, as an EnvVar."""
        fields = {
            name.lower(): EnvVar(ENV_PREFIX + name)
            for name in SETTING_NAMES
            if os.environ.get(ENV_PREFIX + name, "").strip()
        }
        return cls(**fields)

    @cached_property
    def settings(self) -> Settings:
        given = {
            ENV_PREFIX + name: str(value)
            for name in SETTING_NAMES
            if (value := getattr(self, name.lower())) is not None
        }
        return Settings.from_env({**os.environ, **given})

    @cached_property
    def store(self) -> ObjectStore:
        return S3Store.from_settings(self.settings)

    @cached_property
    def ledger(self) -> Ledger:
        return Ledger.of(self.store, self.settings)

    @cached_property
    def feed(self) -> ChangeFeed | None:
        """The store's change notifications, where configured (KINDEX_NOTIFICATIONS)."""

        return change_feed(self.settings)

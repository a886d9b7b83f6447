"""What GPU workers import to record runs and upload result bundles (no Dagster, no numpy)."""

from pipelines.worker.bundle import BundleWriter, InvalidBundle, manifest, slug, utc_now
from pipelines.worker.environment import capture_environment
from pipelines.worker.stats import LatencySummary, summarize_ns

__all__ = [
    "BundleWriter",
    "InvalidBundle",
    "LatencySummary",
    "capture_environment",
    "manifest",
    "slug",
    "summarize_ns",
    "utc_now",
]

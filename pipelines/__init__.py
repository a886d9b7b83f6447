"""kindex pipelines: plain Python (no Dagster) that reads, snapshots, normalizes and indexes."""

API_VERSION = "kernelindex.dev/v1alpha1"

"""Object storage: one code path, S3 through boto3 (AWS S3, SeaweedFS, MinIO, R2)."""

from pipelines.storage.base import NoSuchKey, ObjectInfo, ObjectStore

__all__ = ["NoSuchKey", "ObjectInfo", "ObjectStore"]

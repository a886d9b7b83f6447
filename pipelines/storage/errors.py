"""Storage failures a person should see, with a message that says what to do."""

from __future__ import annotations


class StorageError(RuntimeError):
    """The object store failed in a way the caller should show to a person."""


class StorageUnreachable(StorageError):
    """Nothing answers at the S3 endpoint (server down, wrong URL, network)."""


class StorageAccessDenied(StorageError):
    """The S3 endpoint refused the credentials, or none were found."""


class EmbeddedS3Error(StorageError):
    """The embedded SeaweedFS could not be started or is in an unexpected state."""


class KeyRefused(StorageError):
    """The S3 endpoint (or the client, before sending) refused an object key: too long, or with
    characters or path segments the server does not accept."""

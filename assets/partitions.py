"""One dynamic partition per dropped object version, named `<object key>@<etag prefix>`."""

from dagster import DynamicPartitionsDefinition

INCOMING_FILES = DynamicPartitionsDefinition(name="incoming_files")

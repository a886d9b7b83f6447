"""`kindex backfill`: its GraphQL documents are valid against this Dagster's schema."""

from __future__ import annotations

import pytest
from graphql import parse, validate

from pipelines.commands import backfill


@pytest.mark.parametrize(
    "document",
    [
        backfill.PARTITIONS_QUERY,
        backfill.MATERIALIZATIONS_QUERY,
        backfill.LAUNCH_MUTATION,
        backfill.STATUS_QUERY,
    ],
)
def test_graphql_documents_validate_against_dagster_schema(document: str) -> None:
    from dagster_graphql.schema import create_schema

    errors = validate(create_schema().graphql_schema, parse(document))
    assert errors == []


def test_cli_registers_backfill_and_up() -> None:
    from pipelines.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["backfill", "incoming/*.csv", "--quarantined", "--wait"])
    assert (args.glob, args.quarantined, args.wait) == ("incoming/*.csv", True, True)
    assert parser.parse_args(["up", "--port", "3456"]).port == 3456

"""deploy/: what can be validated without a cluster."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from ruamel.yaml import YAML

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
PIPELINES = Path(__file__).resolve().parents[1] / "pipelines"

# ObjectStore methods (pipelines/storage/base.py) -> the IAM action each needs on S3.
ACTIONS_BY_METHOD = {
    "list": "s3:ListBucket",
    "get_bytes": "s3:GetObject",
    "get_object": "s3:GetObject",
    "head": "s3:GetObject",
    "put_bytes": "s3:PutObject",
    "put": "s3:PutObject",
    "delete": "s3:DeleteObject",
}


def load_yaml(path: Path) -> object:
    return YAML(typ="safe").load(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", ["dagster.yaml", "helm/values.yaml"])
def test_yaml_loads(name: str) -> None:
    assert isinstance(load_yaml(DEPLOY / name), dict)


def test_dagster_yaml_accepted_by_dagsters_instance_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    from dagster._config import process_config
    from dagster._core.instance.config import (
        dagster_instance_config,
        dagster_instance_config_schema,
    )

    for var in ("DAGSTER_PG_HOST", "DAGSTER_PG_DB", "DAGSTER_PG_USERNAME", "DAGSTER_PG_PASSWORD"):
        monkeypatch.setenv(var, "x")
    config = load_yaml(DEPLOY / "dagster.yaml")
    result = process_config(dagster_instance_config_schema(), config)
    assert result.success, [e.message for e in result.errors or []]
    dagster_instance_config(str(DEPLOY))  # checks beyond the schema (concurrency vs coordinator)
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"  # type: ignore[index]


def test_dagster_yaml_storage_class_resolves() -> None:
    """The `storage: postgres:` block names dagster-postgres, which must import and accept it."""
    from dagster_postgres import DagsterPostgresStorage  # noqa: F401  (a dev dependency)

    config = load_yaml(DEPLOY / "dagster.yaml")
    assert "postgres_db" in config["storage"]["postgres"]  # type: ignore[index]


def test_helm_values_use_the_k8s_run_launcher_and_external_postgres() -> None:
    values = load_yaml(DEPLOY / "helm" / "values.yaml")
    assert values["runLauncher"]["type"] == "K8sRunLauncher"  # type: ignore[index]
    assert values["postgresql"]["enabled"] is False  # type: ignore[index]
    deployment = values["dagster-user-deployments"]["deployments"][0]  # type: ignore[index]
    assert deployment["dagsterApiGrpcArgs"] == ["-m", "definitions"]


def store_methods_used() -> set[str]:
    """Every ObjectStore method called anywhere in pipelines/ and assets/ (outside storage)."""
    pattern = re.compile(r"\b(?:store|kindex\.store)\.(" + "|".join(ACTIONS_BY_METHOD) + r")\(")
    roots = [PIPELINES, PIPELINES.parent / "assets"]
    used: set[str] = set()
    for root in roots:
        for path in root.rglob("*.py"):
            if "storage" in path.parts:
                continue
            used |= set(pattern.findall(path.read_text(encoding="utf-8")))
    return used


def test_iam_policy_grants_exactly_the_actions_kindex_uses() -> None:
    policy = json.loads((DEPLOY / "iam-policy.json").read_text(encoding="utf-8"))
    assert policy["Version"] == "2012-10-17"
    granted = {a for s in policy["Statement"] for a in s["Action"]}
    assert all(s["Effect"] == "Allow" for s in policy["Statement"])
    assert not any("*" in a for a in granted), "no wildcard actions"
    # `kindex put` (a person's credentials) writes incoming/; the pipeline only reads it.
    used = {ACTIONS_BY_METHOD[m] for m in store_methods_used()} | {"s3:ListBucket"}
    assert granted == used
    for statement in policy["Statement"]:
        resources = statement["Resource"]
        for resource in [resources] if isinstance(resources, str) else resources:
            assert resource.startswith("arn:aws:s3:::kindex"), "only the kindex bucket"

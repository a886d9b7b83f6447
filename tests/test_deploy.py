"""deploy/: what can be validated without a cluster."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from pipelines.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
PIPELINES = ROOT / "pipelines"
KINDEX_NAME = re.compile(r"\bKINDEX_[A-Z0-9_]*[A-Z0-9]\b")
PG_VARIABLES = ("DAGSTER_PG_HOST", "DAGSTER_PG_DB", "DAGSTER_PG_USERNAME", "DAGSTER_PG_PASSWORD")

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

    for var in PG_VARIABLES:
        monkeypatch.setenv(var, "x")
    monkeypatch.setenv("DAGSTER_PG_PORT", "5432")
    config = load_yaml(DEPLOY / "dagster.yaml")
    assert isinstance(config, dict)
    result = process_config(dagster_instance_config_schema(), config)
    assert result.success, [e.message for e in result.errors or []]
    dagster_instance_config(str(DEPLOY))  # checks beyond the schema (concurrency vs coordinator)
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"


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
    assert all(s["Effect"] == "Allow" for s in policy["Statement"])
    # The SQS statement (the change feed's queue) is checked in tests/test_notifications.py.
    statements = [s for s in policy["Statement"] if s["Action"][0].startswith("s3:")]
    granted = {a for s in statements for a in s["Action"]}
    assert not any("*" in a for a in granted), "no wildcard actions"
    # `kindex put` (a person's credentials) writes incoming/; the pipeline only reads it.
    used = {ACTIONS_BY_METHOD[m] for m in store_methods_used()} | {"s3:ListBucket"}
    assert granted == used
    for statement in statements:
        resources = statement["Resource"]
        for resource in [resources] if isinstance(resources, str) else resources:
            assert resource.startswith("arn:aws:s3:::kindex"), "only the kindex bucket"


def test_postgres_scheme_names_a_driver_that_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLAlchemy >= 2.1 maps a bare "postgresql" URL to psycopg 3, which dagster-postgres does
    not install: the scheme must name the driver it does (psycopg2), here and in Helm."""
    from dagster_postgres.utils import get_conn_string
    from sqlalchemy.engine import make_url

    config = load_yaml(DEPLOY / "dagster.yaml")["storage"]["postgres"]["postgres_db"]  # type: ignore[index]
    helm = load_yaml(DEPLOY / "helm" / "values.yaml")["postgresql"]  # type: ignore[index]
    for scheme in (config["scheme"], helm["postgresqlScheme"]):
        url = get_conn_string(username="u", hostname="h", db_name="d", scheme=scheme)
        make_url(url).get_dialect().import_dbapi()  # ModuleNotFoundError without the driver


def names_in_deploy() -> dict[str, set[str]]:
    """Every KINDEX_* name written anywhere under deploy/, with the files naming it."""
    found: dict[str, set[str]] = {}
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file():
            for name in KINDEX_NAME.findall(path.read_text(encoding="utf-8")):
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


class RecordingEnviron(Mapping[str, str]):
    """An empty environment that remembers every name it was asked for."""

    def __init__(self) -> None:
        self.asked: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.asked.add(name)
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        self.asked.add(str(name))
        return False

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def names_the_code_reads() -> set[str]:
    """The KINDEX_* names kindex reads: those `Settings.from_env` asks the environment for,
    and every string literal that is exactly such a name in pipelines/, assets/ and
    definitions.py (a variable read outside the settings, like KINDEX_CURATION_DIR)."""
    environ = RecordingEnviron()
    Settings.from_env(environ)
    names = {name for name in environ.asked if KINDEX_NAME.fullmatch(name)}
    sources = [*PIPELINES.rglob("*.py"), *(ROOT / "assets").rglob("*.py"), ROOT / "definitions.py"]
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if KINDEX_NAME.fullmatch(node.value):
                names.add(node.value)
    return names


def test_the_settings_scan_finds_what_the_code_reads() -> None:
    read = names_the_code_reads()
    assert {"KINDEX_HOME", "KINDEX_BUCKET", "KINDEX_S3_ENDPOINT", "KINDEX_CURATION_DIR"} <= read
    assert "KINDEX_S3_BUCKET" not in read


def test_every_kindex_name_in_deploy_is_one_the_code_reads() -> None:
    named = names_in_deploy()
    assert {"KINDEX_BUCKET", "KINDEX_S3_ENDPOINT"} <= set(named)
    read = names_the_code_reads()  # once: it parses every source file
    unread = {name: sorted(files) for name, files in named.items() if name not in read}
    assert not unread, f"deploy/ sets names kindex never reads: {unread}"


def helm_kindex_environments() -> dict[str, dict[str, str]]:
    """The environment the Helm values give the code location and each run's pod."""
    values = load_yaml(DEPLOY / "helm" / "values.yaml")
    deployment = values["dagster-user-deployments"]["deployments"][0]  # type: ignore[index]
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]  # type: ignore[index]
    return {
        "code location": {item["name"]: str(item["value"]) for item in deployment["env"]},
        "run pods": dict(item.split("=", 1) for item in launcher["envVars"]),
    }


@pytest.mark.parametrize("where", ["code location", "run pods"])
def test_helm_values_reach_the_bucket_not_an_embedded_server(where: str) -> None:
    env = helm_kindex_environments()[where]
    settings = Settings.from_env(env)
    assert not settings.embedded, "without an endpoint kindex starts its own SeaweedFS"
    assert settings.endpoint_url.startswith("https://")
    policy = json.loads((DEPLOY / "iam-policy.json").read_text(encoding="utf-8"))
    resources = [s["Resource"] for s in policy["Statement"]]
    assert f"arn:aws:s3:::{settings.bucket}" in resources, "the bucket the IAM policy grants"


def test_the_inventory_configuration_its_bucket_policy_and_the_helm_value_agree() -> None:
    """S3 Inventory (deploy/s3-inventory.json) writes where the bucket policy lets it and where
    KINDEX_S3_INVENTORY tells the reconcile sensor to read: `<Prefix>/<bucket>/<Id>/`, in the
    bucket, whose reads the pipeline role has; it lists incoming/ with what a version needs."""
    inventory = json.loads((DEPLOY / "s3-inventory.json").read_text(encoding="utf-8"))
    policy = json.loads((DEPLOY / "inventory-bucket-policy.json").read_text(encoding="utf-8"))
    values = YAML(typ="safe").load((DEPLOY / "helm" / "values.yaml").read_text(encoding="utf-8"))
    destination = inventory["Destination"]["S3BucketDestination"]
    bucket = destination["Bucket"].removeprefix("arn:aws:s3:::")
    assert inventory["Filter"]["Prefix"] == "incoming/"
    assert {"Size", "LastModifiedDate", "ETag"} <= set(inventory["OptionalFields"])
    assert destination["Format"] in {"CSV", "Parquet"}
    [statement] = policy["Statement"]
    assert statement["Resource"] == f"arn:aws:s3:::{bucket}/{destination['Prefix']}/*"
    env = values["dagster-user-deployments"]["deployments"][0]["env"]
    [where] = [e["value"] for e in env if e["name"] == "KINDEX_S3_INVENTORY"]
    assert where == f"{destination['Prefix']}/{bucket}/{inventory['Id']}/"
    iam = json.loads((DEPLOY / "iam-policy.json").read_text(encoding="utf-8"))
    reads = [s for s in iam["Statement"] if s["Action"] == ["s3:GetObject"]]
    assert reads and all(s["Resource"] == f"arn:aws:s3:::{bucket}/*" for s in reads)

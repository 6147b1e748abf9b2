"""The deploy-time migration handler against a fresh database and moto's Secrets Manager."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator

import boto3
import psycopg
import pytest
from psycopg import sql

from lambda_writer.migrate import handler as migrate_handler
from lambda_writer.migrate.apply import load_migrations
from tests.conftest import ADMIN_URL


@pytest.fixture
def fresh_db_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An empty database (no migrations), DATABASE_URL pointing at it; dropped afterwards."""
    name = f"ckpt_mig_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(ADMIN_URL, dbname=name)
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.delenv("WRITER_PASSWORD_SECRET_ARN", raising=False)
    try:
        yield url
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def test_trigger_applies_pending_migrations_once(fresh_db_url: str) -> None:
    names = [m.name for m in load_migrations()]
    assert migrate_handler.handler({}, None) == {"applied": names}
    assert migrate_handler.handler({}, None) == {"applied": []}


def test_custom_resource_shape(fresh_db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    created = migrate_handler.handler({"RequestType": "Create", "ResponseURL": "x"}, None)
    assert created["PhysicalResourceId"] == migrate_handler.PHYSICAL_RESOURCE_ID
    assert created["applied"]
    updated = migrate_handler.handler(
        {"RequestType": "Update", "PhysicalResourceId": "ckpt-pipeline-schema"}, None
    )
    assert updated["applied"] == []
    # Delete touches nothing, not even the database.
    monkeypatch.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/none")
    deleted = migrate_handler.handler({"RequestType": "Delete", "PhysicalResourceId": "p"}, None)
    assert deleted == {"applied": [], "PhysicalResourceId": "p"}


def test_sets_the_writer_password_from_its_secret(
    fresh_db_url: str,
    moto_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    password = "it's a p@ss; DROP ROLE x; --"
    secrets = boto3.client("secretsmanager", region_name="us-east-1")
    arn = secrets.create_secret(
        Name=f"writer-{uuid.uuid4().hex[:8]}",
        SecretString=json.dumps({"username": "ckpt_writer", "password": password}),
    )["ARN"]
    monkeypatch.setenv("WRITER_PASSWORD_SECRET_ARN", arn)
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        row = admin.execute(
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'ckpt_writer'"
        ).fetchone()
    previous = row[0] if row else None
    try:
        with caplog.at_level("DEBUG"):
            assert migrate_handler.handler({"RequestType": "Create"}, None)["applied"]
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            row = admin.execute(
                "SELECT rolpassword FROM pg_authid WHERE rolname = 'ckpt_writer'"
            ).fetchone()
        assert row is not None and str(row[0]).startswith("SCRAM-SHA-256$")
        assert password not in caplog.text
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(
                sql.SQL("ALTER ROLE ckpt_writer PASSWORD {}").format(
                    sql.Literal(previous) if previous is not None else sql.SQL("NULL")
                )
            )


def test_sets_the_pruner_password_from_its_own_secret(
    fresh_db_url: str,
    moto_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN a stack with the scheduled prune: the pruner's secret beside the writer's
    secrets = boto3.client("secretsmanager", region_name="us-east-1")
    arns = {
        role: secrets.create_secret(
            Name=f"{role}-{uuid.uuid4().hex[:8]}",
            SecretString=json.dumps({"username": role, "password": f"pw of {role}"}),
        )["ARN"]
        for role in ("ckpt_writer", "ckpt_pruner")
    }
    monkeypatch.setenv("WRITER_PASSWORD_SECRET_ARN", arns["ckpt_writer"])
    monkeypatch.setenv("PRUNER_PASSWORD_SECRET_ARN", arns["ckpt_pruner"])

    def passwords() -> dict[str, object]:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            rows = admin.execute(
                "SELECT rolname, rolpassword FROM pg_authid"
                " WHERE rolname IN ('ckpt_writer', 'ckpt_pruner')"
            ).fetchall()
        return {str(name): value for name, value in rows}

    previous = passwords()
    try:
        # WHEN the migration runs THEN both roles get a SCRAM password, neither is logged
        with caplog.at_level("DEBUG"):
            migrate_handler.handler({"RequestType": "Create"}, None)
        now = passwords()
        assert all(str(now[role]).startswith("SCRAM-SHA-256$") for role in arns)
        assert "pw of" not in caplog.text
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            for role, value in previous.items():
                admin.execute(
                    sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                        sql.Identifier(role),
                        sql.Literal(value) if value is not None else sql.SQL("NULL"),
                    )
                )

"""Issue 12 §3: `migrate` as a role that lacks a privilege says which migration and which privilege.

Real roles and a real database on the PostgreSQL server; the console script as a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ADMIN_URL

pytestmark = pytest.mark.slow

CONSOLE_SCRIPT = Path(sys.executable).parent / "ckpt-pipeline"


def _migrate(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CONSOLE_SCRIPT), "migrate"],
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def unprivileged() -> Iterator[tuple[str, str, str]]:
    """A fresh database and a LOGIN role with no CREATE on its public schema (the PostgreSQL
    15 default for a role that does not own the database) and no CREATEROLE."""
    suffix = uuid.uuid4().hex[:8]
    database, role = f"ckpt_priv_{suffix}", f"ckpt_migrator_{suffix}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
        conn.execute(f'CREATE ROLE "{role}" LOGIN NOCREATEROLE')
    admin = psycopg.conninfo.make_conninfo(ADMIN_URL, dbname=database)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'REVOKE CREATE ON SCHEMA public FROM PUBLIC, "{role}"')
    try:
        yield admin, psycopg.conninfo.make_conninfo(admin, user=role), role
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
            conn.execute(f'DROP ROLE "{role}"')


def _tables(admin: str) -> list[str]:
    with psycopg.connect(admin) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
        ).fetchall()
    return [str(r[0]) for r in rows]


def test_migrate_names_the_migration_and_the_missing_privilege(
    unprivileged: tuple[str, str, str],
) -> None:
    admin, url, role = unprivileged
    # WHEN the role may not create in schema public
    result = _migrate(url)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "ckpt-pipeline migrate: schema_migrations (the migrations' own table):"
        f" permission denied for schema public: role {role} lacks CREATE on schema public"
    ]
    assert _tables(admin) == []  # nothing applied

    # WHEN it may create there but not manage roles (0002 creates/alters the writer's role)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'GRANT CREATE ON SCHEMA public TO "{role}"')
    result = _migrate(url)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("ckpt-pipeline migrate: 0002_writer_role.sql: permission denied")
    assert line.endswith(f"role {role} lacks CREATEROLE")
    assert _tables(admin) == []  # one transaction: 0001's tables are rolled back too

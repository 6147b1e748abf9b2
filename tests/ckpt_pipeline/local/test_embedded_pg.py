"""The default database: DATABASE_URL, a throwaway database on the local server, a cluster."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest

from ckpt_pipeline.local.embedded_pg import (
    create_login_role,
    database_url_or_embedded,
    start_throwaway_cluster,
)
from ckpt_pipeline.settings import Settings
from lambda_writer.migrate.apply import apply_migrations
from lambda_writer.shared.connection import connect_url
from tests.conftest import ADMIN_URL


def test_the_demo_path_imports_neither_pytest_nor_pytest_postgresql() -> None:
    # The demo runs outside pytest: only the tests' databases come from pytest-postgresql.
    code = (
        "import sys, ckpt_pipeline.local.embedded_pg;"
        " print([m for m in ('pytest', 'pytest_postgresql') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_database_url_wins() -> None:
    with database_url_or_embedded(settings=Settings(database_url="postgresql://x@h/db")) as db:
        assert (db.url, db.kind) == ("postgresql://x@h/db", "env")


def test_local_server_gets_a_throwaway_database_dropped_afterwards() -> None:
    with database_url_or_embedded(settings=Settings(local_admin_url=ADMIN_URL)) as db:
        assert db.kind == "local-server"
        with connect_url(db.url) as conn:
            apply_migrations(conn)
            name = conn.execute("SELECT current_database()").fetchone()
    assert name is not None and str(name[0]).startswith("ckpt_demo_")
    with psycopg.connect(ADMIN_URL) as admin:
        gone = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name[0],))
        assert gone.fetchone() is None


@pytest.mark.slow
def test_unreachable_server_starts_a_throwaway_cluster() -> None:
    unreachable = "postgresql://postgres@127.0.0.1:1/postgres"
    with database_url_or_embedded(settings=Settings(local_admin_url=unreachable)) as db:
        assert db.kind == "throwaway" and db.admin_url is not None
        with connect_url(db.url) as conn:
            assert apply_migrations(conn)


@pytest.mark.slow
def test_capped_cluster_and_role_with_statement_timeout_as_the_compare_mode_needs() -> None:
    with start_throwaway_cluster(max_connections=30) as cluster:
        url = cluster.create_database("capped")
        with connect_url(url) as conn:
            apply_migrations(conn)
            assert conn.execute("SHOW max_connections").fetchone() == ("30",)
        role_url = create_login_role(cluster.admin_url, url, "seed_app", statement_timeout="5s")
        with psycopg.connect(role_url) as conn:
            assert conn.execute("SHOW statement_timeout").fetchone() == ("5s",)
            conn.execute("SELECT count(*) FROM training_checkpoints")
        held = [psycopg.connect(role_url) for _ in range(27)]  # 3 slots stay for superusers
        try:
            with pytest.raises(psycopg.OperationalError, match=r"too many clients|remaining"):
                psycopg.connect(role_url)
        finally:
            for conn in held:
                conn.close()
        data_dir = cluster.data_dir
    assert not data_dir.exists()

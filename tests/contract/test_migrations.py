"""Versioned migrations: idempotent, safe under concurrency, edits of applied files detected."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

from ckpt_pipeline.local.embedded_pg import throwaway_database
from lambda_writer.migrate.apply import apply_migrations, load_migrations
from lambda_writer.migrate.exceptions import MigrationError
from lambda_writer.shared.connection import connect_url
from tests.conftest import ADMIN_URL


@pytest.fixture
def empty_database() -> Iterator[str]:
    with throwaway_database(ADMIN_URL, prefix="ckpt_mig_") as url:
        yield url


def recorded_versions(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
    return [int(r[0]) for r in rows]


def test_migrations_are_numbered_and_ordered() -> None:
    versions = [m.version for m in load_migrations()]
    assert versions == sorted(versions)
    assert versions[:2] == [1, 2]


def test_migrate_twice_applies_once(empty_database: str) -> None:
    with connect_url(empty_database) as conn:
        first = apply_migrations(conn)
        second = apply_migrations(conn)
    assert first == [m.name for m in load_migrations()]
    assert second == []
    assert recorded_versions(empty_database) == [m.version for m in load_migrations()]


def test_concurrent_migrators_leave_one_schema(empty_database: str) -> None:
    # GIVEN four migrators released at once WHEN they race THEN exactly one applies each file
    barrier = threading.Barrier(4)
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def migrate() -> None:
        try:
            with connect_url(empty_database) as conn:
                barrier.wait()
                results.append(apply_migrations(conn))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=migrate) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    applied = sorted(name for names in results for name in names)
    assert applied == sorted(m.name for m in load_migrations())
    assert recorded_versions(empty_database) == [m.version for m in load_migrations()]


def test_a_migrator_of_another_database_changing_the_role_at_once_is_waited_out(
    database_url: str, empty_database: str
) -> None:
    # GIVEN another database's migrator holding an uncommitted change of ckpt_writer's settings
    # (roles are cluster-wide; the advisory lock is per database, so nothing queues the two)
    assert database_url  # the session database's migration created ckpt_writer
    outcome: list[object] = []
    with psycopg.connect(database_url) as other:
        other.execute("ALTER ROLE ckpt_writer SET statement_timeout = '10s'")

        def migrate() -> None:
            try:
                with connect_url(empty_database) as conn:
                    outcome.append(apply_migrations(conn))
            except BaseException as exc:  # reported by the assertion below
                outcome.append(exc)

        thread = threading.Thread(target=migrate)
        thread.start()
        # WHEN this database's migration is blocked on that role's row and the other commits
        with psycopg.connect(ADMIN_URL, autocommit=True) as watch:
            dbname = psycopg.conninfo.conninfo_to_dict(empty_database)["dbname"]
            while not watch.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = %s AND wait_event_type = 'Lock'",
                (dbname,),
            ).fetchone()[0]:  # type: ignore[index]
                thread.join(0.05)
                assert thread.is_alive(), outcome
        other.commit()
    thread.join()
    # THEN PostgreSQL failed it ("tuple concurrently updated") and it applied everything again
    assert outcome == [[m.name for m in load_migrations()]]
    assert recorded_versions(empty_database) == [m.version for m in load_migrations()]


def test_edited_applied_migration_is_refused(empty_database: str) -> None:
    with connect_url(empty_database) as conn:
        apply_migrations(conn)
        conn.execute("UPDATE schema_migrations SET checksum = 'edited' WHERE version = 1")
        conn.commit()
        with pytest.raises(MigrationError, match="different checksum"):
            apply_migrations(conn)


def test_latest_complete_view_picks_newest_complete_step(clean_db: str) -> None:
    with psycopg.connect(clean_db) as conn:
        conn.execute(
            """
            INSERT INTO training_checkpoints
                (job_id, step, epoch, run_attempt, world_size, shards_present, is_complete,
                 first_reported_at)
            VALUES ('j', 10, 1, 0, 2, 2, true, now()), ('j', 20, 2, 0, 2, 1, false, now()),
                   ('j', 5, 0, 0, 2, 2, true, now()), ('k', 7, 0, 1, 1, 1, true, now())
            """
        )
        rows = conn.execute(
            "SELECT job_id, step FROM latest_complete_checkpoints ORDER BY job_id"
        ).fetchall()
    assert rows == [("j", 10), ("k", 7)]
    with psycopg.connect(clean_db) as conn:
        complete = conn.execute(
            "SELECT job_id, step FROM complete_checkpoints ORDER BY job_id, step DESC"
        ).fetchall()
    # "Latest complete" is the newest row of "complete", the one definition both views share.
    assert complete == [("j", 10), ("j", 5), ("k", 7)]


def test_who_may_read_the_checkpoints_table_may_read_the_complete_view(clean_db: str) -> None:
    # ckpt_writer was granted the table (0002) before the view existed (0009).
    with psycopg.connect(clean_db) as conn:
        conn.execute("SET ROLE ckpt_writer")
        assert conn.execute("SELECT count(*) FROM complete_checkpoints").fetchone() == (0,)


def test_writer_role_has_timeouts_as_role_settings(database_url: str) -> None:
    # RDS Proxy rejects `options=-c …`; the writer's timeouts must come from the role itself.
    with psycopg.connect(database_url) as conn:
        (settings,) = conn.execute(
            "SELECT array_agg(s) FROM pg_db_role_setting d JOIN pg_roles r ON r.oid = d.setrole,"
            " unnest(d.setconfig) s WHERE r.rolname = 'ckpt_writer'"
        ).fetchone() or (None,)
    assert settings is not None
    assert any(s.startswith("statement_timeout=") for s in settings)
    assert any(s.startswith("lock_timeout=") for s in settings)

"""Is the writer's database usable? Connect and compare the schema version, before any receive.

``poll`` runs this before it receives anything: a wrong DATABASE_URL would otherwise fail every
batch and, after maxReceiveCount receives, move the whole queue to the DLQ.
"""

from __future__ import annotations

import psycopg

from ckpt_pipeline.exceptions import DatabaseNotReady
from lambda_writer import WriterSettings, connect, load_migrations


def check_writer_database(settings: WriterSettings | None = None) -> int:
    """The database's schema version; raises :class:`DatabaseNotReady` with one line otherwise."""
    settings = settings or WriterSettings.from_env()
    expected = max(m.version for m in load_migrations())
    try:
        with connect(settings, autocommit=True) as conn:
            row = conn.execute(
                "SELECT max(version) FROM schema_migrations"
                " WHERE to_regclass('schema_migrations') IS NOT NULL"
            ).fetchone()
    except psycopg.errors.UndefinedTable:
        row = None
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatabaseNotReady(f"database: cannot connect: {first}") from exc
    version = None if row is None or row[0] is None else int(row[0])
    if version is None or version < expected:
        raise DatabaseNotReady(
            f"database: schema version {version or 'none'}, this writer needs {expected}:"
            " run `ckpt-pipeline migrate`"
        )
    return version

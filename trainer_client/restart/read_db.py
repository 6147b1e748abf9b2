"""The lookups' and the restart's one way to the database: their inputs checked, psycopg imported
behind the install message (the ``ops`` extra), one read-only connection, and one line per
failure that never echoes the URL (a missing table says to run the migrations)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ckpt_contract.message import JOB_ID_PATTERN
from trainer_client.exceptions import ExtraMissing, ResumeError

# Seconds to wait for the server (or RDS Proxy) to answer: rank 0 decides while every other
# rank waits at the collective, so a dead endpoint must fail the restart in seconds.
READ_CONNECT_TIMEOUT_S = 5


def import_psycopg() -> Any:
    """psycopg, or ``ExtraMissing`` naming the extra that installs it."""
    try:
        import psycopg
    except ImportError:
        raise ExtraMissing(
            "psycopg",
            "the resume helper reads the database: pip install 'ckpt-pipeline[ops]'",
        ) from None
    return psycopg


def check_inputs(job_id: Any, database_url: Any) -> None:
    """Refuse a job id outside the contract's pattern and a URL that is not PostgreSQL's."""
    if not isinstance(job_id, str) or not re.match(JOB_ID_PATTERN, job_id):
        raise ResumeError("job_id", "must be 1-128 chars of [A-Za-z0-9._:-]")
    if not isinstance(database_url, str) or not database_url:
        raise ResumeError("database_url", "is required: postgresql://user@host:5432/dbname")
    scheme = database_url.split("://", 1)[0].lower() if "://" in database_url else None
    if scheme not in (None, "postgresql", "postgres") or (
        scheme is None and "=" not in database_url
    ):
        # Never echo the URL: it may hold a password.
        raise ResumeError(
            "database_url", "is not a PostgreSQL URL or key=value DSN (postgresql://…)"
        )


def first_line(exc: BaseException) -> str:
    """The first line of a psycopg error (its messages name host and port, never the password)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


@contextmanager
def read_only_connection(database_url: str, *, autocommit: bool = False) -> Iterator[Any]:
    """A connection whose transactions are REPEATABLE READ READ ONLY (one snapshot while the
    writer keeps writing), closed after the block; ``autocommit``: each statement outside
    ``conn.transaction()`` sees the writer's newest rows (the restart's polls). A failure to
    connect or to query becomes a ``ResumeError`` naming ``database_url``."""
    psycopg = import_psycopg()
    from psycopg import IsolationLevel

    try:
        conn = psycopg.connect(
            database_url,
            prepare_threshold=None,
            connect_timeout=READ_CONNECT_TIMEOUT_S,
            autocommit=autocommit,
        )
    except psycopg.Error as exc:
        raise ResumeError("database_url", f"cannot connect: {first_line(exc)}") from None
    with conn:
        # Applied in BEGIN itself (BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY): no SET, so
        # a pooled/proxied connection is not pinned.
        conn.isolation_level = IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        try:
            yield conn
        except psycopg.errors.UndefinedTable:
            raise ResumeError(
                "database_url", "no checkpoint tables: run ckpt-pipeline migrate"
            ) from None
        except psycopg.Error as exc:
            raise ResumeError("database_url", f"query failed: {first_line(exc)}") from None

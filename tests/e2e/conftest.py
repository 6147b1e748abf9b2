"""Fault-matrix fixtures: the session's table, a pipeline per test, a capped writer role."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql

from ckpt_pipeline.local.embedded_pg import create_login_role
from ckpt_pipeline.local.pipeline import LocalPipeline, local_pipeline
from lambda_writer.shared.constants import WRITER_DB_USER as WRITER_ROLE
from tests.conftest import ADMIN_URL
from tests.e2e.helpers import LAMBDA_TIMEOUT_S, VISIBILITY_TIMEOUT_S
from tests.e2e.matrix import FaultMatrix

PipelineFactory = Callable[..., AbstractContextManager[LocalPipeline]]


@pytest.fixture
def fault_matrix(request: pytest.FixtureRequest) -> FaultMatrix:
    """The test's fault matrix: its rows go into the test's report, and from there into the
    run's table (``tests/conftest.py`` prints it), whichever xdist worker ran the test."""
    return FaultMatrix(sink=request.node.user_properties)


@pytest.fixture
def pipeline_factory(
    clean_db: str, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> PipelineFactory:
    """``local_pipeline`` on the clean test database with the fault matrix's short timeouts.

    ``local_pipeline`` points boto3's environment at its endpoint; the session's endpoint is put
    back after the test, whatever server the test used.
    """
    monkeypatch.setenv("AWS_ENDPOINT_URL", os.environ.get("AWS_ENDPOINT_URL", moto_endpoint))

    def make(**overrides: Any) -> AbstractContextManager[LocalPipeline]:
        options: dict[str, Any] = {
            "endpoint_url": moto_endpoint,
            "visibility_timeout_s": VISIBILITY_TIMEOUT_S,
            "lambda_timeout_s": LAMBDA_TIMEOUT_S,
            **overrides,
        }
        return local_pipeline(clean_db, **options)

    return make


@dataclass(frozen=True)
class WriterRole:
    """A non-superuser login role with the writer's privileges (member of ``ckpt_writer``)."""

    name: str
    url: str

    def set_connection_limit(self, limit: int) -> None:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(
                sql.SQL("ALTER ROLE {} CONNECTION LIMIT {}").format(
                    sql.Identifier(self.name), sql.Literal(limit)
                )
            )

    def terminate_backends(self) -> int:
        """``pg_terminate_backend`` every connection of this role; returns how many."""
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            row = admin.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
                " FROM pg_stat_activity WHERE usename = %s",
                (self.name,),
            ).fetchone()
        return int(row[0]) if row else 0


@pytest.fixture
def writer_role(clean_db: str) -> Iterator[WriterRole]:
    """A fresh role per test: CONNECTION LIMIT on the shared ``ckpt_writer`` would reach every
    other test session on this server."""
    name = f"e2e_writer_{uuid.uuid4().hex[:10]}"
    url = create_login_role(ADMIN_URL, clean_db, name)
    ident = sql.Identifier(name)
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        # The write function's EXECUTE is granted to ckpt_writer only (migration 0003).
        admin.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(WRITER_ROLE), ident))
    role = WriterRole(name, url)
    try:
        yield role
    finally:
        role.terminate_backends()
        with psycopg.connect(clean_db, autocommit=True) as db:
            db.execute(sql.SQL("DROP OWNED BY {}").format(ident))
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(ident))

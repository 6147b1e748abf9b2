"""Shared fixtures: a fresh database on the real PostgreSQL server, moto's SQS in server mode."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from pytest_postgresql.janitor import DatabaseJanitor

from ckpt_pipeline.local.sqs_server import (
    SQS_KINDS,
    PipelineQueues,
    create_pipeline_queues,
    local_aws_env,
    moto_sqs_server,
    set_local_aws_env,
)
from ckpt_pipeline.ops.sqs import sqs_client
from lambda_writer.migrate.apply import apply_migrations
from lambda_writer.shared.connection import connect_url

# The machine's server (trust auth); CI and developers can point elsewhere.
ADMIN_URL = os.environ.get("CKPT_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextmanager
def empty_database(prefix: str) -> Iterator[str]:
    """A new, empty database on the ADMIN_URL server for the block; yields its URL.

    pytest-postgresql's janitor creates it and drops it (after closing what is still connected).
    """
    server = psycopg.conninfo.conninfo_to_dict(ADMIN_URL)
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    with DatabaseJanitor(
        user=str(server.get("user", "postgres")),
        host=str(server.get("host", "127.0.0.1")),
        port=str(server.get("port", 5432)),
        password=None if server.get("password") is None else str(server["password"]),
        maintenance_dbname=str(server.get("dbname", "postgres")),
        dbname=name,
    ):
        yield psycopg.conninfo.make_conninfo(ADMIN_URL, dbname=name)


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A fresh, migrated database for this test session; dropped at the end."""
    with empty_database("ckpt_test") as url:
        with connect_url(url) as conn:
            apply_migrations(conn)
        yield url


@pytest.fixture
def clean_db(database_url: str) -> Iterator[str]:
    """The session database with empty checkpoint tables (and no tombstones); yields its URL."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE training_checkpoint_shards, training_checkpoints,"
            " training_checkpoint_tombstones CASCADE"
        )
    yield database_url


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's server on a free loopback port; boto3 in this process and children points at it."""
    with moto_sqs_server() as endpoint:
        set_local_aws_env(endpoint)
        yield endpoint


@pytest.fixture(scope="session")
def localstack_endpoint() -> Iterator[str]:
    """LocalStack's SQS on a free loopback port for the session, own temp dirs, stopped after.

    Skipped where it is not installed (``make localstack``), except under CI, which installs it.
    """
    from ckpt_pipeline.local.localstack import SETUP_HINT, installed_python, localstack_sqs

    if installed_python() is None and not os.environ.get("CI"):
        pytest.skip(f"LocalStack not installed: {SETUP_HINT}")
    with localstack_sqs() as endpoint:
        # Dummy credentials and a region for boto3, without taking AWS_ENDPOINT_URL from moto.
        for key, value in local_aws_env(endpoint).items():
            if key != "AWS_ENDPOINT_URL":
                os.environ.setdefault(key, value)
        yield endpoint


@pytest.fixture(params=SQS_KINDS)
def sqs_endpoint(request: pytest.FixtureRequest) -> str:
    """Each SQS emulator in turn (moto, LocalStack): for the tests where SQS semantics matter."""
    return str(request.getfixturevalue(f"{request.param}_endpoint"))


@pytest.fixture
def sqs(moto_endpoint: str) -> Any:
    """A boto3 SQS client talking HTTP to moto's server."""
    return sqs_client(moto_endpoint)


@pytest.fixture
def pipeline_queues(sqs: Any) -> PipelineQueues:
    """A fresh FIFO queue + FIFO DLQ per test (moto limits PurgeQueue, so never reuse)."""
    return create_pipeline_queues(sqs, prefix=f"t{uuid.uuid4().hex[:10]}")


@pytest.fixture
def s3(moto_endpoint: str) -> Any:
    """A boto3 S3 client talking HTTP to moto's server (the same process serves SQS and S3)."""
    import boto3

    return boto3.session.Session().client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
    )


@pytest.fixture
def s3_bucket(s3: Any) -> str:
    """A fresh, unversioned bucket per test."""
    name = f"ckpt-{uuid.uuid4().hex[:16]}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def versioned_bucket(s3: Any) -> str:
    """A fresh bucket with versioning enabled."""
    name = f"ckpt-v-{uuid.uuid4().hex[:16]}"
    s3.create_bucket(Bucket=name)
    s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return name


@pytest.fixture(scope="session")
def localstack_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A boto3 client of LocalStack's S3 (for what moto does not do: composite checksums on
    HeadObject, BadDigest). Skipped where LocalStack is not installed, except under CI."""
    import boto3

    from ckpt_pipeline.local.localstack import SETUP_HINT, installed_python, localstack_sqs

    if installed_python() is None and not os.environ.get("CI"):
        pytest.skip(f"LocalStack not installed: {SETUP_HINT}")
    with localstack_sqs(service="s3") as endpoint:
        yield boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        )

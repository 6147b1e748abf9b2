"""Shared fixtures: a fresh database on the real PostgreSQL server, moto's SQS in server mode,
the run's one LocalStack."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import hypothesis
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
from tests import run_wide
from tests.e2e.matrix import PROPERTY as MATRIX_PROPERTY
from tests.e2e.matrix import FaultMatrix, FaultRow

# Torch's JIT builds (DeepSpeed's CPU op, tests/integrations/deepspeed_ops.py) per checkout, as
# the Makefile sets it: one build folder shared by checkouts with different venvs is rebuilt at
# every switch between them.
os.environ.setdefault(
    "TORCH_EXTENSIONS_DIR", str(Path(__file__).resolve().parents[1] / ".cache" / "torch_extensions")
)
# The machine's server (trust auth); CI and developers can point elsewhere.
ADMIN_URL = os.environ.get("CKPT_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
_RUN_DIR = pytest.StashKey[Path]()

# No per-example deadline for the property tests (tests/contract): the properties are what they
# check; a time limit per example fails them on a loaded machine or beside a parallel worker, and
# speed is measured in bench/, never asserted in tests.
hypothesis.settings.register_profile("ckpt", deadline=None)
hypothesis.settings.load_profile("ckpt")
# The run's fault matrix (tests/e2e), printed at the end.
MATRIX = FaultMatrix()


def pytest_configure(config: pytest.Config) -> None:
    """The run's controller (not an xdist worker) makes the directory of run-wide services."""
    if not hasattr(config, "workerinput"):
        config.stash[_RUN_DIR] = run_wide.begin_run()


def pytest_unconfigure(config: pytest.Config) -> None:
    """The controller stops the run-wide services (LocalStack) once every worker is done."""
    run_dir = config.stash.get(_RUN_DIR, None)
    if run_dir is not None:
        run_wide.stop_all(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)


# tests/integrations/ files whose tests fork no ranks and launch no training job (see below).
INTEGRATIONS_WITHOUT_RANKS = (
    "test_dcp_s3",
    "test_diverged",
    "test_hf_nan_loss",
    "test_layouts",
    "test_lightning_finisher",
    "test_lightning_nan_loss",
    "test_lightning_s3",
    "test_restart_decide",
    "test_restart_diverged",
    "test_restart_records",
    "test_restart_speaks",
    "test_restore",
    "test_resume",
    "test_resume_plans",
    "test_s3_localstack",
    "test_s3_upload",
    "test_shard_rows",
    "test_upload_failures",
    "test_verified_resume",
    "test_verify",
    "test_verify_listing",
)

# Tests that share an expensive session fixture, or must not share the machine with each other,
# run as one group: on one xdist worker, one after the other (make test: ``--dist loadgroup``).
# The groups run beside each other and beside the ungrouped tests, which wait mostly on I/O.
# The first prefix that matches a test's node id decides; ``None``: no group (its own unit).
XDIST_GROUPS: tuple[tuple[str, str | None], ...] = (
    # The session's synthesized stacks (tests/infra/conftest.py) built once, not once per
    # worker; cdk synth and the arm64 bundle under qemu keep a core busy.
    ("tests/infra/", "cdk"),
    # The benchmarks' tests run benches: one at a time.
    ("tests/bench/", "bench"),
    # The integrations' tests that start no ranks (the restart's lookup and decision against the
    # database, S3 uploads and listings, single-process fits and restores): one core at most
    # each, so they spread over the workers instead of queueing behind the rank jobs.
    *((f"tests/integrations/{name}.py", None) for name in INTEGRATIONS_WITHOUT_RANKS),
    # Real torch ranks (DDP, DCP, FSDP, Lightning, HF, DeepSpeed) and the jobs around them: each
    # job's ranks load both cores; two jobs at once would only stretch each other's timeouts.
    # A new file here joins this group until it is named in INTEGRATIONS_WITHOUT_RANKS.
    ("tests/integrations/", "ranks"),
    ("tests/trainer_client/test_distributed.py", "ranks"),
    ("tests/ckpt_pipeline/demo/", "ranks"),
    ("tests/ckpt_pipeline/test_cli.py::test_demo_command", "ranks"),
    ("tests/packaging/", "ranks"),
    # The fault matrix: kills, outages and timeouts of whole local pipelines, one at a time.
    ("tests/e2e/", "faults"),
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with ``XDIST_GROUPS`` as the groups, decided by the test's path.

    xdist's own ``xdist_group`` mark does not group under pytest 9.2 (xdist 3.8 renames the
    node's ``_nodeid``, which pytest no longer reads), so the groups are given to the scheduler
    directly: each group is one work unit, every other test a unit of its own.
    """
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class PathGroupScheduling(LoadGroupScheduling):  # type: ignore[misc]  # untyped base
        def _split_scope(self, nodeid: str) -> str:
            group = next((g for prefix, g in XDIST_GROUPS if nodeid.startswith(prefix)), None)
            return f"group:{group}" if group else str(super()._split_scope(nodeid))

    return PathGroupScheduling(config, log)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect the fault matrix's rows (tests/e2e) from the reports, wherever the test ran (the
    teardown report carries every row the test recorded)."""
    if report.when != "teardown":
        return
    for key, value in report.user_properties:
        if key == MATRIX_PROPERTY and isinstance(value, dict):
            MATRIX.record_quietly(FaultRow.from_dict(value))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the fault matrix (also under ``-q``) and each scenario's own figures."""
    if not MATRIX.rows:
        return
    terminalreporter.write_sep("=", "fault matrix (tests/e2e)")
    terminalreporter.write_line(MATRIX.table())
    terminalreporter.write_line("")
    terminalreporter.write_line("per-scenario figures:")
    for row in MATRIX.rows:
        terminalreporter.write_line(f"  {row.figures_line()}")


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
    """The session database with empty checkpoint tables (and no tombstones, no job owners, no
    audit rows); yields its URL."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE training_checkpoint_shards, training_checkpoints,"
            " training_checkpoint_tombstones, training_job_launches, training_job_restarts,"
            " ckpt_job_owners, ckpt_job_owner_changes, ckpt_dlq_discards CASCADE"
        )
    yield database_url


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's server on a free loopback port; boto3 in this process and children points at it."""
    with moto_sqs_server() as endpoint:
        set_local_aws_env(endpoint)
        yield endpoint


def _localstack() -> str:
    """The run's one LocalStack (SQS and S3; tests.run_wide), started by its first user.

    Skipped where it is not installed (``make localstack``), except under CI, which installs it.
    """
    from ckpt_pipeline.local.localstack import SETUP_HINT, installed_python

    if installed_python() is None and not os.environ.get("CI"):
        pytest.skip(f"LocalStack not installed: {SETUP_HINT}")
    return run_wide.endpoint("localstack")


@pytest.fixture(scope="session")
def localstack_endpoint() -> str:
    """LocalStack's SQS on a free loopback port, one for the whole run (all xdist workers)."""
    endpoint = _localstack()
    # Dummy credentials and a region for boto3, without taking AWS_ENDPOINT_URL from moto.
    for key, value in local_aws_env(endpoint).items():
        if key != "AWS_ENDPOINT_URL":
            os.environ.setdefault(key, value)
    return endpoint


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
def localstack_s3() -> Any:
    """A boto3 client of LocalStack's S3 (for what moto does not do: composite checksums on
    HeadObject, BadDigest): the run's one LocalStack, as for ``localstack_endpoint``."""
    import boto3

    return boto3.session.Session().client(
        "s3",
        endpoint_url=_localstack(),
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )

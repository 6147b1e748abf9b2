"""Issue 12 §1/§3: `poll` with a wrong database setting refuses before receiving anything.

Each case runs the console script as a subprocess against moto's server and the real PostgreSQL
and checks the exit code, the one error line, and that every message is still in the queue.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_pipeline.local.sqs_server import PipelineQueues
from ckpt_pipeline.ops.sqs import queue_depth
from tests.ckpt_pipeline.helpers import report, send
from tests.conftest import ADMIN_URL

pytestmark = pytest.mark.slow

CONSOLE_SCRIPT = Path(sys.executable).parent / "ckpt-pipeline"


def _run(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CONSOLE_SCRIPT), *argv],
        env={**os.environ, "POWERTOOLS_METRICS_DISABLED": "true", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def unmigrated_url() -> Any:
    name = f"ckpt_unmig_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield psycopg.conninfo.make_conninfo(ADMIN_URL, dbname=name)
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_poll_refuses_bad_database_settings_and_leaves_the_queue_alone(
    sqs: Any, fast_queues: PipelineQueues, unmigrated_url: str
) -> None:
    send(
        sqs,
        fast_queues.queue_url,
        [(report("job-f", 1, r, world_size=3), f"job-f:{r}", f"f{r}") for r in (0, 1, 2)],
    )
    cases = {
        "notadsn": "DATABASE_URL: is not a PostgreSQL URL",
        "mysql://u@127.0.0.1/x": "DATABASE_URL: scheme 'mysql' is not PostgreSQL",
        "postgresql://postgres@127.0.0.1:5999/x": "database: cannot connect",
        unmigrated_url: "run `ckpt-pipeline migrate`",
    }
    for url, expected in cases.items():
        argv = ["poll", "--queue-url", fast_queues.queue_url, "--once", "--idle-seconds", "0"]
        result = _run(*argv, env={"DATABASE_URL": url, "DLQ_URL": fast_queues.dlq_url})
        lines = result.stderr.strip().splitlines()
        assert result.returncode != 0, (url, result)
        assert len(lines) == 1 and expected in lines[0], (url, result.stderr)
        assert "Traceback" not in result.stderr
    # Nothing was received: all three messages are still visible, none in the DLQ.
    assert queue_depth(sqs, fast_queues.queue_url).visible == 3
    assert queue_depth(sqs, fast_queues.dlq_url).total == 0


def test_ranges_are_validated() -> None:
    for argv in (["poll", "--idle-seconds", "-5"], ["poll", "--visibility-timeout", "0"]):
        result = _run(*argv, env={})
        assert result.returncode == 2 and "Traceback" not in result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("ckpt-pipeline poll: argument ") and line.endswith("--help)")


def test_status_on_an_unmigrated_database_and_version(unmigrated_url: str) -> None:
    result = _run("status", env={"DATABASE_URL": unmigrated_url})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "ckpt-pipeline status: PostgreSQL (DATABASE_URL): the database is not migrated:"
        " run `ckpt-pipeline migrate`"
    ]
    version = _run("--version", env={})
    assert version.returncode == 0 and version.stdout.startswith("ckpt-pipeline ")


def test_demo_says_when_epochs_are_too_small_for_the_preemption() -> None:
    result = _run("demo", "--epochs", "2", env={})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "--epochs 2" in line and "too small for the preemption" in line


def test_replay_and_status_sqs_errors_are_one_line(moto_endpoint: str, clean_db: str) -> None:
    missing = f"{moto_endpoint}/123456789012/nope-{uuid.uuid4().hex[:6]}.fifo"
    cases = [
        (["replay-dlq", "--dry-run", "--dlq-url", "not-a-url"], {}, "--dlq-url: must be an SQS"),
        (
            ["replay-dlq", "--dry-run", "--dlq-url", missing],
            {},
            f"SQS (--dlq-url {missing}): AWS.SimpleQueueService.NonExistentQueue",
        ),
        (
            ["status", "--dlq-url", missing],
            {"DATABASE_URL": clean_db, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"},
            f"SQS (--dlq-url {missing}): cannot connect to http://127.0.0.1:9",
        ),
    ]
    for argv, env, expected in cases:
        result = _run(*argv, env=env)
        lines = result.stderr.strip().splitlines()
        assert result.returncode != 0 and "Traceback" not in result.stderr, (argv, result)
        assert len(lines) == 1 and expected in lines[0], (argv, result.stderr)


def test_quiet_is_accepted_after_the_subcommand() -> None:
    result = _run("migrate", "-q", env={"DATABASE_URL": ""})
    assert result.returncode == 2 and "unrecognized" not in result.stderr
    assert "DATABASE_URL" in result.stderr

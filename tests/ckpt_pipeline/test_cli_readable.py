"""Issue 12 §4: `status` readable at 80 columns; `poll --help` names the variables it needs.

The console script as a subprocess against the real PostgreSQL server and moto's SQS.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_pipeline.local.sqs_server import PipelineQueues
from ckpt_pipeline.ops.sqs import queue_depth
from tests.ckpt_pipeline.helpers import report, send

pytestmark = pytest.mark.slow

CONSOLE_SCRIPT = Path(sys.executable).parent / "ckpt-pipeline"


def _run(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CONSOLE_SCRIPT), *argv],
        env={**os.environ, "COLUMNS": "80", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_status_fits_80_columns(sqs: Any, pipeline_queues: PipelineQueues, clean_db: str) -> None:
    job = "resnet50-imagenet-2026-12-03-long-name"
    now = datetime.now(UTC)
    with psycopg.connect(clean_db) as conn:
        conn.execute(
            "INSERT INTO training_checkpoints (job_id, run_attempt, step, epoch, world_size,"
            " is_complete, first_reported_at) VALUES (%s, 3, 11990, 99, 1, true, %s)",
            (job, now),
        )
    send(sqs, pipeline_queues.queue_url, [(report("job-q", 1, 0), "job-q:0", "q0")])
    urls = ["--queue-url", pipeline_queues.queue_url, "--dlq-url", pipeline_queues.dlq_url]
    result = _run("status", *urls, env={"DATABASE_URL": clean_db})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), result.stdout
    header = next(line for line in lines if line.startswith("job"))
    assert header.split() == [
        "job", "complete", "latest", "attempt", "shards", "newest", "lag", "p50", "lag", "p99",
    ]  # fmt: skip
    row = next(line for line in lines if line.startswith("resnet50"))
    assert row.split()[1:4] == ["1/1", "11990", "3"]
    assert "queue: 1 visible, 0 in flight, 0 delayed" in lines
    # status only reads: the message is still in the queue
    assert queue_depth(sqs, pipeline_queues.queue_url).visible == 1


def test_poll_help_names_the_environment_it_needs() -> None:
    result = _run("poll", "--help", env={"DATABASE_URL": ""})
    assert result.returncode == 0
    for variable in ("DATABASE_URL", "DB_HOST", "DB_AUTH", "DLQ_URL", "CKPT_QUEUE_URL"):
        assert variable in result.stdout, variable
    assert all(len(line) <= 80 for line in result.stdout.splitlines())

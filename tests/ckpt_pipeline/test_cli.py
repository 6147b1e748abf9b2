"""The console script and its subcommands: migrate (concurrent), status, poll, config errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_pipeline.cli import main
from ckpt_pipeline.local.embedded_pg import create_database, drop_database
from ckpt_pipeline.local.sqs_server import PipelineQueues
from ckpt_pipeline.ops.sqs import queue_depth
from lambda_writer.migrate.apply import load_migrations
from tests.ckpt_pipeline.helpers import report, send
from tests.conftest import ADMIN_URL

CONSOLE_SCRIPT = Path(sys.executable).parent / "ckpt-pipeline"


@pytest.fixture
def fresh_database_url() -> Iterator[str]:
    """An empty, unmigrated database on the local server."""
    name = f"ckpt_cli_{uuid.uuid4().hex[:10]}"
    url = create_database(ADMIN_URL, name)
    try:
        yield url
    finally:
        drop_database(ADMIN_URL, name)


def _cli(*argv: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(CONSOLE_SCRIPT), *argv],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_migrate_twice_and_two_at_once_give_one_schema(fresh_database_url: str) -> None:
    env = {"DATABASE_URL": fresh_database_url}
    racers = [_cli("migrate", env=env) for _ in range(2)]
    outputs = [p.communicate(timeout=60) for p in racers]
    assert [p.returncode for p in racers] == [0, 0], outputs
    assert sorted(out for out, _ in outputs)[0].startswith("applied")  # one of them applied
    again = _cli("migrate", env=env)
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0 and "up to date" in out, err
    with psycopg.connect(fresh_database_url) as conn:
        versions = conn.execute("SELECT version FROM schema_migrations ORDER BY 1").fetchall()
        tables = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
            " AND tablename IN ('training_checkpoints', 'training_checkpoint_shards')"
        ).fetchone()
    assert versions == [(m.version,) for m in load_migrations()] and tables == (2,)


def test_migrate_without_database_url_names_it_and_exits_2() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    result = subprocess.run(
        [str(CONSOLE_SCRIPT), "migrate"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "DATABASE_URL" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # the built demo: 8 torchrun ranks x 5 epochs (~1 min)
def test_demo_command_runs_the_demo_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    # The command's own path (a throwaway database, the run, the rendered result) at the smallest
    # size that still preempts a rank; tests/ckpt_pipeline/demo asserts the run's rows. (It ran
    # the default 8 ranks x 5 epochs and asserted only a stub's message, long gone.)
    assert main(["demo", "--ranks", "2", "--epochs", "3"]) == 0
    assert "database: local-server" in capsys.readouterr().out


@pytest.mark.slow
def test_poll_once_then_status_with_the_real_writer(
    sqs: Any,
    fast_queues: PipelineQueues,
    cli_env: dict[str, str],
    clean_db: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bodies = [
        (report("job-s", step, rank), f"job-s:{rank}", f"s{step}r{rank}")
        for step in (1, 2)
        for rank in (0, 1)
    ]
    bodies.append((report("job-s", 3, 0), "job-s:0", "s3r0"))  # step 3: incomplete
    send(sqs, fast_queues.queue_url, bodies)
    argv = ["-q", "poll", "--queue-url", fast_queues.queue_url, "--once", "--idle-seconds", "0.3"]
    assert main([*argv, "--wait-time", "1"], cli_env) == 0
    assert "records=5" in capsys.readouterr().out
    assert queue_depth(sqs, fast_queues.queue_url).total == 0

    urls = ["--queue-url", fast_queues.queue_url, "--dlq-url", fast_queues.dlq_url]
    assert main(["status", "--json", *urls], cli_env) == 0
    status = json.loads(capsys.readouterr().out)
    (job,) = status["jobs"]
    assert (job["job_id"], job["checkpoints"], job["complete"], job["incomplete"]) == (
        "job-s",
        3,
        2,
        1,
    )
    assert job["latest_complete_step"] == 2 and job["shards"] == 5
    assert job["lag_p50_s"] >= 0 and job["lag_p99_s"] >= job["lag_p50_s"]
    assert status["dlq"]["total"] == 0 and status["queue"]["total"] == 0
    assert main(["status", *urls], cli_env) == 0
    assert "job-s" in capsys.readouterr().out


def test_poll_with_two_workers_gives_each_its_own_writer(
    sqs: Any,
    fast_queues: PipelineQueues,
    cli_env: dict[str, str],
    clean_db: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    send(
        sqs,
        fast_queues.queue_url,
        [
            (report("job-p", 1, rank, world_size=4), f"job-p:{rank}", f"p{rank}")
            for rank in range(4)
        ],
    )
    argv = ["-q", "poll", "--queue-url", fast_queues.queue_url, "--once", "--concurrency", "2"]
    options = ["--batch-size", "1", "--wait-time", "1", "--idle-seconds", "0.3"]
    assert main([*argv, *options], cli_env) == 0
    capsys.readouterr()
    with psycopg.connect(clean_db) as conn:
        row = conn.execute(
            "SELECT shards_present, is_complete FROM training_checkpoints"
        ).fetchone()
    assert row == (4, True)

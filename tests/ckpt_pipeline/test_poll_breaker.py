"""Issue 12 §1: `poll` stops receiving while the database is unreachable, and its summary counts
poison apart from transient failures.

Each case runs the console script as a subprocess against moto's server and the real PostgreSQL
(through a TCP relay that can close the database's port) and checks the exit code, the lines,
and where every message is afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_pipeline.local.sqs_server import PipelineQueues
from ckpt_pipeline.local.tcp_relay import TcpRelay
from ckpt_pipeline.ops.sqs import queue_depth
from tests.ckpt_pipeline.helpers import report, send
from tests.trainer_client.helpers import wait_for

CONSOLE_SCRIPT = Path(sys.executable).parent / "ckpt-pipeline"
# fast_queues: visibility timeout 1 s, maxReceiveCount 3.
MAX_RECEIVE_COUNT = 3


def _env(database_url: str, dlq_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "DLQ_URL": dlq_url,
        "POWERTOOLS_METRICS_DISABLED": "true",
        # The writer's JSON lines stay out of stdout, which then holds the summary alone.
        "POWERTOOLS_LOG_LEVEL": "ERROR",
    }


def _rows(url: str, job: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM training_checkpoint_shards WHERE job_id = %s", (job,)
        ).fetchone()
    return int(row[0]) if row else 0


def _summary(stdout: str) -> dict[str, str]:
    (line,) = [ln for ln in stdout.splitlines() if ln.startswith("batches=")]
    return dict(part.split("=", 1) for part in line.replace("(", "").replace(")", "").split())


@pytest.mark.slow
def test_summary_counts_poison_apart_and_once_fails_on_it(
    sqs: Any, fast_queues: PipelineQueues, clean_db: str
) -> None:
    # GIVEN 3 valid reports and 2 poison messages
    valid = [(report("job-sum", 1, r, world_size=3), f"job-sum:{r}", f"v{r}") for r in range(3)]
    poison = [("not json", "job-sum:9", "p1"), ('{"schema": "ckpt.v0"}', "job-sum:8", "p2")]
    send(sqs, fast_queues.queue_url, valid + poison)
    # WHEN poll drains the queue once
    argv = ["poll", "--queue-url", fast_queues.queue_url, "--once", "--idle-seconds", "0.3"]
    result = subprocess.run(
        [str(CONSOLE_SCRIPT), *argv, "--wait-time", "1"],
        env=_env(clean_db, fast_queues.dlq_url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    # THEN it says what happened to each: 3 written, 2 poison in the DLQ, nothing retried
    assert "Traceback" not in result.stderr
    summary = _summary(result.stdout)
    assert summary["records"] == "5" and summary["written"] == "3"
    assert summary["poison_to_dlq"] == "2" and summary["retried"] == "0"
    assert summary["in_queue"] == "0" and summary["in_dlq"] == "2"
    assert summary["breaker_trips"] == "0"
    # AND --once exits non-zero: not every record reached the database
    assert result.returncode == 1
    assert _rows(clean_db, "job-sum") == 3
    assert queue_depth(sqs, fast_queues.dlq_url).total == 2


@pytest.mark.slow
@pytest.mark.parametrize("concurrency", ["1", "2"])
def test_poll_stops_receiving_while_the_database_is_down(
    sqs: Any, fast_queues: PipelineQueues, clean_db: str, tmp_path: Path, concurrency: str
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(clean_db)
    relay = TcpRelay((str(params.get("host", "127.0.0.1")), int(str(params.get("port", 5432)))))
    url = psycopg.conninfo.make_conninfo(clean_db, host="127.0.0.1", port=str(relay.port))
    stderr_path = tmp_path / "poll.stderr"
    argv = ["-v", "poll", "--queue-url", fast_queues.queue_url, "--wait-time", "1"]
    argv += ["--concurrency", concurrency]
    with relay, stderr_path.open("w") as stderr:
        # GIVEN poll running (its start-up database check passed)
        poll = subprocess.Popen(
            [str(CONSOLE_SCRIPT), *argv],
            env=_env(url, fast_queues.dlq_url),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        try:
            log = stderr_path.read_text
            wait_for(lambda: "event source started" in log(), timeout=60)
            # WHEN the database's port closes and reports arrive
            relay.stop()
            bodies = [
                (report("job-out", 1, r, world_size=4), f"job-out:{r}", f"o{r}") for r in range(4)
            ]
            send(sqs, fast_queues.queue_url, bodies)
            # THEN poll stops receiving, and keeps re-checking for longer than the records'
            # maxReceiveCount receives would last (visibility timeout 1 s each)
            wait_for(lambda: "stopped receiving" in log(), timeout=60)
            still_down = "database still unreachable"
            wait_for(lambda: log().count(still_down) >= MAX_RECEIVE_COUNT, timeout=120)
            depth = queue_depth(sqs, fast_queues.queue_url)
            assert depth.total == 4 and queue_depth(sqs, fast_queues.dlq_url).total == 0
            assert _rows(clean_db, "job-out") == 0
            # WHEN the database comes back, THEN receiving resumes and every record is written
            relay.start()
            wait_for(lambda: _rows(clean_db, "job-out") == 4, timeout=120)
            wait_for(lambda: queue_depth(sqs, fast_queues.queue_url).total == 0, timeout=60)
        finally:
            poll.send_signal(signal.SIGTERM)
            stdout, _ = poll.communicate(timeout=60)
    assert poll.returncode == 0
    assert "database reachable again, receiving resumes" in stderr_path.read_text()
    assert "Traceback" not in stderr_path.read_text()
    summary = _summary(stdout)
    print(stdout.strip())  # the figures, under `pytest -s`
    assert summary["breaker_trips"] == "1" and summary["written"] == "4"
    assert summary["poison_to_dlq"] == "0" and summary["in_dlq"] == "0"
    assert summary["in_queue"] == "0"
    # Nothing reached the DLQ: the outage outlasted maxReceiveCount x visibility timeout.
    assert queue_depth(sqs, fast_queues.dlq_url).total == 0

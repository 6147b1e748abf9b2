"""Real processes: SIGKILL before the send, SIGTERM with pending reports, SQS down and back."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckpt_contract import dedup_id
from ckpt_pipeline.local.sqs_server import PipelineQueues
from tests.torchrun import free_port
from tests.trainer_client.helpers import (
    REPO_ROOT,
    RestartableMoto,
    child_env,
    drain,
    read_line,
    wait_for,
)
from trainer_client import CheckpointReporter

pytestmark = pytest.mark.slow


def _child(**args: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.trainer_client.child", json.dumps(args)],
        env=child_env(),
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigkill_after_report_then_a_new_reporter_sends_exactly_once(
    pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path
) -> None:
    # GIVEN a trainer that spooled 3 reports but could not send them (SQS port closed) and died
    child = _child(
        queue_url=pipeline_queues.queue_url,
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        job_id="killed-job",
        spool_dir=str(tmp_path),
        rank=2,
        world_size=4,
        count=3,
        sigkill=True,
    )
    assert read_line(child) == "spooled 3"
    assert child.wait(timeout=30) == -signal.SIGKILL
    # WHEN the restarted trainer (next run attempt) opens a reporter for the same job and rank
    with CheckpointReporter(
        pipeline_queues.queue_url,
        job_id="killed-job",
        spool_dir=tmp_path,
        rank=2,
        world_size=4,
        run_attempt=1,
        spot_poll=False,
    ) as rep:
        assert rep.flush(10)
        assert rep.stats.sent == 3
    # THEN the queue holds each of the killed attempt's reports exactly once
    messages = drain(sqs, pipeline_queues.queue_url, expect=3)
    ids = sorted(m["Attributes"]["MessageDeduplicationId"] for m in messages)
    assert ids == sorted(dedup_id("killed-job", 0, step, 2) for step in range(3))
    with CheckpointReporter(
        pipeline_queues.queue_url, job_id="killed-job", spool_dir=tmp_path, rank=2, world_size=4
    ) as again:
        assert again.pending == 0  # acknowledged records are not re-sent a second time


def test_sqs_down_for_a_while_then_everything_arrives_once(
    moto_down: tuple[RestartableMoto, PipelineQueues, Any], tmp_path: Path
) -> None:
    moto, queues, sqs = moto_down
    moto.start()
    with CheckpointReporter(
        queues.queue_url,
        job_id="outage-job",
        spool_dir=tmp_path,
        rank=0,
        world_size=1,
        endpoint_url=moto.endpoint,
        spot_poll=False,
        connect_timeout_s=0.2,
        backoff_base_s=0.05,
        backoff_cap_s=0.5,
    ) as rep:
        for step in range(5):
            rep.report(step=step, epoch=0, uri=f"s3://b/{step}")
        assert rep.flush(10)
        # WHEN SQS goes away, reports keep returning promptly and pile up on disk
        moto.stop()
        for step in range(5, 25):
            rep.report(step=step, epoch=0, uri=f"s3://b/{step}")
            # Returned with the report on disk, not waiting for SQS (speed is in bench/).
            assert rep.pending == step - 4
        assert rep.pending == 20
        # The sender steps aside while report() is on disk (back to back here), so its first
        # failed attempt may come only after the loop: wait for it rather than race it.
        assert wait_for(lambda: rep.last_error is not None, timeout=10)
        assert rep.flush(timeout=0.5) is False
        # THEN once it is back, the backlog drains
        moto.start()
        assert rep.flush(timeout=20)
        assert rep.last_error is None
    messages = drain(sqs, queues.queue_url, expect=25)
    steps = [json.loads(m["Body"])["step"] for m in messages]
    assert sorted(steps) == list(range(25))  # all there, none twice


def _queue_depth(sqs: Any, queue_url: str) -> int:
    attrs = sqs.get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages"]
    )
    return int(attrs["Attributes"]["ApproximateNumberOfMessages"])


@pytest.mark.parametrize("python_handler", [False, True], ids=["SIG_DFL", "python-handler"])
def test_sigterm_flushes_pending_reports_then_chains(
    moto_down: tuple[RestartableMoto, PipelineQueues, Any], tmp_path: Path, python_handler: bool
) -> None:
    moto, queues, sqs = moto_down
    # GIVEN a trainer whose sender is in a long backoff after failing to reach SQS
    child = _child(
        queue_url=queues.queue_url,
        endpoint_url=moto.endpoint,
        job_id="term-job",
        spool_dir=str(tmp_path),
        count=4,
        wait_for_failure=True,
        python_handler=python_handler,
        tuning={"backoff_base_s": 600, "backoff_cap_s": 600, "signal_flush_timeout_s": 10},
    )
    assert read_line(child) == "spooled 4"
    moto.start()
    # Still waiting out the backoff: at least 300 s (equal jitter on 600 s), so deterministic.
    assert _queue_depth(sqs, queues.queue_url) == 0
    # WHEN torchrun (or the spot agent) sends SIGTERM
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=60)
    # THEN the reports were flushed before exit (not at the deadline) and the signal passed on
    if python_handler:
        assert child.returncode == 7, err
        assert "previous handler ran" in out
    else:
        assert child.returncode == -signal.SIGTERM, err
    assert "SIGTERM: flushed" in err
    messages = drain(sqs, queues.queue_url, expect=4)
    assert sorted(json.loads(m["Body"])["step"] for m in messages) == [0, 1, 2, 3]


def test_client_works_without_torch(
    pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path
) -> None:
    code = (
        "import sys; sys.modules['torch'] = None  # import torch now fails\n"
        "from trainer_client import CheckpointReporter\n"
        f"with CheckpointReporter({pipeline_queues.queue_url!r}, spool_dir={str(tmp_path)!r},"
        " spot_poll=False) as rep:\n"
        "    rep.report(step=1, epoch=0, uri='s3://b/1', loss=0.5)\n"
        "    assert rep.flush(10)\n"
        "assert 'torch' not in sys.modules or sys.modules['torch'] is None\n"
    )
    env = child_env(CKPT_JOB_ID="no-torch", RANK="0", WORLD_SIZE="1")
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert len(drain(sqs, pipeline_queues.queue_url, expect=1)) == 1


_SIGTERM_IN_CLOSE = """
import os, signal, sys
from trainer_client import CheckpointReporter
rep = CheckpointReporter(sys.argv[1], job_id="close-term", spool_dir=sys.argv[2], rank=0,
                         world_size=1, spot_poll=False, endpoint_url=sys.argv[3])
real_join = rep._sender.join
def join_with_sigterm(timeout=None):
    # A real SIGTERM, delivered exactly in the window between stopping=True and uninstall().
    os.kill(os.getpid(), signal.SIGTERM)
    real_join(timeout)
rep._sender.join = join_with_sigterm
rep.close(timeout=0.1)
print("survived close", flush=True)
sys.exit(3)
"""


def test_sigterm_inside_close_is_not_swallowed(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _SIGTERM_IN_CLOSE,
            "http://127.0.0.1:1/000000000000/q.fifo",
            str(tmp_path),
            f"http://127.0.0.1:{free_port()}",
        ],
        env=child_env(),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGTERM, (done.stdout, done.stderr)
    assert "survived close" not in done.stdout

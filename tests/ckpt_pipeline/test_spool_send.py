"""Issue 32 §3: a wrong queue URL keeps the reports, close() says so, `spool send` delivers them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckpt_pipeline.cli import main
from ckpt_pipeline.local.sqs_server import PipelineQueues
from ckpt_pipeline.ops.sqs import queue_depth

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
_JOB = """
import sys, time
from trainer_client import CheckpointReporter
reporter = CheckpointReporter(
    sys.argv[1], "typo-job", sys.argv[2], rank=0, world_size=1, spot_poll=False,
    close_timeout_s=60,
)
for step in (10, 20):
    reporter.report(step=step, epoch=0, uri=f"file:///ckpt/{step}")
start = time.monotonic()
print("closed:", reporter.close(), time.monotonic() - start)
"""


def test_a_typo_queue_is_said_at_close_and_spool_send_delivers(
    pipeline_queues: PipelineQueues,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sqs: Any,
) -> None:
    # GIVEN a job (its own process: logging not configured) that reported two checkpoints to
    # a queue that does not exist
    typo = pipeline_queues.queue_url.replace("-checkpoints.fifo", "-typo.fifo")
    spool = tmp_path / "spool"
    job = subprocess.run(
        [sys.executable, "-c", _JOB, typo, str(spool)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    # WHEN it closes THEN stderr says how many, why and where
    closed, ok, waited = job.stdout.split()
    assert job.returncode == 0 and (closed, ok) == ("closed:", "False"), job.stderr
    # A missing queue is not waited out (close_timeout_s 60): nothing would be sent meanwhile
    assert float(waited) < 30, waited
    assert "closing with 2 report(s) unsent (the queue's last error: " in job.stderr
    assert "NonExistentQueue" in job.stderr, job.stderr
    assert f"ckpt-pipeline spool send --dir {spool}" in job.stderr
    # WHEN the queue is right and the spool is sent THEN both arrive, the summary says so
    env = {**os.environ, "CKPT_QUEUE_URL": pipeline_queues.queue_url}
    assert main(["spool", "send", "--dir", str(spool), "--timeout", "20"], env) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "job typo-job rank 0: 2 sent, 0 left",
        f"1 spools under {spool}: 2 reports sent, 0 left, 0 in use",
    ]
    assert queue_depth(sqs, pipeline_queues.queue_url).visible == 2
    # AND a directory without spools is refused in one line
    assert main(["spool", "send", "--dir", str(tmp_path)], env) == 2
    assert "--dir: no spool under" in capsys.readouterr().err

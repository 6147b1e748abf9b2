"""A request SQS refuses as a whole because of one entry: the entry is found, set aside, counted.

moto and SQS validate every entry of a SendMessageBatch before sending any, so one body longer
than the queue's MaximumMessageSize refuses all ten with a whole-call 400. The reporter must not
retry those ten forever (blocking the rank's spool) nor drop the bad one silently.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from ckpt_pipeline.ops.sqs import sqs_client
from tests.trainer_client.helpers import drain
from trainer_client import CheckpointReporter

# SQS's smallest MaximumMessageSize: a report with a 2 KB note exceeds it, a plain one does not.
SMALL_QUEUE_MAX_BYTES = 1024
BIG = {"note": "x" * 2048}


def _small_queue(sqs: Any) -> str:
    """A FIFO queue that refuses bodies over 1 KiB (an operator's setting our bodies can exceed)."""
    return str(
        sqs.create_queue(
            QueueName=f"small-{uuid.uuid4().hex[:12]}.fifo",
            Attributes={
                "FifoQueue": "true",
                "MaximumMessageSize": str(SMALL_QUEUE_MAX_BYTES),
            },
        )["QueueUrl"]
    )


def _reporter(sqs: Any, queue_url: str, spool: Path) -> CheckpointReporter:
    return CheckpointReporter(
        queue_url,
        job_id="job-refused",
        rank=0,
        world_size=1,
        spool_dir=spool,
        spot_poll=False,
        sqs_client=sqs,
        backoff_base_s=0.05,
        backoff_cap_s=0.2,
    )


def _rejected(spool: Path) -> int:
    """How many records the rejected file holds (each framed with its reason first)."""
    path = spool / "job-refused" / "rank-0.rejected"
    return path.read_bytes().count(b"shorter than 1024 bytes") if path.exists() else 0


def test_one_refused_entry_is_set_aside_and_its_batch_neighbours_arrive(
    sqs_endpoint: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sqs = sqs_client(sqs_endpoint)
    queue_url = _small_queue(sqs)
    caplog.set_level(logging.ERROR, logger="trainer_client")
    with _reporter(sqs, queue_url, tmp_path) as rep:
        # GIVEN one batch where steps 20 and 40 are too long for the queue and the rest fit
        for step in (10, 20, 30, 40, 50):
            rep.report(
                step=step, epoch=0, uri=f"s3://b/{step}", extra=BIG if step in (20, 40) else None
            )
        # WHEN the sender has done what it can
        flushed = rep.flush(30)
        # THEN nothing is pending: the three that fit were sent, the two refused are set aside
        assert flushed is False  # a refused report makes flush() say not everything arrived
        assert rep.pending == 0
        assert (rep.stats.sent, rep.stats.failed) == (3, 2)
        # and the last of them stays visible in last_error after later sends succeeded
        assert "shorter than 1024 bytes" in str(rep.last_error)
    arrived = [json.loads(m["Body"])["step"] for m in drain(sqs, queue_url, expect=3)]
    assert sorted(arrived) == [10, 30, 50]
    assert _rejected(tmp_path) == 2
    assert sum("can never be sent" in r.getMessage() for r in caplog.records) == 2


def test_a_lone_refusal_waits_for_evidence_then_neither_blocks_nor_vanishes(
    moto_endpoint: str, tmp_path: Path
) -> None:
    # moto only: LocalStack answers a too-long entry with a per-entry failure (SenderFault=true),
    # which is unambiguous and set aside at once (the test above covers it on both).
    sqs = sqs_client(moto_endpoint)
    queue_url = _small_queue(sqs)
    with _reporter(sqs, queue_url, tmp_path) as rep:
        # GIVEN the first report of this process is refused alone, with a code that could as well
        # be about the queue: nothing tells the entry from the configuration yet
        rep.report(step=20, epoch=0, uri="s3://b/20", extra=BIG)
        assert rep.flush(2) is False
        # THEN it is kept on disk and retried (not set aside on a guess), and the error is visible
        assert rep.pending == 1 and rep.stats.failed == 0
        assert rep.last_error is not None
        assert _rejected(tmp_path) == 0
        # WHEN a report that fits follows it
        rep.report(step=30, epoch=0, uri="s3://b/30")
        rep.flush(30)
        # THEN the good one arrives, and with that evidence the refused one is set aside
        assert rep.pending == 0
        assert (rep.stats.sent, rep.stats.failed) == (1, 1)
    assert [json.loads(m["Body"])["step"] for m in drain(sqs, queue_url, expect=1)] == [30]
    assert _rejected(tmp_path) == 1

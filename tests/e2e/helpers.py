"""Pieces the fault scenarios share: a TCP relay to cut a link, in-process ranks, raw sends, DLQ."""

from __future__ import annotations

import contextlib
import os
import random
import threading
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ckpt_contract import encode
from ckpt_pipeline.local.event_source import EventSourceStats
from ckpt_pipeline.local.pipeline import LocalPipeline
from ckpt_pipeline.local.sqs_events import receive_kwargs
from ckpt_pipeline.ops.replay import ReplaySummary, replay_dlq
from tests import reports
from tests.e2e.oracle import SentReport
from trainer_client import CheckpointReporter

# Locally a failed record comes back within seconds, so the scenarios' retries and redrives
# take seconds, not AWS's minutes.
VISIBILITY_TIMEOUT_S = 3
# The emulated function timeout is wall time from the receive, first connect included. At
# VISIBILITY_TIMEOUT_S / 6 (0.5 s, AWS's recommended ratio) a committed batch on a loaded machine
# counted as timed out, came back, and with maxReceiveCount 2 healthy records reached the DLQ. No
# scenario here is about the function timeout (tests/ckpt_pipeline/local/test_event_source.py is),
# so it is as long as the queue allows: Lambda's hard rule is only visibility timeout >= function
# timeout (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-configure.html), and at that
# value the timeout fails no batch that the visibility timeout would not bring back anyway.
LAMBDA_TIMEOUT_S = float(VISIBILITY_TIMEOUT_S)
DRAIN_TIMEOUT_S = 90.0


def e2e_seed() -> int:
    """A fresh seed, or ``CKPT_E2E_SEED`` to replay a run (outcomes must not depend on it)."""
    text = os.environ.get("CKPT_E2E_SEED")
    return int(text) if text else random.SystemRandom().randrange(2**32)


def shard_uri(job_id: str, step: int, rank: int, attempt: int = 0) -> str:
    """The deterministic checkpoint URI of one shard: a re-report carries the same one."""
    return f"file:///e2e/{job_id}/attempt-{attempt}/step-{step}/rank-{rank}.pt"


def report_body(
    *, job_id: str, step: int, rank: int, world_size: int, attempt: int = 0, **extra: Any
) -> tuple[str, SentReport]:
    """A valid ckpt.v1 body (built through the contract) and what it must leave in the database."""
    uri = extra.pop("uri", shard_uri(job_id, step, rank, attempt))
    fields = {"epoch": step, "loss": 0.25, "metrics": {}, "created_at": datetime.now(UTC)}
    report = reports.report(
        job_id=job_id, run_attempt=attempt, step=step, rank=rank, world_size=world_size,
        uri=uri, **(fields | extra),
    )  # fmt: skip
    return encode(report), SentReport(job_id, step, rank, attempt, world_size, uri)


def send_raw(sqs: Any, queue_url: str, body: str, *, group_id: str) -> str:
    """Send one body as a client other than ours would (a fresh dedup id); returns its MessageId."""
    response = sqs.send_message(
        QueueUrl=queue_url,
        MessageBody=body,
        MessageGroupId=group_id,
        MessageDeduplicationId=uuid.uuid4().hex,
    )
    return str(response["MessageId"])


def settle(pipeline: LocalPipeline) -> EventSourceStats:
    """Wait until the main queue is empty and the writer idle; fail if that takes too long."""
    stats = pipeline.source.drain(until_empty_for_s=1.0, timeout=DRAIN_TIMEOUT_S)
    if not stats.drained:
        raise AssertionError(f"queue not drained in {DRAIN_TIMEOUT_S} s: {pipeline.depth()} left")
    return stats


def replay_and_settle(pipeline: LocalPipeline) -> ReplaySummary:
    """Move everything in the DLQ back to the main queue, then wait for the writer."""
    summary = replay_dlq(
        pipeline.sqs, dlq_url=pipeline.queues.dlq_url, queue_url=pipeline.queues.queue_url
    )
    settle(pipeline)
    return summary


def take_dlq(pipeline: LocalPipeline) -> list[dict[str, Any]]:
    """Receive and delete every DLQ message, with its message attributes."""
    got: list[dict[str, Any]] = []
    while True:
        batch = pipeline.sqs.receive_message(
            QueueUrl=pipeline.queues.dlq_url,
            **receive_kwargs(max_messages=10, wait_time_s=1, visibility_timeout_s=600),
        ).get("Messages", [])
        if not batch:
            return got
        for message in batch:
            # Deleting unlocks the FIFO group, so the group's next message can be received.
            pipeline.sqs.delete_message(
                QueueUrl=pipeline.queues.dlq_url, ReceiptHandle=message["ReceiptHandle"]
            )
        got.extend(batch)


@dataclass
class Fleet:
    """In-process ranks of one job, each a thread-safe :class:`CheckpointReporter`."""

    job_id: str
    reporters: list[CheckpointReporter]
    run_attempt: int = 0
    sent: list[SentReport] = field(default_factory=list)
    report_errors: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def world_size(self) -> int:
        return len(self.reporters)

    def report_step(self, step: int) -> None:
        """Every rank reports ``step`` (from its own thread, as at a checkpoint barrier)."""
        threads = [
            threading.Thread(target=self._report_one, args=(rank, step))
            for rank in range(self.world_size)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def report_steps(self, steps: Iterable[int], *, every_s: float = 0.0) -> None:
        """Report several steps, ``every_s`` apart (the pace of training, not a wait)."""
        pause = threading.Event()
        for step in steps:
            self.report_step(step)
            pause.wait(every_s)

    def _report_one(self, rank: int, step: int) -> None:
        uri = shard_uri(self.job_id, step, rank, self.run_attempt)
        try:
            self.reporters[rank].report(step=step, epoch=step, uri=uri, loss=0.5)
        except Exception as exc:  # recorded: report() must not raise for any fault here
            with self._lock:
                self.report_errors.append(f"rank {rank} step {step}: {type(exc).__name__}: {exc}")
            return
        sent = SentReport(self.job_id, step, rank, self.run_attempt, self.world_size, uri)
        with self._lock:
            self.sent.append(sent)

    def flush(self, timeout: float = 60.0) -> bool:
        """Flush every rank; True when all of them are fully acknowledged."""
        return all(r.flush(timeout) for r in self.reporters)

    @property
    def pending(self) -> list[int]:
        return [r.pending for r in self.reporters]


@contextmanager
def fleet(
    pipeline: LocalPipeline,
    *,
    job_id: str,
    ranks: int,
    spool_dir: Path,
    run_attempt: int = 0,
    endpoint_url: str | None = None,
    **tuning: Any,
) -> Iterator[Fleet]:
    """``ranks`` reporters for ``job_id`` (fast retries: outages here last seconds, not hours)."""
    knobs: dict[str, Any] = {
        "connect_timeout_s": 0.5,
        "read_timeout_s": 2.0,
        "backoff_cap_s": 1.0,
        "close_timeout_s": 30.0,
        **tuning,
    }
    with contextlib.ExitStack() as stack:
        reporters = [
            stack.enter_context(
                CheckpointReporter(
                    pipeline.queues.queue_url,
                    job_id=job_id,
                    spool_dir=spool_dir,
                    rank=rank,
                    world_size=ranks,
                    run_attempt=run_attempt,
                    endpoint_url=endpoint_url or pipeline.endpoint_url,
                    install_signal_handler=False,
                    spot_poll=False,
                    **knobs,
                )
            )
            for rank in range(ranks)
        ]
        yield Fleet(job_id, reporters, run_attempt)

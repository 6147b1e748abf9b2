"""Scenario 7: two writers at concurrency 2 on one job: no deadlock, counts right."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_pipeline.demo.fanin import fanin_step, fanin_uri, run_pipeline_fanin
from ckpt_pipeline.local.db_monitor import PeakConnections
from ckpt_pipeline.local.event_source import EventHandler, LocalEventSource
from ckpt_pipeline.local.pipeline import WRITER_APPLICATION_NAME, LocalPipeline
from lambda_writer import WriterSettings, make_handler
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import LAMBDA_TIMEOUT_S, settle
from tests.e2e.matrix import FaultMatrix, FaultRow
from tests.e2e.oracle import SentReport, check_database, expected_state

pytestmark = pytest.mark.slow

RANKS = 32
CHECKPOINTS = 5
# How long a writer's first invocation waits for the other's before the test gives up.
OVERLAP_TIMEOUT_S = 60.0


class OverlappingWriters:
    """Two writer environments whose first invocations wait for each other (a Barrier(2)).

    Left to thread scheduling, one worker can take every batch of a small burst and the scenario
    quietly tests one writer. Holding each environment's first batch until the other's has
    arrived makes both write the first checkpoint's rows at the same time, on every run.
    """

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2, timeout=OVERLAP_TIMEOUT_S)
        self.overlapped = 0
        self._lock = threading.Lock()
        self._settings: WriterSettings | None = None

    def factory(self) -> EventHandler:
        """One real writer environment (its own connection) with the barrier before batch 1."""
        assert self._settings is not None
        real = make_handler(self._settings, emit_metrics=False)
        first = threading.Event()

        def handler(event: dict[str, Any], context: Any) -> Any:
            if not first.is_set():
                first.set()
                self.barrier.wait()  # BrokenBarrierError fails the batch and the assertion below
                with self._lock:
                    self.overlapped += 1
            return real(event, context)

        return handler

    def event_source(self, pipeline: LocalPipeline) -> LocalEventSource:
        """The pipeline's event source settings, with these two environments as its workers."""
        self._settings = pipeline.writer_settings
        return LocalEventSource(
            pipeline.sqs,
            queue_url=pipeline.queues.queue_url,
            queue_arn=pipeline.queues.queue_arn,
            handler_factory=self.factory,
            max_concurrency=2,
            lambda_timeout_s=LAMBDA_TIMEOUT_S,
            wait_time_s=1,
        )


def _deadlocks(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def test_two_writers_on_one_job(
    pipeline_factory: PipelineFactory, fault_matrix: FaultMatrix, tmp_path: Path
) -> None:
    job = "e2e-two-writers"
    writers = OverlappingWriters()
    with (
        pipeline_factory(concurrency=2, start=False) as unstarted,
        writers.event_source(unstarted) as source,
    ):
        pipeline = dataclasses.replace(unstarted, source=source)
        deadlocks_before = _deadlocks(pipeline.database_url)
        # GIVEN many ranks of one job reporting every checkpoint at the same barrier, so both
        # writers' batches touch the same checkpoint rows at once
        with PeakConnections(pipeline.database_url) as peak:
            result = run_pipeline_fanin(
                pipeline,
                job_id=job,
                ranks=RANKS,
                checkpoints=CHECKPOINTS,
                spool_dir=tmp_path,
                timeout_s=120,
            )
            stats = settle(pipeline)
        writer_peak = peak.peak(WRITER_APPLICATION_NAME)
        deadlocks = _deadlocks(pipeline.database_url) - deadlocks_before
        dlq = pipeline.dlq_depth()

    # What fanin's rank threads report, from its own step and URI scheme.
    sent = [
        SentReport(job, fanin_step(c), r, 0, RANKS, fanin_uri(fanin_step(c), r))
        for c in range(CHECKPOINTS)
        for r in range(RANKS)
    ]
    check = check_database(pipeline.database_url, expected_state(sent))
    fault_matrix.record(
        FaultRow.of(
            "7 two writers, concurrency 2",
            reports_sent=result.reported,
            check=check,
            in_dlq=dlq,
            max_concurrent_invocations=stats.max_concurrent_invocations,
            peak_writer_connections=writer_peak,
            deadlocks=deadlocks,
            batches=stats.batches,
            deliveries=stats.records,
            report_s=round(result.report_seconds, 2),
            all_rows_s=round(result.all_rows_seconds or -1, 2),
        )
    )
    assert not result.errors and result.unflushed_ranks == 0
    assert check.problems == []
    assert check.complete_found == CHECKPOINTS
    assert dlq == 0
    assert deadlocks == 0
    # Both environments' first batches ran at once, each on its own connection
    assert writers.overlapped == 2
    assert stats.max_concurrent_invocations == 2
    assert writer_peak == 2

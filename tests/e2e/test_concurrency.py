"""Scenario 7: two writers at concurrency 2 on one job: no deadlock, counts right."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from ckpt_pipeline.demo.fanin import run_pipeline_fanin
from ckpt_pipeline.local.db_monitor import PeakConnections
from ckpt_pipeline.local.pipeline import WRITER_APPLICATION_NAME
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from tests.e2e.matrix import FaultMatrix, FaultRow
from tests.e2e.oracle import SentReport, check_database, expected_state

pytestmark = pytest.mark.slow

RANKS = 32
CHECKPOINTS = 5


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
    with pipeline_factory(concurrency=2) as pipeline:
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

    # fanin's rank threads report step (c + 1) * 100 with its own URI scheme
    sent = [
        SentReport(job, (c + 1) * 100, r, 0, RANKS, f"file:///fanin/{(c + 1) * 100}/{r}")
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
    assert stats.max_concurrent_invocations == 2
    assert 1 <= writer_peak <= 2

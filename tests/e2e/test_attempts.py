"""Scenario 6: a late stale attempt and shuffled deliveries never regress the database."""

from __future__ import annotations

import random
from pathlib import Path

import psycopg
import pytest

from ckpt_contract import group_id
from ckpt_pipeline.demo.fanin import count_rows
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import e2e_seed, fleet, report_body, send_raw, settle
from tests.e2e.matrix import FaultMatrix, FaultRow
from tests.e2e.oracle import SentReport, check_database, expected_state
from tests.trainer_client.helpers import wait_for

pytestmark = pytest.mark.slow

JOB = "e2e-attempts"
RANKS = 4
RESTARTED_STEPS = range(0, 4)  # reported by attempt 1, then late by attempt 0
STALE_ONLY_STEPS = range(4, 6)  # only attempt 0 ever reached these
SHUFFLED_STEPS = range(6, 10)  # attempts 0..2 in a shuffled order, some resent


def _shuffled_reports(rng: random.Random) -> list[tuple[str, SentReport]]:
    """Attempts 0, 1, 2 of SHUFFLED_STEPS; attempt 2 lacks rank 3 on odd steps (incomplete),
    and a quarter of the bodies are sent twice (a resend after SQS's dedup window)."""
    bodies = []
    for step in SHUFFLED_STEPS:
        for attempt in range(3):
            for rank in range(RANKS):
                if attempt == 2 and step % 2 == 1 and rank == RANKS - 1:
                    continue
                bodies.append(
                    report_body(job_id=JOB, step=step, rank=rank, world_size=RANKS, attempt=attempt)
                )
    bodies += rng.sample(bodies, len(bodies) // 4)
    rng.shuffle(bodies)
    return bodies


def test_stale_and_out_of_order_attempts(
    pipeline_factory: PipelineFactory, fault_matrix: FaultMatrix, tmp_path: Path
) -> None:
    seed = e2e_seed()
    print(f"shuffle seed: {seed} (set CKPT_E2E_SEED={seed} to replay the same order)")
    shuffled = _shuffled_reports(random.Random(seed))
    with pipeline_factory(concurrency=2) as pipeline:
        # GIVEN the restarted job (attempt 1) has written its checkpoints
        with fleet(
            pipeline, job_id=JOB, ranks=RANKS, spool_dir=tmp_path / "new", run_attempt=1
        ) as new:
            new.report_steps(RESTARTED_STEPS)
            assert new.flush(timeout=60)
        n = RANKS * len(RESTARTED_STEPS)
        wait_for(lambda: count_rows(pipeline.database_url, JOB) == (n, len(RESTARTED_STEPS)))
        # WHEN the old attempt's spool is flushed late (its node came back), for the same steps
        # and for two steps the new attempt has not reached
        with fleet(
            pipeline, job_id=JOB, ranks=RANKS, spool_dir=tmp_path / "old", run_attempt=0
        ) as old:
            old.report_steps([*RESTARTED_STEPS, *STALE_ONLY_STEPS])
            assert old.flush(timeout=60)
        # ... and attempts 0..2 of later steps arrive shuffled across groups, batches and writers
        for body, report in shuffled:
            send_raw(
                pipeline.sqs, pipeline.queues.queue_url, body, group_id=group_id(JOB, report.rank)
            )
        stats = settle(pipeline)
        dlq = pipeline.dlq_depth()

    sent = [*new.sent, *old.sent, *(report for _, report in shuffled)]
    expected = expected_state(sent)
    check = check_database(pipeline.database_url, expected)
    with psycopg.connect(pipeline.database_url) as conn:
        latest = conn.execute(
            "SELECT step, run_attempt FROM latest_complete_checkpoints WHERE job_id = %s", (JOB,)
        ).fetchone()
    fault_matrix.record(
        FaultRow.of(
            "6 stale + shuffled attempts",
            reports_sent=len(sent),
            check=check,
            in_dlq=dlq,
            seed=seed,
            deliveries=stats.records,
            max_concurrent_invocations=stats.max_concurrent_invocations,
        )
    )
    # THEN attempt 1 rows are kept, completeness follows the newest attempt of each step
    assert all(expected.checkpoints[(JOB, s)].run_attempt == 1 for s in RESTARTED_STEPS)
    assert [expected.checkpoints[(JOB, s)].is_complete for s in SHUFFLED_STEPS] == [
        True,
        False,
        True,
        False,
    ]
    assert check.problems == []
    assert latest is not None and tuple(latest) == (8, 2)
    assert dlq == 0

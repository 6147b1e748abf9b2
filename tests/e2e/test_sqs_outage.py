"""Scenario 3: SQS unreachable for 30 s mid-run (moto stopped and restarted on its fixed port)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from ckpt_pipeline.demo.fanin import count_rows
from ckpt_pipeline.ops.sqs import sqs_client
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import fleet, settle
from tests.e2e.matrix import FaultMatrix, FaultRow
from tests.e2e.oracle import check_database, expected_state
from tests.trainer_client.helpers import RestartableMoto, wait_for

pytestmark = pytest.mark.slow

RANKS = 4
STEPS_BEFORE = 3
STEPS_DURING = 6
OUTAGE_S = 30.0


def test_sqs_unreachable_for_30_s(
    pipeline_factory: PipelineFactory, fault_matrix: FaultMatrix, tmp_path: Path
) -> None:
    job = "e2e-sqs-outage"
    moto = RestartableMoto()
    moto.start()
    try:
        with (
            pipeline_factory(endpoint_url=moto.endpoint) as pipeline,
            fleet(pipeline, job_id=job, ranks=RANKS, spool_dir=tmp_path) as ranks,
        ):
            # A queue nobody consumes, holding one message: proof that moto's state (queues and
            # their messages) survives the restart, apart from the pipeline's own traffic.
            sqs = sqs_client(moto.endpoint)
            witness = sqs.create_queue(QueueName=f"e2e-witness-{uuid.uuid4().hex[:8]}")["QueueUrl"]
            sqs.send_message(QueueUrl=witness, MessageBody="before the outage")

            # GIVEN a run whose first checkpoints are in the database
            ranks.report_steps(range(STEPS_BEFORE))
            wait_for(
                lambda: count_rows(pipeline.database_url, job)[0] == RANKS * STEPS_BEFORE,
                timeout=30,
            )
            # WHEN SQS is unreachable for 30 s while the ranks keep checkpointing
            moto.stop()
            down_at = time.monotonic()
            latencies: list[float] = []
            steps = range(STEPS_BEFORE, STEPS_BEFORE + STEPS_DURING)
            for step in steps:
                started = time.monotonic()
                ranks.report_step(step)
                latencies.append(time.monotonic() - started)
                time.sleep(OUTAGE_S / (STEPS_DURING + 1))  # the training between checkpoints
            pending_during = ranks.pending
            rows_during = count_rows(pipeline.database_url, job)[0]
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))  # hold it open
            outage_s = time.monotonic() - down_at
            moto.start()
            survived = sqs.receive_message(QueueUrl=witness, WaitTimeSeconds=1).get("Messages")
            # THEN everything spooled meanwhile arrives once SQS is back
            flushed = ranks.flush(timeout=60)
            stats = settle(pipeline)
            dlq = pipeline.dlq_depth()
    finally:
        moto.stop()

    check = check_database(pipeline.database_url, expected_state(ranks.sent))
    fault_matrix.record(
        FaultRow.of(
            "3 SQS unreachable for 30 s",
            reports_sent=len(ranks.sent),
            check=check,
            in_dlq=dlq,
            outage_s=round(outage_s, 1),
            pending_at_end_of_outage=sum(pending_during),
            worst_report_step_s=round(max(latencies), 3),
            deliveries=stats.records,
        )
    )
    assert ranks.report_errors == []  # report() returned every time, SQS down or not
    assert survived and survived[0]["Body"] == "before the outage"
    assert rows_during == RANKS * STEPS_BEFORE  # nothing got through while SQS was down
    assert all(p > 0 for p in pending_during)
    assert flushed
    assert len(ranks.sent) == RANKS * (STEPS_BEFORE + STEPS_DURING)
    assert check.problems == []
    assert check.complete_found == STEPS_BEFORE + STEPS_DURING
    assert dlq == 0

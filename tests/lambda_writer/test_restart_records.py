"""Restart records (``ckpt.restart.v1``) through the real handler and real SQS event shapes: a
valid one is stored once however often it comes; a bad one is parked in the DLQ with its reason,
beside reports that are written; a replay of the DLQ handles it like any report."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import psycopg

from ckpt_contract.restart import RestartRecord, encode_restart, restart_group_id
from ckpt_pipeline.local.sqs_server import PipelineQueues
from ckpt_pipeline.ops.replay import replay_dlq
from tests.lambda_writer.helpers import (
    EventFactory,
    Outgoing,
    body,
    checkpoint_rows,
    dlq_messages,
    invoke,
)


def _record(**overrides: Any) -> str:
    fields: dict[str, Any] = {
        "schema": "ckpt.restart.v1", "job_id": "job-a", "run_attempt": 2, "launch_id": "L2",
        "world_size": 2, "resumed_step": 10, "resumed_run_attempt": 1, "resumed_world_size": 2,
        "skipped": [
            {"step": 30, "kind": "incomplete", "reason": "attempt 1: 1 of 2 ranks reported",
             "missing_ranks": [1]},
            {"step": 20, "kind": "damaged", "reason": "1 of 2 objects differ: rng_state_0.pth"},
        ],
        "skipped_total": 2, "waited_reports": 3, "decided_s": 0.4, "restored_s": 2.5,
        "fetched_bytes": 1000, "max_node_fetched_bytes": 1000, "nodes_fetched": 1,
        "source": "store", "newest_saved_step": 30,
        "created_at": datetime(2026, 1, 1, tzinfo=UTC),
    }  # fmt: skip
    return encode_restart(RestartRecord.model_validate(fields | overrides, strict=False))


def _restarts(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT job_id, run_attempt, launch_id, resumed_step, skipped, newest_saved_step"
            " FROM training_job_restarts ORDER BY 1, 2"
        ).fetchall()


def test_a_restart_record_is_stored_once(writer_env: str, make_event: EventFactory) -> None:
    group = restart_group_id("job-a")
    # WHEN a record and a report arrive in one batch, and the record again later (a re-send)
    event = make_event(
        [Outgoing(_record(), group_id=group), Outgoing(body(world_size=1), group_id="job-a:0")]
    )
    assert invoke(event) == []
    assert invoke(make_event([Outgoing(_record(), group_id=group)])) == []
    # THEN one row, with what the restart skipped and why; the report is written beside it
    ((job, attempt, launch, resumed, skipped, newest),) = _restarts(writer_env)
    assert (job, attempt, launch, resumed, newest) == ("job-a", 2, "L2", 10, 30)
    assert [(s["step"], s["kind"]) for s in skipped] == [(30, "incomplete"), (20, "damaged")]
    assert skipped[0]["missing_ranks"] == [1]
    assert [row[1] for row in checkpoint_rows(writer_env)] == [100]


def test_a_bad_record_is_parked_with_its_reason_and_replayed_like_a_report(
    writer_env: str, make_event: EventFactory, sqs: Any, pipeline_queues: PipelineQueues
) -> None:
    # GIVEN a record whose job id breaks the contract's rule, beside a valid report
    bad = json.loads(_record())
    bad["job_id"] = "job a!"
    text = json.dumps(bad)
    event = make_event(
        [Outgoing(text, group_id="job-a:restart"), Outgoing(body(world_size=1), group_id="g0")]
    )
    # WHEN handled
    assert invoke(event) == []
    # THEN the report is written and the record parked with the field and the rule
    assert [row[1] for row in checkpoint_rows(writer_env)] == [100]
    assert _restarts(writer_env) == []
    (parked,) = dlq_messages(sqs, pipeline_queues, 1)
    attrs = parked["MessageAttributes"]
    assert attrs["ErrorClass"]["StringValue"] == "InvalidMessage"
    assert "invalid ckpt.restart.v1 message: job_id" in attrs["ErrorMessage"]["StringValue"]
    # AND a replay moves it back like any report, and the writer parks it again
    sqs.send_message(
        QueueUrl=pipeline_queues.dlq_url,
        MessageBody=parked["Body"],
        MessageGroupId=parked["Attributes"]["MessageGroupId"],
        MessageDeduplicationId="again",
        MessageAttributes={k: v for k, v in attrs.items() if k != "ReplayCount"},
    )
    summary = replay_dlq(sqs, dlq_url=pipeline_queues.dlq_url, queue_url=pipeline_queues.queue_url)
    assert summary.count("moved") == 1
    got = sqs.receive_message(QueueUrl=pipeline_queues.queue_url, WaitTimeSeconds=1)
    (message,) = got["Messages"]
    assert message["Body"] == text

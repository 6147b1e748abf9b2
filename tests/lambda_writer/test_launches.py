"""The launch guard (migration 0014) through the real handler and real SQS event shapes: a
run_attempt belongs to the launch that reported it first; another launch's report of it is parked
in the DLQ with its reason and never counted, in a batch of its own or beside its neighbours."""

from __future__ import annotations

from typing import Any

import psycopg

from ckpt_pipeline.local.sqs_server import PipelineQueues
from tests.lambda_writer.helpers import (
    EventFactory,
    Outgoing,
    body,
    checkpoint_rows,
    dlq_messages,
    invoke,
    shard_rows,
)


def _launches(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT job_id, run_attempt, launch_id FROM training_job_launches ORDER BY 1, 2"
        ).fetchall()


def test_another_launch_of_the_same_attempt_never_completes_a_checkpoint(
    writer_env: str, make_event: EventFactory, sqs: Any, pipeline_queues: PipelineQueues
) -> None:
    # GIVEN launch L1 reported rank 0 of step 30 at attempt 0 (rank 1 died before its save)
    first = body(step=30, rank=0, world_size=2, run_attempt=0, launch_id="L1", uri="file:///l1/0")
    assert invoke(make_event([Outgoing(first, group_id="job-a:0")])) == []
    # WHEN a second launch that did not number its attempt (attempt 0 again) reports both ranks
    late0 = body(step=30, rank=0, world_size=2, run_attempt=0, launch_id="L2", uri="file:///l2/0")
    late1 = body(step=30, rank=1, world_size=2, run_attempt=0, launch_id="L2", uri="file:///l2/1")
    event = make_event([Outgoing(late0, group_id="job-a:0"), Outgoing(late1, group_id="job-a:1")])
    assert invoke(event) == []
    # THEN step 30 is not complete: no shard of L2 is stored under L1's attempt
    assert checkpoint_rows(writer_env) == [("job-a", 30, 1, 0, 2, 1, False)]
    assert [(s[2], s[6]) for s in shard_rows(writer_env)] == [(0, "file:///l1/0")]
    assert _launches(writer_env) == [("job-a", 0, "L1")]
    # AND both of L2's reports are in the DLQ, each with the reason naming both launches
    parked = dlq_messages(sqs, pipeline_queues, 2)
    assert sorted(m["Body"] for m in parked) == sorted([late0, late1])
    for message in parked:
        attrs = message["MessageAttributes"]
        assert attrs["ErrorClass"]["StringValue"] == "LaunchConflict"
        reason = attrs["ErrorMessage"]["StringValue"]
        assert "launch conflict" in reason and "L1" in reason and "L2" in reason


def test_a_numbered_relaunch_completes_from_its_own_shards_and_a_late_report_stays_its_own(
    writer_env: str, make_event: EventFactory
) -> None:
    # GIVEN launch L1 (attempt 0) left step 30 with rank 0 only
    l1_rank0 = body(step=30, rank=0, world_size=2, run_attempt=0, launch_id="L1", uri="file:///a")
    assert invoke(make_event([Outgoing(l1_rank0, group_id="job-a:0")])) == []
    # WHEN launch L2, numbered attempt 1, saves step 30 on both ranks
    l2 = [
        Outgoing(
            body(step=30, rank=r, world_size=2, run_attempt=1, launch_id="L2", uri=f"file:///b{r}"),
            group_id=f"job-a:{r}",
        )
        for r in (0, 1)
    ]
    assert invoke(make_event(l2)) == []
    # AND launch L1's rank 1 report of step 30 arrives late (its spool sent after L2 started)
    l1_rank1 = body(step=30, rank=1, world_size=2, run_attempt=0, launch_id="L1", uri="file:///c")
    assert invoke(make_event([Outgoing(l1_rank1, group_id="job-a:1")])) == []
    # THEN step 30 is complete from L2's shards only; the late report changed nothing
    assert checkpoint_rows(writer_env) == [("job-a", 30, 1, 1, 2, 2, True)]
    assert [(s[2], s[3], s[6]) for s in shard_rows(writer_env)] == [
        (0, 1, "file:///b0"),
        (1, 1, "file:///b1"),
    ]
    assert _launches(writer_env) == [("job-a", 0, "L1"), ("job-a", 1, "L2")]


def test_two_launches_in_one_batch_write_the_first_and_park_the_other(
    writer_env: str, make_event: EventFactory, sqs: Any, pipeline_queues: PipelineQueues
) -> None:
    # GIVEN one batch holding two launches' reports of attempt 0, and a valid neighbour
    mine = body(step=10, rank=0, world_size=2, run_attempt=0, launch_id="L1")
    other = body(step=10, rank=1, world_size=2, run_attempt=0, launch_id="L2")
    neighbour = body(job_id="job-b", step=10, rank=0, world_size=1, launch_id="LB")
    event = make_event(
        [
            Outgoing(mine, group_id="job-a:0"),
            Outgoing(other, group_id="job-a:1"),
            Outgoing(neighbour, group_id="job-b:0"),
        ]
    )
    # WHEN it is handled
    assert invoke(event) == []
    # THEN the first launch's report and the neighbour are written, the other launch's parked
    assert checkpoint_rows(writer_env) == [
        ("job-a", 10, 1, 0, 2, 1, False),
        ("job-b", 10, 1, 0, 1, 1, True),
    ]
    (parked,) = dlq_messages(sqs, pipeline_queues, 1)
    assert parked["Body"] == other
    assert parked["MessageAttributes"]["ErrorClass"]["StringValue"] == "LaunchConflict"


def test_reports_without_a_launch_are_checked_against_nothing(
    writer_env: str, make_event: EventFactory
) -> None:
    # GIVEN reports of a client before launches (no launch_id) beside one with a launch
    old = body(step=5, rank=0, world_size=2, run_attempt=0)
    new = body(step=5, rank=1, world_size=2, run_attempt=0, launch_id="L1")
    assert '"launch_id"' not in old
    # WHEN handled, THEN both are stored as before (the previous release's rule)
    assert invoke(make_event([Outgoing(old, group_id="job-a:0")])) == []
    assert invoke(make_event([Outgoing(new, group_id="job-a:1")])) == []
    assert checkpoint_rows(writer_env) == [("job-a", 5, 1, 0, 2, 2, True)]

"""replay-dlq against moto's server and the real writer on the real PostgreSQL server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from ckpt_pipeline.cli import main
from ckpt_pipeline.local.event_source import EventHandler, LocalEventSource
from ckpt_pipeline.local.sqs_server import PipelineQueues
from ckpt_pipeline.ops.replay import replay_dlq
from ckpt_pipeline.ops.replay_plan import DlqMessage, ReplayFilter, compile_reason
from ckpt_pipeline.ops.sqs import queue_depth
from tests.ckpt_pipeline.helpers import report, send

_REJECT = "ckpt_test_reject_bad_uri"


def _drain(sqs: Any, queues: PipelineQueues, handler: EventHandler) -> None:
    source = LocalEventSource(
        sqs, queue_url=queues.queue_url, queue_arn=queues.queue_arn, handler=handler, wait_time_s=1
    )
    assert source.drain(until_empty_for_s=0.3, timeout=60).drained


def _poison(sqs: Any, dlq_url: str, body: str, group: str, dedup: str, error: str) -> None:
    """Put a message in the DLQ as the writer does (body unchanged, group kept, reason attrs)."""
    sqs.send_message(
        QueueUrl=dlq_url,
        MessageBody=body,
        MessageGroupId=group,
        MessageDeduplicationId=dedup,
        MessageAttributes={
            "ErrorClass": {"DataType": "String", "StringValue": error},
            "ErrorMessage": {"DataType": "String", "StringValue": f"{error} happened"},
        },
    )


def _shards(url: str) -> list[tuple[str, int, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT job_id, step, rank FROM training_checkpoint_shards ORDER BY 1, 2, 3"
        ).fetchall()
    return [(str(j), int(s), int(r)) for j, s, r in rows]


@pytest.fixture
def rejecting_db(clean_db: str) -> Iterator[str]:
    """The database refuses shards whose uri contains 'bad' until the test drops the check."""
    with psycopg.connect(clean_db, autocommit=True) as conn:
        conn.execute(
            f"ALTER TABLE training_checkpoint_shards ADD CONSTRAINT {_REJECT}"
            " CHECK (uri NOT LIKE '%%bad%%') NOT VALID"
        )
    try:
        yield clean_db
    finally:
        with psycopg.connect(clean_db, autocommit=True) as conn:
            conn.execute(
                f"ALTER TABLE training_checkpoint_shards DROP CONSTRAINT IF EXISTS {_REJECT}"
            )


@pytest.mark.slow
def test_poison_fixed_replayed_is_in_the_db_exactly_once(
    sqs: Any, fast_queues: PipelineQueues, real_writer: EventHandler, rejecting_db: str
) -> None:
    good = report("job-a", 10, 0)
    bad = report("job-a", 10, 1).replace("/1.pt", "/bad-1.pt")
    send(sqs, fast_queues.queue_url, [(good, "job-a:0", "g0"), (bad, "job-a:1", "g1")])
    # GIVEN the writer dead-lettered the record the database refused
    _drain(sqs, fast_queues, real_writer)
    assert _shards(rejecting_db) == [("job-a", 10, 0)]
    listed = replay_dlq(sqs, dlq_url=fast_queues.dlq_url, queue_url=None, dry_run=True)
    assert listed.would_move == 1
    assert "CheckViolation" in listed.items[0].message.reason or _REJECT in (
        listed.items[0].message.reason
    )
    # WHEN the cause is fixed and the message replayed
    with psycopg.connect(rejecting_db, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE training_checkpoint_shards DROP CONSTRAINT {_REJECT}")
    summary = replay_dlq(sqs, dlq_url=fast_queues.dlq_url, queue_url=fast_queues.queue_url)
    assert (summary.moved, summary.failed) == (1, 0)
    _drain(sqs, fast_queues, real_writer)
    # THEN it is written once, the checkpoint is complete and both queues are empty
    assert _shards(rejecting_db) == [("job-a", 10, 0), ("job-a", 10, 1)]
    with psycopg.connect(rejecting_db) as conn:
        assert conn.execute("SELECT is_complete FROM training_checkpoints").fetchall() == [(True,)]
    assert queue_depth(sqs, fast_queues.dlq_url).total == 0
    assert queue_depth(sqs, fast_queues.queue_url).total == 0


class Interrupted(Exception):
    pass


def _crash_after_send(message: DlqMessage) -> None:
    raise Interrupted(message.message_id)


@pytest.mark.parametrize("consumed_before_rerun", [False, True])
def test_interrupted_replay_rerun_loses_nothing_and_duplicates_nothing(
    sqs: Any,
    fast_queues: PipelineQueues,
    real_writer: EventHandler,
    clean_db: str,
    consumed_before_rerun: bool,
) -> None:
    bodies = [report("job-b", 5, rank) for rank in range(2)]
    for rank, body in enumerate(bodies):
        _poison(sqs, fast_queues.dlq_url, body, f"job-b:{rank}", f"orig-{rank}", "Transient")
    # WHEN the replay dies after sending, before deleting from the DLQ
    with pytest.raises(Interrupted):
        replay_dlq(
            sqs,
            dlq_url=fast_queues.dlq_url,
            queue_url=fast_queues.queue_url,
            after_send=_crash_after_send,
        )
    assert queue_depth(sqs, fast_queues.dlq_url).total == 2  # nothing deleted yet
    if consumed_before_rerun:
        # The sent copies were written before the re-run (so moto cannot dedup them).
        _drain(sqs, fast_queues, real_writer)
    # AND it is run again
    summary = replay_dlq(sqs, dlq_url=fast_queues.dlq_url, queue_url=fast_queues.queue_url)
    assert (summary.moved, summary.failed) == (2, 0)
    if not consumed_before_rerun:
        # The same dedup ids were re-sent while the first copies were queued: SQS dropped them.
        assert queue_depth(sqs, fast_queues.queue_url).visible == 2
    _drain(sqs, fast_queues, real_writer)
    # THEN each shard is in the database exactly once and the DLQ is empty
    assert _shards(clean_db) == [("job-b", 5, 0), ("job-b", 5, 1)]
    assert queue_depth(sqs, fast_queues.dlq_url).total == 0


def test_filters_move_only_what_matches_and_dry_run_moves_nothing(
    sqs: Any, fast_queues: PipelineQueues
) -> None:
    _poison(sqs, fast_queues.dlq_url, report("job-x", 1, 0), "job-x:0", "x0", "InvalidMessage")
    _poison(sqs, fast_queues.dlq_url, report("job-y", 1, 0), "job-y:0", "y0", "InvalidMessage")
    _poison(sqs, fast_queues.dlq_url, "not json at all", "junk:0", "z0", "DecodeError")
    dry = replay_dlq(sqs, dlq_url=fast_queues.dlq_url, queue_url=None, dry_run=True)
    assert (dry.would_move, dry.moved) == (3, 0)
    assert queue_depth(sqs, fast_queues.dlq_url).visible == 3  # released again, not hidden

    by_job = replay_dlq(
        sqs,
        dlq_url=fast_queues.dlq_url,
        queue_url=fast_queues.queue_url,
        replay_filter=ReplayFilter(job="job-x"),
    )
    assert (by_job.moved, by_job.skipped) == (1, 2)
    by_reason = replay_dlq(
        sqs,
        dlq_url=fast_queues.dlq_url,
        queue_url=fast_queues.queue_url,
        replay_filter=ReplayFilter(reason=compile_reason("decode")),
    )
    assert (by_reason.moved, by_reason.skipped) == (1, 1)
    moved = sqs.receive_message(
        QueueUrl=fast_queues.queue_url,
        MaxNumberOfMessages=10,
        MessageSystemAttributeNames=["All"],
        MessageAttributeNames=["All"],
    )["Messages"]
    by_group = {m["Attributes"]["MessageGroupId"]: m for m in moved}
    assert set(by_group) == {"job-x:0", "junk:0"}
    assert by_group["job-x:0"]["Attributes"]["MessageDeduplicationId"] == "x0:replay:1"
    assert by_group["job-x:0"]["MessageAttributes"]["ReplayCount"]["StringValue"] == "1"
    assert "ErrorClass" not in by_group["job-x:0"]["MessageAttributes"]
    assert by_group["junk:0"]["Body"] == "not json at all"
    assert queue_depth(sqs, fast_queues.dlq_url).visible == 1  # job-y stays


def test_cli_limit_and_exit_codes(sqs: Any, fast_queues: PipelineQueues) -> None:
    for i in range(3):
        _poison(sqs, fast_queues.dlq_url, report("job-l", i, 0), f"job-l:{i}", f"l{i}", "E")
    dlq = ["--dlq-url", fast_queues.dlq_url]
    assert main(["-q", "replay-dlq", *dlq, "--dry-run"]) == 0
    moved = ["--queue-url", fast_queues.queue_url, "--limit", "2"]
    assert main(["-q", "replay-dlq", *dlq, *moved]) == 0
    assert queue_depth(sqs, fast_queues.dlq_url).visible == 1
    missing = fast_queues.queue_url.rsplit("/", 1)[0] + "/no-such-queue.fifo"
    assert main(["-q", "replay-dlq", *dlq, "--queue-url", missing]) == 1  # failed, kept in DLQ
    assert queue_depth(sqs, fast_queues.dlq_url).visible == 1


def test_cli_names_the_missing_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DLQ_URL", raising=False)
    assert main(["replay-dlq", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "DLQ_URL" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def _ctrl_c_after_send(message: DlqMessage) -> None:
    raise KeyboardInterrupt


def test_a_hard_interrupt_between_send_and_delete_releases_and_reports(
    sqs: Any, fast_queues: PipelineQueues
) -> None:
    for rank in range(3):
        _poison(
            sqs,
            fast_queues.dlq_url,
            report("job-k", 1, rank, world_size=3),
            f"job-k:{rank}",
            f"k{rank}",
            "E",
        )
    # WHEN a second Ctrl-C lands after the first batch was sent, before it was deleted
    summary = replay_dlq(
        sqs,
        dlq_url=fast_queues.dlq_url,
        queue_url=fast_queues.queue_url,
        after_send=_ctrl_c_after_send,
    )
    # THEN the run says so, and nothing is left invisible in the DLQ
    assert summary.interrupted and summary.moved == 0
    assert summary.left is not None and (summary.left.visible, summary.left.in_flight) == (3, 0)
    assert summary.not_reached == 3
    # AND a re-run re-sends the same dedup ids (dropped as duplicates) and empties the DLQ
    again = replay_dlq(sqs, dlq_url=fast_queues.dlq_url, queue_url=fast_queues.queue_url)
    assert (again.moved, again.failed, again.not_reached, again.interrupted) == (3, 0, 0, False)
    assert queue_depth(sqs, fast_queues.queue_url).visible == 3
    assert queue_depth(sqs, fast_queues.dlq_url).total == 0


def _sent_at(sqs: Any, dlq_url: str) -> dict[str, int]:
    """Each DLQ message's SentTimestamp (ms; SQS's enqueue time) by body; released again."""
    got = sqs.receive_message(
        QueueUrl=dlq_url, MaxNumberOfMessages=10, VisibilityTimeout=30,
        MessageSystemAttributeNames=["SentTimestamp"],
    )["Messages"]  # fmt: skip
    sqs.change_message_visibility_batch(
        QueueUrl=dlq_url,
        Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
            for i, m in enumerate(got)
        ],
    )
    return {m["Body"]: int(m["Attributes"]["SentTimestamp"]) for m in got}


@pytest.mark.slow
def test_a_dry_run_restarts_the_retention_of_what_it_lists(
    sqs: Any, fast_queues: PipelineQueues
) -> None:
    # docs/operations.md (Replaying the DLQ): receiving and releasing keeps a message's enqueue
    # time (SentTimestamp, what SQS's retention counts from), but a dry run re-queues each listed
    # message, so its copy is enqueued anew.
    _poison(sqs, fast_queues.dlq_url, report("job-r", 1, 0), "job-r:0", "r0", "InvalidMessage")
    before = _sent_at(sqs, fast_queues.dlq_url)
    assert _sent_at(sqs, fast_queues.dlq_url) == before  # receive + release: unchanged
    dry = replay_dlq(sqs, dlq_url=fast_queues.dlq_url, queue_url=None, dry_run=True)
    assert dry.would_move == 1
    after = _sent_at(sqs, fast_queues.dlq_url)
    assert after.keys() == before.keys()
    [(body, sent)] = before.items()
    assert after[body] > sent

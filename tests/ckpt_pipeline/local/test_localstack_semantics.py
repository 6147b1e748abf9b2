"""What only LocalStack's SQS can show locally (moto does neither), recorded as emulator facts.

* The 5-minute deduplication window outlives a delete (moto forgets the id once the message is
  deleted). AWS: "If a message with a particular message deduplication ID is sent successfully,
  any messages sent with the same message deduplication ID are accepted successfully but aren't
  delivered during the 5-minute deduplication interval."
  https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_SendMessage.html
* ``StartMessageMoveTask`` from the FIFO DLQ: what a move keeps (group ids, order, the
  deduplication id) and what that means for a redrive back into the source queue. AWS replaces
  the deduplication id with the original message id when a message goes to a FIFO DLQ, so a
  redrive is not deduplicated against the original send; LocalStack 4.14 keeps the original id,
  so within 5 minutes of the send its redrive to the source is silently dropped. A replay
  against LocalStack must not read that as data loss in the pipeline, nor count on it on AWS.
  https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-configure-dead-letter-queue-redrive.html
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from ckpt_pipeline.local.sqs_server import PipelineQueues, create_pipeline_queues
from ckpt_pipeline.ops.sqs import queue_depth, sqs_client

_ALL = {"AttributeNames": ["All"], "MessageSystemAttributeNames": ["All"]}


@pytest.fixture
def ls(localstack_endpoint: str) -> Any:
    return sqs_client(localstack_endpoint)


def _queues(sqs: Any) -> PipelineQueues:
    # maxReceiveCount 1 and a 1 s visibility timeout: one unacknowledged receive dead-letters.
    return create_pipeline_queues(
        sqs, prefix=f"ls{uuid.uuid4().hex[:8]}", max_receive_count=1, visibility_timeout_s=1
    )


def _receive_all(sqs: Any, url: str, expected: int, timeout_s: float = 15.0) -> list[Any]:
    """Receive (and delete) until ``expected`` messages came or ``timeout_s`` passed."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < expected and time.monotonic() < deadline:
        msgs = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, **_ALL
        ).get("Messages", [])
        for m in msgs:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        got.extend(msgs)
    return got


def _send(sqs: Any, url: str, items: list[tuple[str, str, str]]) -> list[str]:
    """(body, group, dedup id) each; the message ids."""
    return [
        sqs.send_message(QueueUrl=url, MessageBody=b, MessageGroupId=g, MessageDeduplicationId=d)[
            "MessageId"
        ]
        for b, g, d in items
    ]


def _dead_letter(sqs: Any, q: PipelineQueues, count: int) -> list[Any]:
    """Receive without deleting until all ``count`` sit in the DLQ; the DLQ's copies (peeked)."""
    deadline = time.monotonic() + 30
    while queue_depth(sqs, q.dlq_url).visible < count and time.monotonic() < deadline:
        sqs.receive_message(QueueUrl=q.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
    msgs = sqs.receive_message(
        QueueUrl=q.dlq_url, MaxNumberOfMessages=10, VisibilityTimeout=0, **_ALL
    ).get("Messages", [])
    assert len(msgs) == count
    return list(msgs)


def _move(sqs: Any, source_arn: str, destination_arn: str) -> dict[str, Any]:
    sqs.start_message_move_task(SourceArn=source_arn, DestinationArn=destination_arn)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        (task,) = sqs.list_message_move_tasks(SourceArn=source_arn, MaxResults=1)["Results"]
        if task["Status"] != "RUNNING":
            return dict(task)
        time.sleep(0.1)
    raise AssertionError("move task still running after 30 s")


def test_dedup_id_holds_after_delete(ls: Any) -> None:
    q = _queues(ls)
    (first,) = _send(ls, q.queue_url, [("a", "g", "dedup-1")])
    (got,) = _receive_all(ls, q.queue_url, 1)
    assert got["MessageId"] == first
    # Deleted, and sent again within 5 minutes: accepted (same id back), never delivered.
    (again,) = _send(ls, q.queue_url, [("a", "g", "dedup-1")])
    assert again == first
    assert _receive_all(ls, q.queue_url, 1, timeout_s=3) == []
    (other,) = _send(ls, q.queue_url, [("b", "g", "dedup-2")])
    assert [m["MessageId"] for m in _receive_all(ls, q.queue_url, 1)] == [other]


def test_dead_letter_copy_keeps_group_dedup_id_and_names_its_source(ls: Any) -> None:
    q = _queues(ls)
    ids = _send(ls, q.queue_url, [("a", "g1", "d-a"), ("b", "g2", "d-b")])
    dlq = {m["Body"]: m for m in _dead_letter(ls, q, 2)}
    for (body, group, dedup), mid in zip(
        [("a", "g1", "d-a"), ("b", "g2", "d-b")], ids, strict=True
    ):
        attrs = dlq[body]["Attributes"]
        assert attrs["MessageGroupId"] == group
        assert attrs["DeadLetterQueueSourceArn"] == q.queue_arn  # moto omits this
        # LocalStack keeps the sender's dedup id; AWS would put the message id (mid) here.
        assert attrs["MessageDeduplicationId"] == dedup != mid


def test_move_to_fresh_fifo_queue_keeps_groups_order_and_dedup_ids(ls: Any) -> None:
    q = _queues(ls)
    items = [(f"m{i}", f"g{i % 2}", f"d{i}") for i in range(6)]
    _send(ls, q.queue_url, items)
    _dead_letter(ls, q, len(items))
    target = create_pipeline_queues(ls, prefix=f"to{uuid.uuid4().hex[:8]}")
    task = _move(ls, q.dlq_arn, target.queue_arn)
    assert task["Status"] == "COMPLETED" and task["ApproximateNumberOfMessagesMoved"] == 6
    moved = _receive_all(ls, target.queue_url, 6)
    assert sorted(m["Body"] for m in moved) == [b for b, _, _ in items]
    for group in ("g0", "g1"):
        in_group = [m for m in moved if m["Attributes"]["MessageGroupId"] == group]
        # Order within a group survives the move.
        assert [m["Body"] for m in in_group] == [b for b, g, _ in items if g == group]
    assert {m["Attributes"]["MessageDeduplicationId"] for m in moved} == {d for _, _, d in items}
    assert queue_depth(ls, q.dlq_url).total == 0


def test_move_back_to_source_within_dedup_window_is_dropped_by_localstack(ls: Any) -> None:
    q = _queues(ls)
    _send(ls, q.queue_url, [("a", "g", "d-a"), ("b", "g", "d-b")])
    _dead_letter(ls, q, 2)
    task = _move(ls, q.dlq_arn, q.queue_arn)
    # The task says both moved and the DLQ is empty ...
    assert task["Status"] == "COMPLETED" and task["ApproximateNumberOfMessagesMoved"] == 2
    assert queue_depth(ls, q.dlq_url).total == 0
    # ... but the source queue deduplicated them against the original sends (kept dedup ids):
    # on LocalStack a redrive to the source inside 5 minutes loses them. Replay tests on
    # LocalStack must move to a fresh queue or re-send with new dedup ids.
    assert _receive_all(ls, q.queue_url, 2, timeout_s=3) == []

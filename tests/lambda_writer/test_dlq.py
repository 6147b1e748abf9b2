"""The DLQ sender against moto: batches, per-entry and whole-call failures, dedup by messageId."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

from ckpt_pipeline.local.sqs_server import PipelineQueues
from lambda_writer.shared.aws import WRITER_BUDGET
from lambda_writer.writer.dlq import DeadLetterQueue, dead_letter_queue
from lambda_writer.writer.records import Poison, SqsMessage
from tests.lambda_writer.helpers import dlq_messages


def _poison(message_id: str, text: str, group: str = "job-a:0") -> Poison:
    message = SqsMessage(
        message_id=message_id,
        body=text,
        group_id=group,
        receive_count=1,
        first_receive_ms=1767225600000,
        sequence_number="1",
        source_arn="arn:aws:sqs:us-east-1:000000000000:t-checkpoints.fifo",
    )
    return Poison(message, "UndecodableBody", "not JSON")


def test_many_poison_records_in_batches(sqs: Any, pipeline_queues: PipelineQueues) -> None:
    dlq = DeadLetterQueue(sqs, pipeline_queues.dlq_url)
    poisons = [_poison(f"m-{i}", f"bad {i}", group=f"g{i % 3}") for i in range(13)]
    assert dlq.send(poisons) == set()
    got = dlq_messages(sqs, pipeline_queues, 13)
    assert sorted(m["Body"] for m in got) == sorted(f"bad {i}" for i in range(13))


def test_too_large_entry_fails_alone(sqs: Any, pipeline_queues: PipelineQueues) -> None:
    # GIVEN a record whose body plus reason no longer fits SQS's 1 MiB message limit
    huge = _poison("m-huge", "x" * (1024 * 1024 + 1))
    small = _poison("m-small", "tiny", group="other")
    # WHEN sent, THEN only the huge one is reported back (it reaches the DLQ via maxReceiveCount)
    assert DeadLetterQueue(sqs, pipeline_queues.dlq_url).send([small, huge]) == {"m-huge"}
    (got,) = dlq_messages(sqs, pipeline_queues, 1)
    assert got["Body"] == "tiny"


def test_resend_of_the_same_record_is_deduplicated(
    sqs: Any, pipeline_queues: PipelineQueues
) -> None:
    dlq = DeadLetterQueue(sqs, pipeline_queues.dlq_url)
    assert dlq.send([_poison("m-1", "bad")]) == set()
    assert dlq.send([_poison("m-1", "bad")]) == set()
    assert len(dlq_messages(sqs, pipeline_queues, 1)) == 1
    again = sqs.receive_message(QueueUrl=pipeline_queues.dlq_url, WaitTimeSeconds=0)
    assert again.get("Messages", []) == []


def test_a_stalled_sqs_endpoint_costs_the_budget_not_botocores_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN an "SQS endpoint" that accepts connections and never answers (a black hole)
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    # (AWS_MAX_ATTEMPTS / AWS_RETRY_MODE in the environment must not widen the budget)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "10")
    dlq = dead_letter_queue(f"http://127.0.0.1:{port}/000000000000/q.fifo", region="us-east-1")
    try:
        # WHEN a poison record is sent, THEN it is reported back as not sent, after exactly the
        # budget's attempts (botocore's defaults would wait 60 s per attempt, 3 attempts)
        assert dlq.send([_poison("m-1", "bad")]) == {"m-1"}
        assert len(accepted) == WRITER_BUDGET.total_max_attempts
    finally:
        listener.close()
        for conn in accepted:
            conn.close()


def test_the_dlq_client_carries_the_writer_budget() -> None:
    sqs = dead_letter_queue("https://sqs.us-east-1.amazonaws.com/1/q.fifo", region="us-east-1")
    config = sqs._sqs.meta.config
    assert (config.connect_timeout, config.read_timeout) == (
        WRITER_BUDGET.connect_timeout_s,
        WRITER_BUDGET.read_timeout_s,
    )
    assert config.retries == {"total_max_attempts": 2, "mode": "standard"}

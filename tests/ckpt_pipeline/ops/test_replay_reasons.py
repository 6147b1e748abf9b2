"""Issue 32 §6: replay-dlq shows whole reasons (wrapped, or --json), and never moves a message
twice when a writer running beside it dead-letters the moved message again."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ckpt_pipeline.cli import main
from ckpt_pipeline.local.event_source import EventHandler, LocalEventSource
from ckpt_pipeline.local.sqs_server import PipelineQueues
from ckpt_pipeline.ops.replay import CAME_BACK, replay_dlq
from ckpt_pipeline.ops.replay_plan import DlqMessage
from ckpt_pipeline.ops.replay_view import listing_lines
from ckpt_pipeline.ops.sqs import queue_depth

LONG = "ValidationError: " + " ".join(f"field{i} must be a finite number" for i in range(12))


def _poison(sqs: Any, dlq_url: str, body: str, dedup: str, message: str) -> None:
    sqs.send_message(
        QueueUrl=dlq_url,
        MessageBody=body,
        MessageGroupId="g:0",
        MessageDeduplicationId=dedup,
        MessageAttributes={
            "ErrorClass": {"DataType": "String", "StringValue": "InvalidMessage"},
            "ErrorMessage": {"DataType": "String", "StringValue": message},
        },
    )


def test_reasons_are_whole_wrapped_at_80_columns_and_in_json(
    sqs: Any, fast_queues: PipelineQueues, capsys: pytest.CaptureFixture[str]
) -> None:
    _poison(sqs, fast_queues.dlq_url, "not json", "r0", LONG)
    argv = ["-q", "replay-dlq", "--dlq-url", fast_queues.dlq_url, "--dry-run", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    (message,) = doc["messages"]
    assert message["reason"].endswith(LONG) and message["outcome"] == "would-move"
    summary = replay_dlq(sqs, dlq_url=fast_queues.dlq_url, queue_url=None, dry_run=True)
    lines = listing_lines(summary, dry_run=True, width=80)
    assert all(len(line) <= 80 for line in lines), lines
    assert " ".join(" ".join(lines[2:]).split()).endswith(" ".join(LONG.split()))


def test_a_message_a_running_writer_sends_back_is_not_moved_twice(
    sqs: Any, fast_queues: PipelineQueues, real_writer: EventHandler
) -> None:
    # GIVEN a DLQ message that is still poison (the writer will dead-letter it again)
    _poison(sqs, fast_queues.dlq_url, "still not json", "p0", "DecodeError: not JSON")

    def writer_runs_beside(message: DlqMessage) -> None:
        # A poller beside the replay: it receives the moved message and dead-letters it again.
        source = LocalEventSource(
            sqs,
            queue_url=fast_queues.queue_url,
            queue_arn=fast_queues.queue_arn,
            handler=real_writer,
            wait_time_s=1,
        )
        assert source.drain(until_empty_for_s=0.3, timeout=60).drained
        assert queue_depth(sqs, fast_queues.dlq_url).total == 2  # the copy is back

    # WHEN the replay runs THEN it moves it once, and leaves the copy that came back
    summary = replay_dlq(
        sqs,
        dlq_url=fast_queues.dlq_url,
        queue_url=fast_queues.queue_url,
        after_send=writer_runs_beside,
    )
    assert (summary.moved, summary.skipped) == (1, 1), summary.items
    assert summary.items[1].detail == CAME_BACK
    assert queue_depth(sqs, fast_queues.queue_url).total == 0
    assert queue_depth(sqs, fast_queues.dlq_url).visible == 1

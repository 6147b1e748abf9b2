"""SQS's own redrive (``StartMessageMoveTask``) as the fast path for "move everything".

Used only with no filter, no limit and no dry run, and only when the first messages of the DLQ
show that SQS's move cannot be silently dropped by the main queue's deduplication
(:func:`ckpt_pipeline.ops.replay_plan.move_task_refusal`). When the API is missing (moto) or
refused, or the check fails, the caller falls back to the custom path, which always re-keys.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ckpt_pipeline.ops.replay_plan import DlqMessage, move_task_refusal
from ckpt_pipeline.ops.sqs import QueueDepth, queue_arn_of, queue_depth

_SAMPLE_RECEIVES = 10
_SAMPLE_VISIBILITY_S = 30
_POLL_S = 0.5


@dataclass(frozen=True)
class MoveTaskResult:
    """How SQS's move task ended and what is left in the DLQ after it."""

    status: str  # COMPLETED, CANCELLED or FAILED
    moved: int
    failure: str | None
    left: QueueDepth
    interrupted: bool


def _sample(sqs: Any, dlq_url: str) -> tuple[list[DlqMessage], bool]:
    """The first messages of each group (received, then released); whether that was all."""
    before = queue_depth(sqs, dlq_url)
    sample: list[DlqMessage] = []
    try:
        for _ in range(_SAMPLE_RECEIVES):
            got = sqs.receive_message(
                QueueUrl=dlq_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=0,
                VisibilityTimeout=_SAMPLE_VISIBILITY_S,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            ).get("Messages", [])
            if not got:
                break
            sample.extend(DlqMessage.from_sqs(m) for m in got)
    finally:
        for start in range(0, len(sample), 10):
            sqs.change_message_visibility_batch(
                QueueUrl=dlq_url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m.receipt_handle, "VisibilityTimeout": 0}
                    for i, m in enumerate(sample[start : start + 10])
                ],
            )
    return sample, len(sample) == before.total


def move_with_sqs_task(
    sqs: Any,
    *,
    dlq_url: str,
    queue_url: str,
    should_stop: Callable[[], bool] = lambda: False,
) -> MoveTaskResult | str:
    """Move the whole DLQ with ``StartMessageMoveTask``; a string says why it was not used."""
    sample, whole = _sample(sqs, dlq_url)
    refusal = move_task_refusal(sample, whole_dlq=whole)
    if refusal is not None:
        return refusal
    dlq_arn, queue_arn = queue_arn_of(sqs, dlq_url), queue_arn_of(sqs, queue_url)
    try:
        handle = sqs.start_message_move_task(SourceArn=dlq_arn, DestinationArn=queue_arn)[
            "TaskHandle"
        ]
    except (BotoCoreError, ClientError) as exc:
        code = exc.response.get("Error", {}).get("Code", "") if isinstance(exc, ClientError) else ""
        return f"StartMessageMoveTask unavailable ({code or type(exc).__name__})"
    interrupted = False
    pause = threading.Event()
    while True:
        try:
            tasks = sqs.list_message_move_tasks(SourceArn=dlq_arn, MaxResults=1)["Results"]
            task = tasks[0] if tasks else {"Status": "FAILED", "FailureReason": "task not listed"}
            if task["Status"] != "RUNNING":
                break
            if should_stop() and not interrupted:
                interrupted = True
                _cancel(sqs, handle)
            pause.wait(_POLL_S)
        except KeyboardInterrupt:
            if interrupted:
                raise
            interrupted = True
            _cancel(sqs, handle)
    return MoveTaskResult(
        status=str(task["Status"]),
        moved=int(task.get("ApproximateNumberOfMessagesMoved", 0)),
        failure=task.get("FailureReason"),
        left=queue_depth(sqs, dlq_url),
        interrupted=interrupted,
    )


def _cancel(sqs: Any, handle: str) -> None:
    """Stop what is not moved yet (what moved stays moved); a task that just ended is fine."""
    # A task no longer RUNNING refuses the cancel: the status read next says how it ended.
    with contextlib.suppress(ClientError):
        sqs.cancel_message_move_task(TaskHandle=handle)

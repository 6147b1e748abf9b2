"""Issue 12 §2, §4: `replay-dlq` complete and truthful, run as a subprocess.

Each test runs the console script against an SQS stand-in (moto and/or LocalStack) and checks the
exit code, the last line, and where every message is afterwards (DLQ visible / in flight, main
queue).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from ckpt_contract.dlq import dlq_dedup_id
from ckpt_pipeline.local.sqs_server import PipelineQueues, create_pipeline_queues
from ckpt_pipeline.ops.replay import replay_dlq
from ckpt_pipeline.ops.replay_plan import NO_REASON
from ckpt_pipeline.ops.sqs import QueueDepth, queue_depth, sqs_client

CONSOLE_SCRIPT = Path(sys.executable).parent / "ckpt-pipeline"
RANKS = 4
PER_RANK = 50


def _env(endpoint: str) -> dict[str, str]:
    return {**os.environ, "AWS_ENDPOINT_URL": endpoint, "COLUMNS": "80"}


def _run(endpoint: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CONSOLE_SCRIPT), "replay-dlq", *argv],
        env=_env(endpoint),
        capture_output=True,
        text=True,
        timeout=240,
    )


def _queues(endpoint: str, *, max_receive_count: int = 3) -> tuple[Any, PipelineQueues]:
    sqs = sqs_client(endpoint)
    prefix = f"r{uuid.uuid4().hex[:10]}"
    return sqs, create_pipeline_queues(
        sqs, prefix=prefix, visibility_timeout_s=30, max_receive_count=max_receive_count
    )


def _body(rank: int, step: int) -> str:
    return json.dumps({"job_id": f"job-{rank % 2}", "step": step, "rank": rank})


def _fill_dlq(
    sqs: Any, dlq_url: str, *, poison_from_writer: bool = False, per_rank: int = PER_RANK
) -> None:
    """RANKS groups of ``per_rank`` messages, as the writer's poison or with no reason at all."""
    for rank in range(RANKS):
        for start in range(0, per_rank, 10):
            entries = []
            for step in range(start, start + 10):
                original_id = f"orig-{rank}-{step}-{uuid.uuid4().hex[:6]}"
                entry: dict[str, Any] = {
                    "Id": str(step - start),
                    "MessageBody": _body(rank, step),
                    "MessageGroupId": f"job-{rank % 2}:{rank}",
                    "MessageDeduplicationId": f"d-{rank}-{step}",
                }
                if poison_from_writer:
                    entry["MessageDeduplicationId"] = dlq_dedup_id(original_id)
                    entry["MessageAttributes"] = {
                        "ErrorClass": {"DataType": "String", "StringValue": "InvalidMessage"},
                        "ErrorMessage": {"DataType": "String", "StringValue": "loss: not finite"},
                        "OriginalMessageId": {"DataType": "String", "StringValue": original_id},
                    }
                entries.append(entry)
            assert not sqs.send_message_batch(QueueUrl=dlq_url, Entries=entries).get("Failed")


def _dead_letter_by_max_receive(sqs: Any, queues: PipelineQueues, count: int) -> None:
    """Redrive by SQS itself (maxReceiveCount 1): receive, make visible again, receive again."""
    for start in range(0, count, 10):
        sqs.send_message_batch(
            QueueUrl=queues.queue_url,
            Entries=[
                {
                    "Id": str(i),
                    "MessageBody": _body(i % RANKS, start + i),
                    "MessageGroupId": f"t:{(start + i) % RANKS}",
                    "MessageDeduplicationId": f"t-{start + i}",
                }
                for i in range(min(10, count - start))
            ],
        )
    while queue_depth(sqs, queues.queue_url).total:
        # VisibilityTimeout=0 hands each message straight back; the next receive exceeds
        # maxReceiveCount and SQS moves it to the DLQ.
        sqs.receive_message(QueueUrl=queues.queue_url, MaxNumberOfMessages=10, VisibilityTimeout=0)
    assert queue_depth(sqs, queues.dlq_url).total == count


def _last(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout.strip().splitlines()[-1]


# 4 ranks x 50 on LocalStack; moto's sends slow with queue depth, so 4 x 20 there (still more
# than the 10 a group shows at once).
@pytest.mark.slow
@pytest.mark.parametrize(("kind", "per_rank"), [("localstack", PER_RANK), ("moto", 20)])
def test_dry_run_sees_every_message_of_every_group(
    request: pytest.FixtureRequest, kind: str, per_rank: int
) -> None:
    sqs_endpoint = str(request.getfixturevalue(f"{kind}_endpoint"))
    total = RANKS * per_rank
    sqs, queues = _queues(sqs_endpoint)
    _fill_dlq(sqs, queues.dlq_url, per_rank=per_rank)
    result = _run(sqs_endpoint, "--dry-run", "--dlq-url", queues.dlq_url)
    assert result.returncode == 0, result.stderr
    assert _last(result) == f"dry run: {total} would move, 0 skipped; {total} left in the DLQ"
    rows = [line for line in result.stdout.splitlines() if "would-move" in line]
    assert len(rows) == total
    assert all(len(line) <= 80 for line in result.stdout.splitlines())
    assert sum(NO_REASON in row for row in rows) == total
    # Every message is back in the DLQ, visible, nothing in the main queue ...
    assert queue_depth(sqs, queues.dlq_url) == QueueDepth(visible=total, in_flight=0, delayed=0)
    assert queue_depth(sqs, queues.queue_url).total == 0
    # ... each group in its original order (a second listing, in process, shows it).
    again = replay_dlq(sqs, dlq_url=queues.dlq_url, queue_url=None, dry_run=True)
    steps: dict[str, list[int]] = {}
    for item in again.items:
        steps.setdefault(str(item.message.group_id), []).append(
            json.loads(item.message.body)["step"]
        )
    assert steps == {f"job-{r % 2}:{r}": list(range(per_rank)) for r in range(RANKS)}
    # The replay identity survives the re-queueing: the first DLQ dedup id, numbered.
    assert {i.new_dedup_id for i in again.items} == {
        f"d-{r}-{s}:replay:1" for r in range(RANKS) for s in range(per_rank)
    }


@pytest.mark.slow
def test_sigint_releases_reports_and_a_rerun_is_truthful(moto_endpoint: str) -> None:
    sqs, queues = _queues(moto_endpoint)
    _fill_dlq(sqs, queues.dlq_url)
    argv = ["--dlq-url", queues.dlq_url, "--queue-url", queues.queue_url]
    proc = subprocess.Popen(
        [str(CONSOLE_SCRIPT), "replay-dlq", *argv],
        env=_env(moto_endpoint),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # WHEN Ctrl-C arrives once some messages have moved
    while queue_depth(sqs, queues.queue_url).visible < 20:
        assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    # THEN it exits 130, nothing is left invisible, and the last line adds up
    assert proc.returncode == 130, err
    moved = queue_depth(sqs, queues.queue_url).visible
    dlq = queue_depth(sqs, queues.dlq_url)
    assert dlq.in_flight == 0 and moved + dlq.visible == 200 and dlq.visible > 0
    last = out.strip().splitlines()[-1]
    assert last == (
        f"moved {moved}, failed 0, skipped 0; {dlq.visible} left in the DLQ,"
        f" {dlq.visible} not reached: interrupted"
    )
    assert "Traceback" not in err

    # GIVEN another reader (or a killed run) holds 5 messages invisible, a re-run says so
    held = sqs.receive_message(
        QueueUrl=queues.dlq_url, MaxNumberOfMessages=5, VisibilityTimeout=600
    )
    held_n = len(held["Messages"])
    rerun = _run(moto_endpoint, *argv)
    # THEN it exits 1 and says so: the held ones lock their group, which it cannot reach
    assert rerun.returncode == 1
    left = queue_depth(sqs, queues.dlq_url)
    assert left.in_flight == held_n and left.total >= held_n
    assert _last(rerun) == (
        f"moved {dlq.visible - left.total}, failed 0, skipped 0; {left.total} left in the DLQ,"
        f" {left.total} not reached: {held_n} in flight elsewhere, retry later"
    )
    # AND once they are released, the last re-run moves them and exits 0
    sqs.change_message_visibility_batch(
        QueueUrl=queues.dlq_url,
        Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
            for i, m in enumerate(held["Messages"])
        ],
    )
    final = _run(moto_endpoint, *argv)
    assert final.returncode == 0, final.stdout
    assert _last(final) == f"moved {left.total}, failed 0, skipped 0; 0 left in the DLQ"
    assert queue_depth(sqs, queues.queue_url).visible == 200
    assert queue_depth(sqs, queues.dlq_url).total == 0


@pytest.mark.slow
def test_no_reason_is_listed_honestly_and_filters_mean_it(moto_endpoint: str) -> None:
    sqs, queues = _queues(moto_endpoint, max_receive_count=1)
    _dead_letter_by_max_receive(sqs, queues, 2)  # transient: SQS's redrive, no reason attached
    sqs.send_message(
        QueueUrl=queues.dlq_url,
        MessageBody=_body(0, 99),
        MessageGroupId="p:0",
        MessageDeduplicationId="p-0",
        MessageAttributes={
            "ErrorClass": {"DataType": "String", "StringValue": "InvalidMessage"},
            "ErrorMessage": {"DataType": "String", "StringValue": "loss: not finite"},
        },
    )
    listed = _run(moto_endpoint, "--dry-run", "--dlq-url", queues.dlq_url)
    assert listed.returncode == 0
    assert listed.stdout.count(NO_REASON) == 2
    assert listed.stdout.count("InvalidMessage: loss: not finite") == 1
    dest = ["--dlq-url", queues.dlq_url, "--queue-url", queues.queue_url]
    # No message carries an UndefinedTable reason: the filter matches none and says so.
    none = _run(moto_endpoint, *dest, "--reason", "UndefinedTable")
    assert (none.returncode, _last(none)) == (0, "moved 0, failed 0, skipped 3; 3 left in the DLQ")
    transient = _run(moto_endpoint, *dest, "--reason", "exhausted retries")
    assert transient.returncode == 0
    assert _last(transient) == "moved 2, failed 0, skipped 1; 1 left in the DLQ"
    assert queue_depth(sqs, queues.queue_url).visible == 2
    assert queue_depth(sqs, queues.dlq_url) == QueueDepth(visible=1, in_flight=0, delayed=0)


@pytest.mark.slow
def test_move_everything_uses_sqs_move_task_when_safe(localstack_endpoint: str) -> None:
    # The writer's poison is keyed by message id, never an id the main queue has seen; the
    # command checks every message here (10 per group: all visible at once).
    sqs, queues = _queues(localstack_endpoint)
    _fill_dlq(sqs, queues.dlq_url, poison_from_writer=True, per_rank=10)
    argv = ["--dlq-url", queues.dlq_url, "--queue-url", queues.queue_url]
    result = _run(localstack_endpoint, *argv)
    assert result.returncode == 0, result.stderr
    assert _last(result) == "moved 40 (SQS move task, completed); 0 left in the DLQ"
    assert queue_depth(sqs, queues.queue_url).visible == 40
    assert queue_depth(sqs, queues.dlq_url).total == 0
    # Deeper groups cannot all be checked without moving them: the one-by-one path is used.
    _fill_dlq(sqs, queues.dlq_url, poison_from_writer=True)
    deep = _run(localstack_endpoint, *argv)
    assert deep.returncode == 0, deep.stderr
    assert "SQS move task not used: no redriven message" in deep.stderr
    assert _last(deep) == "moved 200, failed 0, skipped 0; 0 left in the DLQ"
    assert queue_depth(sqs, queues.queue_url).visible == 240


@pytest.mark.slow
def test_move_task_is_not_used_where_the_main_queue_would_drop_the_moves(
    localstack_endpoint: str,
) -> None:
    # Control: LocalStack keeps the producer's dedup id on redrive, so SQS's own move task,
    # within 5 minutes of the original sends, is counted as moved and silently dropped.
    sqs, control = _queues(localstack_endpoint, max_receive_count=1)
    _dead_letter_by_max_receive(sqs, control, 20)
    sqs.start_message_move_task(SourceArn=control.dlq_arn, DestinationArn=control.queue_arn)
    while (
        sqs.list_message_move_tasks(SourceArn=control.dlq_arn)["Results"][0]["Status"] == "RUNNING"
    ):
        pass
    task = sqs.list_message_move_tasks(SourceArn=control.dlq_arn)["Results"][0]
    assert task["ApproximateNumberOfMessagesMoved"] == 20
    assert queue_depth(sqs, control.queue_url).total == 0  # all 20 lost
    # The command sees that and moves them one by one with new dedup ids: none lost.
    _, queues = _queues(localstack_endpoint, max_receive_count=1)
    _dead_letter_by_max_receive(sqs, queues, 20)
    result = _run(localstack_endpoint, "--dlq-url", queues.dlq_url, "--queue-url", queues.queue_url)
    assert result.returncode == 0, result.stderr
    assert "SQS move task not used: message " in result.stderr
    assert _last(result) == "moved 20, failed 0, skipped 0; 0 left in the DLQ"
    assert queue_depth(sqs, queues.queue_url).visible == 20
    assert queue_depth(sqs, queues.dlq_url).total == 0


@pytest.mark.slow
def test_without_the_move_task_api_everything_still_moves(moto_endpoint: str) -> None:
    sqs, queues = _queues(moto_endpoint)
    _fill_dlq(sqs, queues.dlq_url, poison_from_writer=True, per_rank=10)
    result = _run(moto_endpoint, "--dlq-url", queues.dlq_url, "--queue-url", queues.queue_url)
    assert result.returncode == 0, result.stderr
    assert "SQS move task not used: StartMessageMoveTask unavailable" in result.stderr
    assert _last(result) == "moved 40, failed 0, skipped 0; 0 left in the DLQ"
    assert queue_depth(sqs, queues.queue_url).visible == 40
    assert queue_depth(sqs, queues.dlq_url).total == 0

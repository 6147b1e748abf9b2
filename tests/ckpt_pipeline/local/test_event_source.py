"""The local event source against each SQS emulator (moto, LocalStack): deletes, retries, redrive,
concurrency, order."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest

from ckpt_pipeline.exceptions import ConfigError
from ckpt_pipeline.local.event_source import LocalEventSource
from ckpt_pipeline.local.sqs_server import PipelineQueues
from ckpt_pipeline.ops.sqs import queue_depth, sqs_client
from tests.ckpt_pipeline.helpers import RecordingHandler, send


@pytest.fixture
def sqs(sqs_endpoint: str) -> Any:
    """This module's SQS client: every test runs on moto and on LocalStack (SQS semantics)."""
    return sqs_client(sqs_endpoint)


def _source(sqs: Any, queues: PipelineQueues, handler: Any, **kwargs: Any) -> LocalEventSource:
    return LocalEventSource(
        sqs,
        queue_url=queues.queue_url,
        queue_arn=queues.queue_arn,
        handler=handler,
        wait_time_s=1,
        **kwargs,
    )


def test_successful_records_are_deleted_and_the_event_has_lambdas_shape(
    sqs: Any, pipeline_queues: PipelineQueues
) -> None:
    ids = send(sqs, pipeline_queues.queue_url, [(f"b{i}", "g", f"d{i}") for i in range(12)])
    handler = RecordingHandler()
    stats = _source(sqs, pipeline_queues, handler).drain(until_empty_for_s=0.3, timeout=30)
    assert stats.drained
    assert handler.succeeded == [f"b{i}" for i in range(12)]
    assert stats.records == 12 and stats.succeeded == 12 and stats.failed_records == 0
    assert all(len(call) <= 10 for call in handler.calls)
    record = handler.calls[0][0]
    assert record["messageId"] == ids[0]
    assert record["eventSource"] == "aws:sqs"
    assert record["eventSourceARN"] == pipeline_queues.queue_arn
    assert record["attributes"]["MessageGroupId"] == "g"
    assert record["attributes"]["ApproximateReceiveCount"] == "1"
    # The sender as the emulator stamped it (moto: one id for everyone; LocalStack: the caller's
    # account id), which the writer's ownership check reads (docs/DESIGN.md, "Who may write a
    # job").
    assert record["attributes"]["SenderId"] in ("AIDAIT2UOQQY3AUEKVGXU", "000000000000")
    context = handler.contexts[0]
    assert context.function_name and context.invoked_function_arn.startswith("arn:aws:lambda:")
    assert context.memory_limit_in_mb > 0 and context.aws_request_id
    assert 0 < context.get_remaining_time_in_millis() <= 30_000
    assert queue_depth(sqs, pipeline_queues.queue_url).total == 0


def test_failed_records_come_back_after_the_visibility_timeout(
    sqs: Any, fast_queues: PipelineQueues
) -> None:
    send(sqs, fast_queues.queue_url, [("ok", "g1", "d1"), ("flaky", "g2", "d2")])
    attempts: dict[str, int] = {}

    def decide(record: dict[str, Any]) -> bool:
        attempts[record["body"]] = attempts.get(record["body"], 0) + 1
        return record["body"] != "flaky" or attempts["flaky"] >= 2

    handler = RecordingHandler(decide)
    stats = _source(sqs, fast_queues, handler).drain(until_empty_for_s=0.3, timeout=30)
    assert stats.drained
    assert attempts == {"ok": 1, "flaky": 2}  # the successful record was deleted, not retried
    assert sorted(handler.succeeded) == ["flaky", "ok"]
    assert queue_depth(sqs, fast_queues.dlq_url).total == 0


@pytest.mark.parametrize("outcome", ["raise", "malformed"])
def test_exception_or_malformed_response_fails_the_whole_batch(
    sqs: Any, fast_queues: PipelineQueues, outcome: str
) -> None:
    send(sqs, fast_queues.queue_url, [("a", "g1", "d1"), ("b", "g2", "d2")])
    calls: list[int] = []

    def handler(event: dict[str, Any], context: Any) -> Any:
        calls.append(len(event["Records"]))
        if len(calls) == 1:
            if outcome == "raise":
                raise RuntimeError("database down")
            return {"batchItemFailures": [{"itemIdentifier": ""}]}
        return {"batchItemFailures": []}

    stats = _source(sqs, fast_queues, handler).drain(until_empty_for_s=0.3, timeout=30)
    assert stats.drained
    assert stats.failed_batches == 1
    assert sum(calls) == 4  # both records were delivered again: nothing deleted the first time


def test_records_that_keep_failing_are_redriven_to_the_dlq_by_sqs(
    sqs: Any, fast_queues: PipelineQueues
) -> None:
    send(sqs, fast_queues.queue_url, [("good", "g1", "d1"), ("stuck", "g2", "d2")])
    handler = RecordingHandler(lambda r: r["body"] != "stuck")
    stats = _source(sqs, fast_queues, handler).drain(until_empty_for_s=0.3, timeout=30)
    assert stats.drained
    # maxReceiveCount 3: three deliveries, then SQS moves it instead of delivering a fourth.
    assert handler.bodies_seen().count("stuck") == 3
    dlq = sqs.receive_message(
        QueueUrl=fast_queues.dlq_url, MessageSystemAttributeNames=["All"], WaitTimeSeconds=1
    )["Messages"]
    assert [m["Body"] for m in dlq] == ["stuck"]
    assert dlq[0]["Attributes"]["MessageGroupId"] == "g2"


def test_two_workers_run_two_invocations_at_once_and_keep_group_order(
    sqs: Any, pipeline_queues: PipelineQueues
) -> None:
    send(
        sqs,
        pipeline_queues.queue_url,
        [(f"{g}:{i}", g, f"{g}{i}") for i in range(4) for g in ("a", "b", "c", "d")],
    )
    both_in = threading.Barrier(2, timeout=10)
    seen: list[str] = []
    lock = threading.Lock()

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        if not both_in.broken:
            with contextlib.suppress(threading.BrokenBarrierError):
                both_in.wait()  # only passes if a second invocation runs concurrently
        with lock:
            seen.extend(r["body"] for r in event["Records"])
        return {"batchItemFailures": []}

    stats = _source(sqs, pipeline_queues, handler, max_concurrency=2, batch_size=2).drain(
        until_empty_for_s=0.3, timeout=30
    )
    assert stats.drained and stats.max_concurrent_invocations == 2
    assert sorted(seen) == sorted(f"{g}:{i}" for i in range(4) for g in "abcd")
    for group in "abcd":
        assert [s for s in seen if s.startswith(group)] == [f"{group}:{i}" for i in range(4)]


def test_one_worker_never_overlaps(sqs: Any, pipeline_queues: PipelineQueues) -> None:
    send(sqs, pipeline_queues.queue_url, [(f"b{i}", f"g{i}", f"d{i}") for i in range(6)])
    stats = _source(sqs, pipeline_queues, RecordingHandler(), batch_size=1).drain(
        until_empty_for_s=0.3, timeout=30
    )
    assert stats.batches == 6 and stats.max_concurrent_invocations == 1


def test_an_invocation_past_the_timeout_deletes_nothing(
    sqs: Any, fast_queues: PipelineQueues
) -> None:
    send(sqs, fast_queues.queue_url, [("slow", "g", "d")])
    calls: list[int] = []
    done = threading.Event()

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            # Outlive the 0.2 s timeout, as a hung database call would.
            done.wait(context.get_remaining_time_in_millis() / 1000 + 0.05)
        return {"batchItemFailures": []}

    stats = _source(sqs, fast_queues, handler, lambda_timeout_s=0.2).drain(
        until_empty_for_s=0.3, timeout=30
    )
    assert stats.drained and stats.failed_batches == 1 and len(calls) == 2


def test_handler_factory_gives_each_worker_its_own_handler(
    sqs: Any, pipeline_queues: PipelineQueues
) -> None:
    send(sqs, pipeline_queues.queue_url, [(f"b{i}", f"g{i}", f"d{i}") for i in range(8)])
    made: list[RecordingHandler] = []
    # Each worker's first batch waits for the other's, so both workers always build a handler:
    # left to thread scheduling one worker could take all 8 batches and one handler would pass.
    both_running = threading.Barrier(2, timeout=20)

    def factory() -> Any:
        recorder = RecordingHandler()
        made.append(recorder)
        first = threading.Event()

        def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
            if not first.is_set():
                first.set()
                both_running.wait()
            return recorder(event, context)

        return handler

    source = LocalEventSource(
        sqs,
        queue_url=pipeline_queues.queue_url,
        queue_arn=pipeline_queues.queue_arn,
        handler_factory=factory,
        max_concurrency=2,
        batch_size=1,
        wait_time_s=1,
    )
    assert source.drain(until_empty_for_s=0.3, timeout=30).succeeded == 8
    assert len(made) == 2 and all(h.succeeded for h in made)
    assert sorted(b for h in made for b in h.succeeded) == sorted(f"b{i}" for i in range(8))


@pytest.mark.parametrize(
    ("option", "value"),
    [("max_concurrency", 0), ("max_concurrency", 3), ("batch_size", 11), ("wait_time_s", 21)],
)
def test_settings_are_validated(
    sqs: Any, pipeline_queues: PipelineQueues, option: str, value: int
) -> None:
    with pytest.raises(ConfigError, match=option):
        LocalEventSource(
            sqs,
            queue_url=pipeline_queues.queue_url,
            queue_arn=pipeline_queues.queue_arn,
            handler=RecordingHandler(),
            **{option: value},  # type: ignore[arg-type]
        )


def test_context_manager_starts_and_stops(sqs: Any, pipeline_queues: PipelineQueues) -> None:
    handler = RecordingHandler()
    got_one = threading.Event()
    send(sqs, pipeline_queues.queue_url, [("x", "g", "d")])

    def decide(record: dict[str, Any]) -> bool:
        got_one.set()
        return True

    handler.decide = decide
    with _source(sqs, pipeline_queues, handler) as source:
        assert got_one.wait(10)
        assert source.running
    assert not source.running
    assert handler.succeeded == ["x"]

"""A local stand-in for Lambda's SQS event source on a FIFO queue.

It long-polls the queue, hands the handler the real event shape and a Lambda-like context, deletes
exactly the records the partial batch response does not list, and otherwise waits: Lambda does not
reset the visibility of failed records, they come back when the visibility timeout expires, and the
queue's redrive policy moves them to the DLQ after ``maxReceiveCount`` receives (moto's server does
this itself for FIFO queues, so the poller does not). Concurrency is capped at 1–2 workers like the
writer's reserved concurrency; FIFO order per message group is kept by SQS's group locking.

A :class:`~ckpt_pipeline.local.receive_gate.ReceiveGate` (``gate=``) is asked before every
receive: with a :class:`~ckpt_pipeline.local.receive_gate.MappingGate` the source stops polling
while its event source mapping is disabled, as Lambda does (what the circuit breaker relies on).

Workers are threads of one process. Lambda runs concurrent invocations in separate execution
environments; to get that here, pass ``handler_factory`` (called once per worker, so each worker
has its own handler state, e.g. its own database connection) instead of one shared ``handler``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from types import TracebackType
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ckpt_pipeline.exceptions import ConfigError
from ckpt_pipeline.local.batch_response import BatchOutcome, batch_failed, interpret_response
from ckpt_pipeline.local.lambda_context import context_for
from ckpt_pipeline.local.receive_gate import ReceiveGate
from ckpt_pipeline.local.sqs_events import receive_kwargs, sqs_event
from ckpt_pipeline.ops.sqs import queue_depth
from lambda_writer.shared import constants

logger = logging.getLogger(__name__)

EventHandler = Callable[[dict[str, Any], Any], Any]
HandlerFactory = Callable[[], EventHandler]

# ReceiveMessage long polling waits at most 20 s
# (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_ReceiveMessage.html).
MAX_WAIT_TIME_S = 20
# Lambda polls with 20 s; locally a shorter wait lets stop() return quickly. Messages that arrive
# end a long poll early either way, so throughput is the same.
DEFAULT_WAIT_TIME_S = 2
_ERROR_BACKOFF_S = 1.0
_DRAIN_CHECK_INTERVAL_S = 0.1


@dataclass(frozen=True)
class EventSourceConfig:
    """The event source mapping's settings, validated like Lambda validates them."""

    batch_size: int = constants.BATCH_SIZE
    max_concurrency: int = 1
    visibility_timeout_s: int | None = None
    wait_time_s: int = DEFAULT_WAIT_TIME_S
    lambda_timeout_s: float = constants.WRITER_TIMEOUT_S

    def __post_init__(self) -> None:
        # FIFO event sources take 1..10 records per batch
        # (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-configure.html).
        if not 1 <= self.batch_size <= constants.BATCH_SIZE:
            raise ConfigError("batch_size", f"must be 1..{constants.BATCH_SIZE} for a FIFO queue")
        if not 1 <= self.max_concurrency <= 2:
            raise ConfigError(
                "max_concurrency", "must be 1 or 2 (the writer's reserved concurrency)"
            )
        if not 0 <= self.wait_time_s <= MAX_WAIT_TIME_S:
            raise ConfigError("wait_time_s", f"must be 0..{MAX_WAIT_TIME_S} (SQS long polling)")
        if self.visibility_timeout_s is not None and not 0 <= self.visibility_timeout_s <= 43200:
            raise ConfigError("visibility_timeout_s", "must be 0..43200 s (SQS's 12 h maximum)")
        if self.lambda_timeout_s <= 0:
            raise ConfigError("lambda_timeout_s", "must be positive")


@dataclass(frozen=True)
class EventSourceStats:
    """What the event source did so far."""

    batches: int = 0
    records: int = 0
    succeeded: int = 0
    failed_records: int = 0
    failed_batches: int = 0
    delete_failures: int = 0
    max_concurrent_invocations: int = 0
    drained: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class LocalEventSource:
    """Drive ``handler(event, context)`` from a queue as Lambda's SQS event source does."""

    def __init__(
        self,
        sqs: Any,
        *,
        queue_url: str,
        queue_arn: str,
        handler: EventHandler | None = None,
        handler_factory: HandlerFactory | None = None,
        batch_size: int = constants.BATCH_SIZE,
        max_concurrency: int = 1,
        visibility_timeout_s: int | None = None,
        wait_time_s: int = DEFAULT_WAIT_TIME_S,
        lambda_timeout_s: float = constants.WRITER_TIMEOUT_S,
        gate: ReceiveGate | None = None,
    ) -> None:
        self.config = EventSourceConfig(
            batch_size=batch_size,
            max_concurrency=max_concurrency,
            visibility_timeout_s=visibility_timeout_s,
            wait_time_s=wait_time_s,
            lambda_timeout_s=lambda_timeout_s,
        )
        self._sqs = sqs
        self.gate = gate
        self.queue_url = queue_url
        self.queue_arn = queue_arn
        if handler_factory is None:
            if handler is None:
                raise ConfigError("handler", "pass one of handler or handler_factory")
            shared = handler
            handler_factory = lambda: shared  # noqa: E731
        elif handler is not None:
            raise ConfigError("handler", "pass only one of handler or handler_factory")
        self._handler_factory: HandlerFactory = handler_factory
        self._local = threading.local()
        self._region = queue_arn.split(":")[3]
        self._lock = threading.Lock()
        self._stats = EventSourceStats()
        self._running_invocations = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def stats(self) -> EventSourceStats:
        """A snapshot of the counters."""
        with self._lock:
            return self._stats

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def start(self) -> LocalEventSource:
        """Start ``max_concurrency`` worker threads; returns self."""
        if self.running:
            return self
        self._stop.clear()
        self._threads = [
            threading.Thread(
                target=self._worker, args=(self._stop,), name=f"event-source-{i}", daemon=True
            )
            for i in range(self.config.max_concurrency)
        ]
        for thread in self._threads:
            thread.start()
        logger.info(
            "event source started: queue=%s concurrency=%d batch_size=%d",
            self.queue_url,
            self.config.max_concurrency,
            self.config.batch_size,
        )
        return self

    def stop(self, timeout: float | None = None) -> EventSourceStats:
        """Ask the workers to stop after their current poll and invocation; wait for them."""
        self._stop.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(left)
        return self.stats

    def __enter__(self) -> LocalEventSource:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def run(self, stop_event: threading.Event) -> EventSourceStats:
        """Run in the foreground until ``stop_event`` is set (e.g. by a signal handler)."""
        self.start()
        try:
            stop_event.wait()
        finally:
            self.stop()
        return self.stats

    def drain(self, *, until_empty_for_s: float = 1.0, timeout: float = 120.0) -> EventSourceStats:
        """Process until the queue holds no message (visible, in flight or delayed) for a while.

        Starts the workers if they are not running and stops them again afterwards. Failed
        records keep the queue non-empty until they are written or redriven to the DLQ, so this
        also waits out retries. ``drained`` in the result is False if ``timeout`` passed first.
        """
        started_here = not self.running
        if started_here:
            self.start()
        deadline = time.monotonic() + timeout
        empty_since: float | None = None
        drained = False
        try:
            while time.monotonic() < deadline:
                now = time.monotonic()
                if self._queue_is_empty() and self._idle():
                    empty_since = empty_since if empty_since is not None else now
                    if now - empty_since >= until_empty_for_s:
                        drained = True
                        break
                else:
                    empty_since = None
                time.sleep(_DRAIN_CHECK_INTERVAL_S)
        finally:
            if started_here:
                self.stop()
        with self._lock:
            self._stats = replace(self._stats, drained=drained)
            return self._stats

    # -- one poll ----------------------------------------------------------------------------

    def poll_once(self) -> int:
        """One ReceiveMessage and, if it returned records, one invocation; returns the count."""
        response = self._sqs.receive_message(
            QueueUrl=self.queue_url,
            **receive_kwargs(
                max_messages=self.config.batch_size,
                wait_time_s=self.config.wait_time_s,
                visibility_timeout_s=self.config.visibility_timeout_s,
            ),
        )
        messages: list[dict[str, Any]] = response.get("Messages", [])
        if not messages:
            return 0
        outcome = self._invoke(messages)
        self._delete([m for m in messages if m["MessageId"] in outcome.succeeded])
        if self.gate is not None:
            self.gate.record(outcome)
        return len(messages)

    def _worker_handler(self) -> EventHandler:
        # One handler per worker thread: the worker's "execution environment".
        handler: EventHandler | None = getattr(self._local, "handler", None)
        if handler is None:
            handler = self._handler_factory()
            self._local.handler = handler
        return handler

    def _worker(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                # Before the receive, never after: a closed mapping receives nothing at all.
                if self.gate is not None and not self.gate.wait_open(stop):
                    break
                self.poll_once()
            except (BotoCoreError, ClientError) as exc:
                logger.warning("event source: SQS call failed, retrying: %s", exc)
                stop.wait(_ERROR_BACKOFF_S)
            except Exception:
                # A bug here must not silently end the worker: log it and keep polling.
                logger.exception("event source worker error, retrying")
                stop.wait(_ERROR_BACKOFF_S)

    def _invoke(self, messages: list[dict[str, Any]]) -> BatchOutcome:
        ids = [m["MessageId"] for m in messages]
        event = sqs_event(messages, queue_arn=self.queue_arn)
        context = context_for(timeout_s=self.config.lambda_timeout_s, region=self._region)
        with self._lock:
            self._running_invocations += 1
            peak = max(self._stats.max_concurrent_invocations, self._running_invocations)
            self._stats = replace(self._stats, max_concurrent_invocations=peak)
        try:
            response = self._worker_handler()(event, context)
        except Exception as exc:
            # An invocation error fails the whole batch, as in Lambda.
            logger.exception("handler raised; %d records return to the queue", len(ids))
            outcome = batch_failed(ids, f"handler raised {type(exc).__name__}: {exc}")
        else:
            if context.get_remaining_time_in_millis() == 0:
                # Lambda would have killed the invocation at its timeout: nothing is deleted.
                outcome = batch_failed(ids, f"timed out after {self.config.lambda_timeout_s} s")
            else:
                outcome = interpret_response(response, ids)
        finally:
            with self._lock:
                self._running_invocations -= 1
        if outcome.whole_batch_failed:
            logger.warning("batch of %d failed: %s", len(ids), outcome.batch_error)
        elif outcome.failed:
            logger.info("batch of %d: %d records failed", len(ids), len(outcome.failed))
        with self._lock:
            s = self._stats
            self._stats = replace(
                s,
                batches=s.batches + 1,
                records=s.records + len(ids),
                succeeded=s.succeeded + len(outcome.succeeded),
                failed_records=s.failed_records + len(outcome.failed),
                failed_batches=s.failed_batches + int(outcome.whole_batch_failed),
            )
        return outcome

    def _delete(self, messages: list[dict[str, Any]]) -> None:
        if not messages:
            return
        entries = [
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
        ]
        try:
            result = self._sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)
            failed = result.get("Failed", [])
        except (BotoCoreError, ClientError) as exc:
            logger.warning("DeleteMessageBatch failed, %d records come back: %s", len(entries), exc)
            failed = entries
        for entry in failed:
            # The record comes back after its visibility timeout; the writer is idempotent.
            logger.warning(
                "could not delete record %s: %s", entry.get("Id"), entry.get("Message", "")
            )
        if failed:
            with self._lock:
                s = self._stats
                self._stats = replace(s, delete_failures=s.delete_failures + len(failed))

    # -- drain conditions --------------------------------------------------------------------

    def _idle(self) -> bool:
        with self._lock:
            return self._running_invocations == 0

    def _queue_is_empty(self) -> bool:
        return queue_depth(self._sqs, self.queue_url).total == 0

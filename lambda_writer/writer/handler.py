"""The writer's execution environment: :func:`make_handler` builds one from explicit settings;
``handler`` is the Lambda entry point, that factory over :meth:`WriterSettings.from_env`.

One environment holds one writer (one database connection, opened lazily on the first batch and
reused by warm invocations). Powertools' decorators do the plumbing: ``inject_lambda_context``
puts the request id and cold start on every log line, ``log_metrics`` flushes the EMF metrics
after every invocation (also when it raised), and the Tracer records the invocation for X-Ray
active tracing (in Lambda only). Local drivers (the pipeline harness, ``ckpt-pipeline poll``)
build their environments with ``emit_metrics=False``: EMF belongs in CloudWatch.
"""

from __future__ import annotations

import gc

# Cold start: the imports below make ~40,000 objects that live as long as the execution
# environment, and the collector ran ~90 times over them while they loaded, freeing next to
# nothing: ~10 ms of the import (BENCHMARKS.md §5). So it is off while they load, and they are
# then frozen (never traversed again, by warm invocations' collections either); the few hundred
# objects of import-time garbage in cycles stay with the environment.
_collecting = gc.isenabled()
gc.disable()
try:
    import functools
    import logging
    import os
    import time
    from collections.abc import Callable
    from typing import Any

    from aws_lambda_powertools import Logger, Metrics
    from aws_lambda_powertools.metrics import MetricUnit

    from lambda_writer.shared.constants import WRITER_SERVICE_NAME
    from lambda_writer.shared.settings import WriterSettings, metrics_namespace
    from lambda_writer.writer.batch import BatchResult, CheckpointWriter
    from lambda_writer.writer.records import parse_event
finally:
    gc.freeze()
    if _collecting:
        gc.enable()

BatchResponse = dict[str, list[dict[str, str]]]
Handler = Callable[[dict[str, Any], Any], BatchResponse]
# Called with the invocation's event and its start (time.time()) before the writer runs: how a
# benchmark sees when each record reached the writer, beside what SQS says of it.
InvokeHook = Callable[[dict[str, Any], float], None]
# Called after every invocation with its result (None when it raised) and the CPU seconds its
# thread spent in it: what a local driver tallies (poll's summary, a benchmark's writer share).
DoneHook = Callable[[BatchResult | None, float], None]

logger = Logger(service=WRITER_SERVICE_NAME)
# botocore logs request and response bodies at DEBUG (a GetSecretValue response holds the
# password): whatever the root level, keep it above DEBUG (and its per-call INFO chatter).
logging.getLogger("botocore").setLevel(logging.WARNING)
metrics = Metrics(namespace=metrics_namespace(), service=WRITER_SERVICE_NAME)


def tracing_enabled(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether X-Ray tracing can work here: in Lambda, and not switched off.

    The same rule as Powertools' Tracer (it disables itself outside Lambda, i.e. without
    ``LAMBDA_TASK_ROOT``, and on ``POWERTOOLS_TRACE_DISABLED``), decided before constructing
    one: a Tracer imports the X-Ray SDK even when disabled, and that SDK builds a botocore
    session for its sampler at import (measured in BENCHMARKS.md's cold-start section) — a cost
    the local pipeline, the tests and the operator CLI have no reason to pay.
    """
    disabled = env.get("POWERTOOLS_TRACE_DISABLED", "").strip().lower() in ("1", "true", "yes")
    in_lambda = bool(env.get("LAMBDA_TASK_ROOT")) and not env.get("AWS_SAM_LOCAL")
    return in_lambda and not disabled


def _lambda_tracer() -> Callable[[Handler], Handler] | None:
    """Powertools' ``capture_lambda_handler`` where tracing can work (made at init), else None."""
    if not tracing_enabled():
        return None
    from aws_lambda_powertools import Tracer

    # auto_patch=False: patch_all() would import and patch every supported library at init
    # (requests, httplib, sqlite3, ...); lambda_writer.shared.aws patches botocore when a client is
    # made.
    tracer = Tracer(service=WRITER_SERVICE_NAME, auto_patch=False)

    def trace(handler: Handler) -> Handler:
        # The response holds the failed message ids only; errors are recorded on the segment.
        traced: Handler = tracer.capture_lambda_handler(handler, capture_response=False)
        return traced

    return trace


# Made at import, i.e. in Lambda's INIT phase (the X-Ray SDK's import is the costly part).
_trace = _lambda_tracer()


class WriterHandler:
    """One execution environment of the writer: called as Lambda calls the handler.

    ``writer`` is the environment's :class:`CheckpointWriter`; :meth:`close` closes its
    connection (a local driver ending the environment; Lambda just freezes and reaps it).
    """

    def __init__(self, writer: CheckpointWriter, invoke: Handler) -> None:
        self.writer = writer
        self._invoke = invoke

    def __call__(self, event: dict[str, Any], context: Any) -> BatchResponse:
        """Write one SQS batch; returns the partial batch response (ReportBatchItemFailures)."""
        return self._invoke(event, context)

    def close(self) -> None:
        """Close the environment's database connection (the next batch would reopen one)."""
        self.writer.connection.discard()


def make_handler(
    settings: WriterSettings,
    *,
    emit_metrics: bool = True,
    log_level: str | None = None,
    on_invoke: InvokeHook | None = None,
    on_done: DoneHook | None = None,
) -> WriterHandler:
    """The handler of one execution environment, writing with ``settings``.

    ``emit_metrics=False`` leaves Powertools' EMF out (local drivers: nothing to flush to).
    ``log_level`` sets the writer's Powertools logger (one per process, as the service's
    ``logging`` logger is); None keeps Powertools' own (``POWERTOOLS_LOG_LEVEL``, else INFO).
    ``on_invoke`` and ``on_done`` observe every invocation (see :data:`InvokeHook`,
    :data:`DoneHook`); they run in the invoking thread.
    """
    if log_level is not None:
        logger.setLevel(log_level)
    writer = CheckpointWriter(settings, logger=logger)

    def handler(event: dict[str, Any], context: Any) -> BatchResponse:
        # Named "handler": the Tracer names the invocation's subsegment after it ("## handler").
        started = time.perf_counter()
        if on_invoke is not None:
            on_invoke(event, time.time())
        cpu_started = time.thread_time()
        if emit_metrics:
            # With metrics disabled by Powertools' own switch (POWERTOOLS_METRICS_DISABLED), its
            # flush keeps the set and add_metric prints it as EMF once a metric holds 100
            # values: start every invocation from an empty set.
            metrics.clear_metrics()
        result: BatchResult | None = None
        try:
            messages = parse_event(event)
            result = writer.process(messages)
        finally:
            if emit_metrics:
                _add_metrics(result, (time.perf_counter() - started) * 1000)
            if on_done is not None:
                on_done(result, time.thread_time() - cpu_started)
        logger.info(
            "batch done",
            extra={
                "records": len(messages),
                "failed": len(result.failed),
                "written": result.written,
                "rows_changed": result.rows_changed,
                "poison": result.poison,
            },
        )
        return result.batch_response()

    invoke: Handler = handler
    if _trace is not None:
        invoke = _trace(invoke)
    if emit_metrics:
        invoke = metrics.log_metrics(invoke)
    invoke = logger.inject_lambda_context(invoke, clear_state=True)
    return WriterHandler(writer, invoke)


@functools.cache
def _lambda_environment() -> WriterHandler:
    """This execution environment's handler (settings read and validated once, on first use)."""
    return make_handler(WriterSettings.from_env())


def handler(event: dict[str, Any], context: Any) -> BatchResponse:
    """The Lambda entry point: one SQS batch, written by this environment's handler."""
    return _lambda_environment()(event, context)


def _add_metrics(result: BatchResult | None, latency_ms: float) -> None:
    # Flushed by @metrics.log_metrics after the invocation, including one that raised.
    metrics.add_metric(name="BatchLatencyMs", unit=MetricUnit.Milliseconds, value=latency_ms)
    if result is not None:
        metrics.add_metric(name="RecordsWritten", unit=MetricUnit.Count, value=result.written)
        metrics.add_metric(name="PoisonRecords", unit=MetricUnit.Count, value=result.poison)
        metrics.add_metric(
            name="TransientFailures", unit=MetricUnit.Count, value=result.transient_failures
        )
        metrics.add_metric(name="RowsChanged", unit=MetricUnit.Count, value=result.rows_changed)
        metrics.add_metric(name="NoopReplays", unit=MetricUnit.Count, value=result.noop_replays)
        if result.restarts:
            # Restart records (ckpt.restart.v1): the dashboard's restarts and time to train
            # again, and the restart-loop alarm's metric.
            metrics.add_metric(name="Restarts", unit=MetricUnit.Count, value=result.restarts)
            metrics.add_metric(
                name="RestartLoops", unit=MetricUnit.Count, value=result.restart_loops
            )
            if result.restart_seconds is not None:
                metrics.add_metric(
                    name="RestartSeconds", unit=MetricUnit.Seconds, value=result.restart_seconds
                )

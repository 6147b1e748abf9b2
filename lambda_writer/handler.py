"""Lambda entry point for the SQS FIFO event source: a thin shell around CheckpointWriter.

Settings are validated and the DB connection is opened once per execution environment (lazily,
on the first batch) and reused by warm invocations. Powertools' decorators do the plumbing:
``inject_lambda_context`` puts the request id and cold start on every log line,
``log_metrics`` flushes the EMF metrics after every invocation (also when it raised), and the
Tracer records the invocation for X-Ray active tracing. Set ``POWERTOOLS_METRICS_DISABLED=true``
(or ``POWERTOOLS_DEV=true``) to silence metrics when the local event source calls this handler
in-process.
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

    from lambda_writer.records import parse_event
    from lambda_writer.settings import SERVICE_NAME, WriterSettings, metrics_namespace
    from lambda_writer.writer import BatchResult, CheckpointWriter
finally:
    gc.freeze()
    if _collecting:
        gc.enable()

Handler = Callable[[dict[str, Any], Any], dict[str, list[dict[str, str]]]]

logger = Logger(service=SERVICE_NAME)
# botocore logs request and response bodies at DEBUG (a GetSecretValue response holds the
# password): whatever the root level, keep it above DEBUG (and its per-call INFO chatter).
logging.getLogger("botocore").setLevel(logging.WARNING)
metrics = Metrics(namespace=metrics_namespace(), service=SERVICE_NAME)


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


def _traced(handler: Handler) -> Handler:
    if not tracing_enabled():
        return handler
    from aws_lambda_powertools import Tracer

    # auto_patch=False: patch_all() would import and patch every supported library at init
    # (requests, httplib, sqlite3, ...); lambda_writer.aws patches botocore when a client is made.
    tracer = Tracer(service=SERVICE_NAME, auto_patch=False)
    # The response holds the failed message ids only; errors are recorded on the segment.
    traced: Handler = tracer.capture_lambda_handler(handler, capture_response=False)
    return traced


@functools.cache
def get_writer() -> CheckpointWriter:
    """The execution environment's writer (settings read and validated once)."""
    return CheckpointWriter(WriterSettings.from_env(), logger=logger)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@_traced
def handler(event: dict[str, Any], context: Any) -> dict[str, list[dict[str, str]]]:
    """Write one SQS batch; returns the partial batch response (ReportBatchItemFailures)."""
    started = time.perf_counter()
    # With metrics disabled (local runs) Powertools' flush keeps the set, and add_metric prints
    # it as EMF once a metric holds 100 values: start every invocation from an empty set.
    metrics.clear_metrics()
    result: BatchResult | None = None
    try:
        messages = parse_event(event)
        result = get_writer().process(messages)
    finally:
        _add_metrics(result, (time.perf_counter() - started) * 1000)
    assert result is not None  # process() returned, or the exception propagated
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

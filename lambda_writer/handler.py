"""Lambda entry point for the SQS FIFO event source: a thin shell around CheckpointWriter.

Settings are validated and the DB connection is opened once per execution environment (lazily,
on the first batch) and reused by warm invocations. Metrics go out as EMF on stdout after every
invocation; set ``POWERTOOLS_METRICS_DISABLED=true`` (or ``POWERTOOLS_DEV=true``) to silence them
when the local event source calls this handler in-process.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from lambda_writer.records import parse_event
from lambda_writer.settings import SERVICE_NAME, WriterSettings, metrics_namespace
from lambda_writer.writer import BatchResult, CheckpointWriter

logger = Logger(service=SERVICE_NAME)
# botocore logs request and response bodies at DEBUG (a GetSecretValue response holds the
# password): whatever the root level, keep it above DEBUG (and its per-call INFO chatter).
logging.getLogger("botocore").setLevel(logging.WARNING)
metrics = Metrics(namespace=metrics_namespace(), service=SERVICE_NAME)


@functools.cache
def get_writer() -> CheckpointWriter:
    """The execution environment's writer (settings read and validated once)."""
    return CheckpointWriter(WriterSettings.from_env(), logger=logger)


def handler(event: dict[str, Any], context: Any) -> dict[str, list[dict[str, str]]]:
    """Write one SQS batch; returns the partial batch response (ReportBatchItemFailures)."""
    started = time.perf_counter()
    result: BatchResult | None = None
    try:
        messages = parse_event(event)
        result = get_writer().process(messages)
    finally:
        _emit_metrics(result, (time.perf_counter() - started) * 1000)
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


def _emit_metrics(result: BatchResult | None, latency_ms: float) -> None:
    metrics.add_metric(name="BatchLatencyMs", unit=MetricUnit.Milliseconds, value=latency_ms)
    if result is not None:
        metrics.add_metric(name="RecordsWritten", unit=MetricUnit.Count, value=result.written)
        metrics.add_metric(name="PoisonRecords", unit=MetricUnit.Count, value=result.poison)
        metrics.add_metric(
            name="TransientFailures", unit=MetricUnit.Count, value=result.transient_failures
        )
        metrics.add_metric(name="RowsChanged", unit=MetricUnit.Count, value=result.rows_changed)
        metrics.add_metric(name="NoopReplays", unit=MetricUnit.Count, value=result.noop_replays)
    metrics.flush_metrics()
    # flush_metrics() keeps the set when metrics are disabled; clear it so a long local run
    # does not accumulate values.
    metrics.clear_metrics()

"""Lambda entry point of the circuit breaker (an EventBridge schedule, every minute).

A thin shell around :func:`lambda_writer.breaker.circuit.run_breaker`: settings read once per
execution environment, one structured log line per run (WARNING when it opens the breaker, INFO
otherwise), and two EMF metrics — ``BreakerOpen`` (1 while the writer's event source mapping is
disabled by the breaker) and ``DatabaseHealthy`` (1/0) — under the ``ckpt-breaker`` service
dimension. A run that cannot read or switch the mapping raises, so the function's Errors metric
shows it.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from lambda_writer.breaker.circuit import (
    BreakerRun,
    BreakerSettings,
    MappingSwitch,
    check_database,
    mapping_switch,
    run_breaker,
)
from lambda_writer.shared.constants import BREAKER_SERVICE_NAME
from lambda_writer.shared.settings import metrics_namespace

logger = Logger(service=BREAKER_SERVICE_NAME)
# botocore logs request and response bodies at DEBUG; keep it quiet whatever the root level.
logging.getLogger("botocore").setLevel(logging.WARNING)
metrics = Metrics(namespace=metrics_namespace(), service=BREAKER_SERVICE_NAME)


@functools.cache
def _environment() -> tuple[BreakerSettings, MappingSwitch]:
    settings = BreakerSettings.from_env()
    return settings, mapping_switch(settings.mapping_uuid, region=settings.writer.aws_region)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def handler(event: dict[str, Any], context: Any) -> dict[str, object]:
    """One breaker run; returns what it saw and did."""
    metrics.clear_metrics()  # see lambda_writer.writer.handler: start each run from an empty set
    settings, switch = _environment()
    run = run_breaker(lambda: check_database(settings.writer), switch)
    _log(run)
    metrics.add_metric(
        name="BreakerOpen", unit=MetricUnit.Count, value=int(run.decision.breaker_open)
    )
    metrics.add_metric(name="DatabaseHealthy", unit=MetricUnit.Count, value=int(run.health.healthy))
    return run.as_dict()


def _log(run: BreakerRun) -> None:
    fields = run.as_dict()
    if run.decision.action == "disable":
        logger.warning(
            "circuit breaker OPEN: writer's event source mapping disabled, the queue keeps"
            " the reports until the database is back",
            extra=fields,
        )
    elif run.decision.action == "enable":
        logger.info("circuit breaker CLOSED: writer's event source mapping enabled", extra=fields)
    elif run.decision.breaker_open:
        logger.warning("circuit breaker still open", extra=fields)
    else:
        logger.info("database healthy, circuit breaker closed", extra=fields)

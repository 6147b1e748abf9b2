"""Every alarm of the stack, its metric and threshold, each notifying the alarm topic on ALARM
and on OK.

What each alarm is (metric, threshold, periods, description) is decided here; each is created in
the scope of the construct that owns it (``PipelineMonitoring`` for the pipeline's, the circuit
breaker for its two), which fixes its logical id and so the deployed alarm.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_rds as rds
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra import constants
from infra.metrics import (
    MINUTE,
    PERIOD,
    breaker_metric,
    proxy_availability,
    proxy_metric,
    writer_metric,
)
from infra.settings import NewDatabase, PipelineSettings

# Alarm before the writer's timeout kills a batch, with room for one slow connect.
WRITER_DURATION_ALARM_FRACTION = 0.8
WRITER_DURATION_ALARM_MS = WRITER_DURATION_ALARM_FRACTION * constants.WRITER_TIMEOUT_S * 1000
# Any failed proxy health check in a minute brings the average under 100 %.
PROXY_AVAILABILITY_ALARM_PERCENT = 100
# DatabaseConnectionsBorrowLatency is in microseconds; half the borrow timeout is close to the
# point where borrows fail (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-proxy.monitoring.html).
PROXY_BORROW_LATENCY_ALARM_US = constants.PROXY_BORROW_TIMEOUT_S * 1_000_000 / 2
DB_CPU_ALARM_PERCENT = 90
# Our choice where AWS leaves it to the workload: a tenth of the allocated storage, and 100 MiB of
# memory (a tenth of the default db.t4g.micro's 1 GiB; on a larger class it still means "nearly
# out of memory", only later).
DB_FREE_STORAGE_ALARM_FRACTION = 0.1
DB_FREEABLE_MEMORY_ALARM_BYTES = 100 * 2**20

Alarms = dict[str, cloudwatch.Alarm]


def _alarm(
    scope: Construct,
    name: str,
    metric: cloudwatch.IMetric,
    *,
    topic: sns.ITopic,
    threshold: float,
    description: str,
    periods: int = 1,
    datapoints: int | None = None,
    comparison: cloudwatch.ComparisonOperator = (
        cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD
    ),
    missing: cloudwatch.TreatMissingData = cloudwatch.TreatMissingData.NOT_BREACHING,
) -> cloudwatch.Alarm:
    """An alarm on ``metric`` (which carries its period) that notifies ``topic`` on ALARM and OK;
    ``datapoints`` of ``periods`` breaching (None: not set, CloudWatch counts all of them)."""
    alarm = cloudwatch.Alarm(
        scope,
        name,
        metric=metric,
        threshold=threshold,
        comparison_operator=comparison,
        evaluation_periods=periods,
        datapoints_to_alarm=datapoints,
        treat_missing_data=missing,
        alarm_description=description,
    )
    alarm.add_alarm_action(actions.SnsAction(topic))
    alarm.add_ok_action(actions.SnsAction(topic))
    return alarm


def pipeline_alarms(
    scope: Construct,
    *,
    settings: PipelineSettings,
    topic: sns.ITopic,
    queue: sqs.IQueue,
    dlq: sqs.IQueue,
    writer: lambda_.IFunction,
    proxy: rds.IDatabaseProxy,
    instance: rds.IDatabaseInstance | None,
) -> Alarms:
    """The queues', the writer's, the proxy's and (greenfield) the database's alarms, by name."""
    alarms: Alarms = {}

    def alarm(
        name: str,
        metric: cloudwatch.IMetric,
        *,
        threshold: float,
        description: str,
        periods: int = 1,
        datapoints: int | None = None,
        comparison: cloudwatch.ComparisonOperator = (
            cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD
        ),
    ) -> None:
        # These set DatapointsToAlarm always (all of the periods unless said otherwise).
        alarms[name] = _alarm(
            scope,
            name,
            metric,
            topic=topic,
            threshold=threshold,
            description=description,
            periods=periods,
            datapoints=datapoints or periods,
            comparison=comparison,
        )

    # The proxy's only clients are the writers (reserved concurrency R, one connection each)
    # and the breaker (reserved concurrency 1, one connection per check, closed at its end);
    # the migration connects to the instance directly. Old execution environments can linger
    # for a while after a deploy, hence twice R + 1.
    expected_connections = 2 * (settings.writer_reserved_concurrency + 1)
    alarm(
        "DlqNotEmpty",
        dlq.metric_approximate_number_of_messages_visible(statistic="Maximum", period=PERIOD),
        threshold=0,
        description="Poison reports are waiting in the DLQ: fix the cause, then "
        "`ckpt-pipeline replay-dlq`.",
    )
    alarm(
        "OldestReportAge",
        queue.metric_approximate_age_of_oldest_message(statistic="Maximum", period=PERIOD),
        threshold=constants.QUEUE_AGE_ALARM_S,
        description="Reports wait in the queue: the writer fails, is throttled or behind.",
        periods=2,
    )
    alarm(
        "WriterErrors",
        writer.metric_errors(period=PERIOD, statistic="Sum"),
        threshold=0,
        description="Writer invocations failed as a whole (exceptions, timeouts).",
        periods=3,
        datapoints=2,
    )
    alarm(
        "WriterThrottles",
        writer.metric_throttles(period=PERIOD, statistic="Sum"),
        threshold=0,
        description="Writer invocations throttled: throttled batches raise receive counts.",
    )
    alarm(
        "ProxyClientConnections",
        proxy_metric(proxy, "ClientConnections"),
        threshold=expected_connections,
        description="More clients on the proxy than the pipeline's functions can open.",
        periods=3,
    )
    alarm(
        "ProxyDatabaseConnections",
        proxy_metric(proxy, "DatabaseConnections"),
        threshold=expected_connections,
        description="The proxy holds more database connections than the pipeline needs "
        "(pinning or leaks): it eats into the instance's max_connections.",
        periods=3,
    )

    # Near the timeout a batch is one slow connect away from being killed and redelivered
    # (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/Best_Practice_Recommended_Alarms_AWS_Services.html#Lambda,
    # Duration: alarm before invocations reach the function's timeout).
    alarm(
        "WriterDurationNearTimeout",
        writer.metric_duration(period=PERIOD, statistic="Maximum"),
        threshold=WRITER_DURATION_ALARM_MS,
        description=f"A writer invocation took over {WRITER_DURATION_ALARM_FRACTION:.0%} of "
        f"its {constants.WRITER_TIMEOUT_S} s timeout: slow database or proxy borrow.",
        periods=3,
        datapoints=2,
    )
    # The writer's own EMF metrics (lambda_writer/writer/handler.py, namespace from
    # POWERTOOLS_METRICS_NAMESPACE, dimension service).
    alarm(
        "PoisonRecords",
        writer_metric("PoisonRecords"),
        threshold=0,
        description="The writer dead-lettered reports it can never write (invalid, unknown "
        "schema, refused by the database): see the DLQ's ErrorClass/ErrorMessage.",
    )
    # Restart records (ckpt.restart.v1): a job's restart_call that was the third (loop_after) in a
    # row from one checkpoint without a newer one completing. One is enough: each such restart
    # costs the whole cluster a relaunch.
    alarm(
        "RestartLoop",
        writer_metric("RestartLoops"),
        threshold=0,
        description="A job restarted again and again from the same checkpoint (a crash loop): "
        "`ckpt-pipeline restarts --job J` names it; see docs/operations.md, After a restart.",
    )
    alarm(
        "TransientFailures",
        writer_metric("TransientFailures"),
        threshold=0,
        description="Batches failed transiently (connection, timeout, deadlock) for 15 "
        "minutes in a row: they are being retried, but the database path is unhealthy.",
        periods=3,
    )

    # AvailabilityPercentage is published per target role (dimension set ProxyName,
    # TargetGroup, TargetRole): the share of the proxy's health checks of the instance that
    # succeeded (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-proxy.monitoring.html).
    alarm(
        "ProxyTargetUnavailable",
        proxy_availability(proxy),
        threshold=PROXY_AVAILABILITY_ALARM_PERCENT,
        comparison=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
        description="RDS Proxy could not reach the database for part of 3 of the last 5 "
        "minutes: writers fail their borrows and reports wait in the queue.",
        periods=5,
        datapoints=3,
    )
    alarm(
        "ProxyBorrowLatency",
        proxy_metric(proxy, "DatabaseConnectionsBorrowLatency"),
        threshold=PROXY_BORROW_LATENCY_ALARM_US,
        description="Getting a pooled connection took over half the proxy's "
        f"{constants.PROXY_BORROW_TIMEOUT_S} s borrow timeout: the pool is exhausted "
        "(MaxConnectionsPercent) or the database slow to accept connections.",
        periods=3,
        datapoints=2,
    )

    spec = settings.database
    if instance is not None and isinstance(spec, NewDatabase):
        # CPU > 90 % for 5 of 5 minutes is CloudWatch's recommended alarm for RDS; the free
        # storage and memory thresholds are left to the workload there
        # (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/Best_Practice_Recommended_Alarms_AWS_Services.html#RDS).
        alarm(
            "DatabaseCpu",
            instance.metric_cpu_utilization(period=MINUTE, statistic="Average"),
            threshold=DB_CPU_ALARM_PERCENT,
            description="The checkpoint database's CPU has been above 90 % for 5 minutes.",
            periods=5,
        )
        storage_floor = spec.allocated_storage_gib * 2**30 * DB_FREE_STORAGE_ALARM_FRACTION
        alarm(
            "DatabaseFreeStorage",
            instance.metric_free_storage_space(period=PERIOD, statistic="Minimum"),
            threshold=storage_floor,
            comparison=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            description=f"Less than {DB_FREE_STORAGE_ALARM_FRACTION:.0%} of the "
            f"{spec.allocated_storage_gib} GiB left: PostgreSQL stops writing when it is full.",
        )
        alarm(
            "DatabaseFreeableMemory",
            instance.metric_freeable_memory(period=PERIOD, statistic="Minimum"),
            threshold=DB_FREEABLE_MEMORY_ALARM_BYTES,
            comparison=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            description="Under 100 MiB of freeable memory on the checkpoint database: it swaps "
            "or is about to be killed for memory; move to a larger dbInstanceClass.",
            periods=3,
            datapoints=2,
        )
    return alarms


def breaker_alarms(scope: Construct, *, function: lambda_.IFunction, topic: sns.ITopic) -> Alarms:
    """The circuit breaker's two alarms (in the breaker construct's scope), by name."""
    return {
        "BreakerOpen": _alarm(
            scope,
            "BreakerOpen",
            breaker_metric("BreakerOpen"),
            topic=topic,
            threshold=0,
            description="The database is unreachable: the writer's event source mapping is "
            "disabled and reports wait in the queue (nothing is dead-lettered). It re-enables "
            "itself when the health check passes; see docs/operations.md 'Database outage'.",
            # While the breaker cannot run, keep the last state: an open breaker stays in ALARM.
            missing=cloudwatch.TreatMissingData.IGNORE,
        ),
        "BreakerErrors": _alarm(
            scope,
            "BreakerErrors",
            function.metric_errors(period=Duration.minutes(5), statistic="Sum"),
            topic=topic,
            threshold=0,
            description="The writer's circuit breaker fails (cannot read or switch the mapping): "
            "an open breaker will not close by itself.",
        ),
    }


def pruner_alarms(
    scope: Construct, *, function: lambda_.IFunction, every_hours: int, topic: sns.ITopic
) -> Alarms:
    """The scheduled prune's alarm (in the pruner construct's scope), by name."""
    return {
        "PrunerErrors": _alarm(
            scope,
            "PrunerErrors",
            # A window of one schedule interval (at most a day, CloudWatch's longest alarm
            # period): a failed run keeps the alarm in ALARM until the next run's window.
            function.metric_errors(period=Duration.hours(min(every_hours, 24)), statistic="Sum"),
            topic=topic,
            threshold=0,
            description="The scheduled prune failed (the database refused the role ckpt_pruner, "
            "a timeout, its kept checkpoints kept changing): rows are not being pruned. Its log "
            "names the error; docs/operations.md 'Scheduled prune'.",
        ),
    }

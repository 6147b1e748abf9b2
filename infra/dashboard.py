"""The pipeline's CloudWatch dashboard: queue, writer, records, proxy, database, breaker."""

from __future__ import annotations

from aws_cdk import Aws, Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_rds as rds
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra import constants
from infra.alarms import WRITER_DURATION_ALARM_MS, Alarms
from infra.metrics import (
    BREAKER_METRICS,
    MINUTE,
    PERIOD,
    PRUNER_METRICS,
    breaker_metric,
    proxy_availability,
    proxy_metric,
    pruner_metric,
    writer_metric,
)
from infra.settings import PipelineSettings


def pipeline_dashboard(
    scope: Construct,
    *,
    settings: PipelineSettings,
    queue: sqs.IQueue,
    dlq: sqs.IQueue,
    writer: lambda_.IFunction,
    proxy: rds.IDatabaseProxy,
    instance: rds.IDatabaseInstance | None,
    alarms: Alarms,
) -> cloudwatch.Dashboard:
    """The dashboard, with a status widget of ``alarms`` (the list it has now)."""
    # Named, because people open it by name; dashboards are global to the account (their
    # ARN has no region), so the region is part of the name and the same stack in two regions
    # gets two dashboards.
    dashboard = cloudwatch.Dashboard(
        scope, "Dashboard", dashboard_name=f"{settings.stack_name}-{Aws.REGION}"
    )
    dashboard.add_widgets(
        cloudwatch.GraphWidget(
            title="Queue",
            left=[
                queue.metric_approximate_number_of_messages_visible(period=PERIOD),
                queue.metric_approximate_number_of_messages_not_visible(period=PERIOD),
                dlq.metric_approximate_number_of_messages_visible(period=PERIOD),
            ],
            right=[queue.metric_approximate_age_of_oldest_message(period=PERIOD)],
        ),
        cloudwatch.GraphWidget(
            title="Writer",
            left=[
                writer.metric_invocations(period=PERIOD),
                writer.metric_errors(period=PERIOD),
                writer.metric_throttles(period=PERIOD),
            ],
            right=[
                writer.metric_duration(period=PERIOD, statistic="p99"),
                writer.metric_duration(period=PERIOD, statistic="Maximum"),
            ],
            right_annotations=[
                cloudwatch.HorizontalAnnotation(
                    value=constants.WRITER_TIMEOUT_S * 1000, label="timeout (ms)"
                ),
                cloudwatch.HorizontalAnnotation(
                    value=WRITER_DURATION_ALARM_MS, label="Duration alarm"
                ),
            ],
        ),
        cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(alarms.values())),
    )
    dashboard.add_widgets(
        cloudwatch.GraphWidget(
            title="Records",
            left=[
                writer_metric(name)
                for name in (
                    "RecordsWritten",
                    "RowsChanged",
                    "NoopReplays",
                    "PoisonRecords",
                    "TransientFailures",
                )
            ],
            right=[writer_metric("BatchLatencyMs", "p99")],
        ),
        cloudwatch.GraphWidget(
            title="RDS Proxy",
            left=[
                proxy_metric(proxy, "ClientConnections"),
                proxy_metric(proxy, "DatabaseConnections"),
                proxy_metric(proxy, "DatabaseConnectionsCurrentlySessionPinned"),
            ],
            right=[proxy_metric(proxy, "DatabaseConnectionsBorrowLatency")],
        ),
        cloudwatch.GraphWidget(
            title="RDS Proxy target availability (%)",
            left=[proxy_availability(proxy)],
            left_y_axis=cloudwatch.YAxisProps(min=0, max=100),
        ),
    )
    # Restart records (ckpt.restart.v1): how often jobs restart and how long until they train
    # again. Without a job dimension (a metric per job would cost per job and outlive it); per
    # job: ckpt-pipeline restarts --job J.
    hourly = Duration.hours(1)
    dashboard.add_widgets(
        cloudwatch.GraphWidget(
            title="Restarts (per hour, all jobs)",
            left=[
                writer_metric("Restarts").with_(period=hourly),
                writer_metric("RestartLoops").with_(period=hourly),
            ],
        ),
        cloudwatch.GraphWidget(
            title="Time to train again after a restart (s)",
            left=[
                writer_metric("RestartSeconds", "Maximum"),
                writer_metric("RestartSeconds", "p50"),
            ],
        ),
    )
    if instance is not None:
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Database CPU (%)",
                left=[instance.metric_cpu_utilization(period=MINUTE)],
                left_y_axis=cloudwatch.YAxisProps(min=0, max=100),
            ),
            cloudwatch.GraphWidget(
                title="Database free storage and memory (bytes)",
                left=[instance.metric_free_storage_space(period=PERIOD)],
                right=[instance.metric_freeable_memory(period=PERIOD)],
            ),
        )
    return dashboard


def add_breaker_row(
    dashboard: cloudwatch.Dashboard, *, function: lambda_.IFunction, alarms: Alarms
) -> None:
    """The circuit breaker's metrics and alarms, one row of their own. An alarm status widget
    copies its alarm list when it is built, hence a second one for the breaker's."""
    errors = function.metric_errors(period=PERIOD, statistic="Sum")
    dashboard.add_widgets(
        cloudwatch.GraphWidget(
            title="Circuit breaker (1 = open / healthy)",
            left=[breaker_metric(name) for name in BREAKER_METRICS],
            left_y_axis=cloudwatch.YAxisProps(min=0, max=1),
            right=[function.metric_invocations(period=PERIOD, statistic="Sum"), errors],
        ),
        cloudwatch.AlarmStatusWidget(title="Circuit breaker alarms", alarms=list(alarms.values())),
    )


def add_pruner_row(
    dashboard: cloudwatch.Dashboard, *, function: lambda_.IFunction, alarms: Alarms
) -> None:
    """The scheduled prune's metrics (EMF, ``service=ckpt-pruner``) and alarm, one row."""
    dashboard.add_widgets(
        cloudwatch.GraphWidget(
            title="Scheduled prune (rows removed per run)",
            left=[pruner_metric(name) for name in PRUNER_METRICS],
            right=[
                function.metric_invocations(period=PERIOD, statistic="Sum"),
                function.metric_errors(period=PERIOD, statistic="Sum"),
            ],
        ),
        cloudwatch.AlarmStatusWidget(title="Scheduled prune alarm", alarms=list(alarms.values())),
    )

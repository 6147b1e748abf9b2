"""Alarms, their SNS topic and a CloudWatch dashboard for the pipeline."""

from __future__ import annotations

from typing import Any

from aws_cdk import Annotations, Aws, Duration, RemovalPolicy
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_rds as rds
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra import constants
from infra.breaker import BREAKER_METRICS, WriterCircuitBreaker, breaker_metric
from infra.settings import NewDatabase, PipelineSettings

_PERIOD = Duration.seconds(constants.ALARM_PERIOD_S)
_MINUTE = Duration.minutes(1)
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
# The id of the synth-time warning that no one receives the alarms (greenfield default).
NO_SUBSCRIBER_WARNING = "ckpt-pipeline:noAlarmSubscriber"


def cloudwatch_alarms_of_this_account() -> dict[str, Any]:
    """IAM conditions: the request comes from a CloudWatch alarm of this account and region."""
    return {
        "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
        "ArnLike": {
            "aws:SourceArn": f"arn:{Aws.PARTITION}:cloudwatch:{Aws.REGION}:{Aws.ACCOUNT_ID}:alarm:*"
        },
    }


def proxy_metric(proxy: rds.IDatabaseProxy, name: str) -> cloudwatch.Metric:
    """An RDS Proxy metric for the whole proxy (dimension set ``ProxyName``)

    (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-proxy.monitoring.html).
    """
    return cloudwatch.Metric(
        namespace="AWS/RDS",
        metric_name=name,
        dimensions_map={"ProxyName": proxy.db_proxy_name},
        statistic="Maximum",
        period=_PERIOD,
    )


def proxy_availability(proxy: rds.IDatabaseProxy) -> cloudwatch.Metric:
    """AvailabilityPercentage of the proxy's default target group in its read/write role."""
    return cloudwatch.Metric(
        namespace="AWS/RDS",
        metric_name="AvailabilityPercentage",
        dimensions_map={
            "ProxyName": proxy.db_proxy_name,
            "TargetGroup": "default",
            "TargetRole": "READ_WRITE",
        },
        statistic="Average",
        period=_MINUTE,
    )


def writer_metric(name: str, statistic: str = "Sum") -> cloudwatch.Metric:
    """An EMF metric of the writer (Powertools: namespace + ``service`` dimension)."""
    return cloudwatch.Metric(
        namespace=constants.METRICS_NAMESPACE,
        metric_name=name,
        dimensions_map={"service": constants.WRITER_SERVICE_NAME},
        statistic=statistic,
        period=_PERIOD,
    )


class PipelineMonitoring(Construct):
    """``topic`` (encrypted, TLS only), ``alarms`` by name, and ``dashboard``.

    The circuit breaker needs ``topic`` for its alarms, so it is built after this construct and
    shown on the dashboard afterwards: :meth:`show_breaker`.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: PipelineSettings,
        queue: sqs.IQueue,
        dlq: sqs.IQueue,
        writer: lambda_.IFunction,
        proxy: rds.IDatabaseProxy,
        instance: rds.IDatabaseInstance | None = None,
    ) -> None:
        """``instance``: the greenfield database (its CPU, storage and memory are alarmed)."""
        super().__init__(scope, construct_id)
        # A customer key: CloudWatch alarms cannot publish to a topic encrypted with the AWS
        # managed aws/sns key, whose policy cannot grant cloudwatch.amazonaws.com
        # (https://docs.aws.amazon.com/sns/latest/dg/sns-key-management.html#compatibility-with-aws-services).
        key = kms.Key(
            self,
            "TopicKey",
            description="Checkpoint pipeline alarm topic",
            enable_key_rotation=True,
            # SNS keeps no messages, so nothing outlives the topic that this key would still have
            # to decrypt: scheduled for deletion with the stack, not left behind (aws-cdk's
            # default for keys is RETAIN).
            removal_policy=RemovalPolicy.DESTROY,
        )
        # CloudWatch acts for whoever owns the alarm: without the source conditions, an alarm in
        # any other account could use this key and topic (confused deputy,
        # https://docs.aws.amazon.com/sns/latest/dg/sns-access-policy-use-cases.html).
        from_our_alarms = cloudwatch_alarms_of_this_account()
        key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AlarmsOfThisAccountEncrypt",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],  # in a key policy "*" is this key
                conditions=from_our_alarms,
            )
        )
        self.topic = sns.Topic(
            self,
            "AlarmTopic",
            display_name="Checkpoint pipeline alarms",
            master_key=key,
            enforce_ssl=True,
        )
        # A topic policy replaces SNS's default one, which is what let the account's own services
        # publish: without this statement every alarm action fails with "not authorized to
        # perform SNS:Publish" (https://docs.aws.amazon.com/sns/latest/dg/sns-access-policy-use-cases.html).
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AlarmsOfThisAccountPublish",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["sns:Publish"],
                resources=[self.topic.topic_arn],
                conditions=from_our_alarms,
            )
        )
        if settings.alarm_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(settings.alarm_email))
        else:
            Annotations.of(self).add_warning_v2(
                NO_SUBSCRIBER_WARNING,
                "alarmEmail is empty: nobody is subscribed to the alarm topic, so alarms notify "
                "no one. Set -c alarmEmail=ops@example.com or subscribe to the AlarmTopicArn "
                "output.",
            )

        # The proxy's only clients are the writers (reserved concurrency R, one connection each)
        # and the breaker (reserved concurrency 1, one connection per check, closed at its end);
        # the migration connects to the instance directly. Old execution environments can linger
        # for a while after a deploy, hence twice R + 1.
        expected_connections = 2 * (settings.writer_reserved_concurrency + 1)
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        self._alarm(
            "DlqNotEmpty",
            dlq.metric_approximate_number_of_messages_visible(statistic="Maximum", period=_PERIOD),
            threshold=0,
            description="Poison reports are waiting in the DLQ: fix the cause, then "
            "`ckpt-pipeline replay-dlq`.",
        )
        self._alarm(
            "OldestReportAge",
            queue.metric_approximate_age_of_oldest_message(statistic="Maximum", period=_PERIOD),
            threshold=constants.QUEUE_AGE_ALARM_S,
            description="Reports wait in the queue: the writer fails, is throttled or behind.",
            periods=2,
        )
        self._alarm(
            "WriterErrors",
            writer.metric_errors(period=_PERIOD, statistic="Sum"),
            threshold=0,
            description="Writer invocations failed as a whole (exceptions, timeouts).",
            periods=3,
            datapoints=2,
        )
        self._alarm(
            "WriterThrottles",
            writer.metric_throttles(period=_PERIOD, statistic="Sum"),
            threshold=0,
            description="Writer invocations throttled: throttled batches raise receive counts.",
        )
        self._alarm(
            "ProxyClientConnections",
            proxy_metric(proxy, "ClientConnections"),
            threshold=expected_connections,
            description="More clients on the proxy than the pipeline's functions can open.",
            periods=3,
        )
        self._alarm(
            "ProxyDatabaseConnections",
            proxy_metric(proxy, "DatabaseConnections"),
            threshold=expected_connections,
            description="The proxy holds more database connections than the pipeline needs "
            "(pinning or leaks): it eats into the instance's max_connections.",
            periods=3,
        )
        self._writer_alarms(writer)
        self._proxy_health_alarms(proxy)
        if instance is not None and isinstance(settings.database, NewDatabase):
            self._database_alarms(instance, settings.database)
        self.dashboard = self._dashboard(settings, queue, dlq, writer, proxy, instance)

    def _writer_alarms(self, writer: lambda_.IFunction) -> None:
        # Near the timeout a batch is one slow connect away from being killed and redelivered
        # (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/Best_Practice_Recommended_Alarms_AWS_Services.html#Lambda,
        # Duration: alarm before invocations reach the function's timeout).
        self._alarm(
            "WriterDurationNearTimeout",
            writer.metric_duration(period=_PERIOD, statistic="Maximum"),
            threshold=WRITER_DURATION_ALARM_MS,
            description=f"A writer invocation took over {WRITER_DURATION_ALARM_FRACTION:.0%} of "
            f"its {constants.WRITER_TIMEOUT_S} s timeout: slow database or proxy borrow.",
            periods=3,
            datapoints=2,
        )
        # The writer's own EMF metrics (lambda_writer/handler.py, namespace from
        # POWERTOOLS_METRICS_NAMESPACE, dimension service).
        self._alarm(
            "PoisonRecords",
            writer_metric("PoisonRecords"),
            threshold=0,
            description="The writer dead-lettered reports it can never write (invalid, unknown "
            "schema, refused by the database): see the DLQ's ErrorClass/ErrorMessage.",
        )
        self._alarm(
            "TransientFailures",
            writer_metric("TransientFailures"),
            threshold=0,
            description="Batches failed transiently (connection, timeout, deadlock) for 15 "
            "minutes in a row: they are being retried, but the database path is unhealthy.",
            periods=3,
        )

    def _proxy_health_alarms(self, proxy: rds.IDatabaseProxy) -> None:
        # AvailabilityPercentage is published per target role (dimension set ProxyName,
        # TargetGroup, TargetRole): the share of the proxy's health checks of the instance that
        # succeeded (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-proxy.monitoring.html).
        self._alarm(
            "ProxyTargetUnavailable",
            proxy_availability(proxy),
            threshold=PROXY_AVAILABILITY_ALARM_PERCENT,
            comparison=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            description="RDS Proxy could not reach the database for part of 3 of the last 5 "
            "minutes: writers fail their borrows and reports wait in the queue.",
            periods=5,
            datapoints=3,
        )
        self._alarm(
            "ProxyBorrowLatency",
            proxy_metric(proxy, "DatabaseConnectionsBorrowLatency"),
            threshold=PROXY_BORROW_LATENCY_ALARM_US,
            description="Getting a pooled connection took over half the proxy's "
            f"{constants.PROXY_BORROW_TIMEOUT_S} s borrow timeout: the pool is exhausted "
            "(MaxConnectionsPercent) or the database slow to accept connections.",
            periods=3,
            datapoints=2,
        )

    def _database_alarms(self, instance: rds.IDatabaseInstance, spec: NewDatabase) -> None:
        # CPU > 90 % for 5 of 5 minutes is CloudWatch's recommended alarm for RDS; the free
        # storage and memory thresholds are left to the workload there
        # (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/Best_Practice_Recommended_Alarms_AWS_Services.html#RDS).
        self._alarm(
            "DatabaseCpu",
            instance.metric_cpu_utilization(period=_MINUTE, statistic="Average"),
            threshold=DB_CPU_ALARM_PERCENT,
            description="The checkpoint database's CPU has been above 90 % for 5 minutes.",
            periods=5,
        )
        storage_floor = spec.allocated_storage_gib * 2**30 * DB_FREE_STORAGE_ALARM_FRACTION
        self._alarm(
            "DatabaseFreeStorage",
            instance.metric_free_storage_space(period=_PERIOD, statistic="Minimum"),
            threshold=storage_floor,
            comparison=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            description=f"Less than {DB_FREE_STORAGE_ALARM_FRACTION:.0%} of the "
            f"{spec.allocated_storage_gib} GiB left: PostgreSQL stops writing when it is full.",
        )
        self._alarm(
            "DatabaseFreeableMemory",
            instance.metric_freeable_memory(period=_PERIOD, statistic="Minimum"),
            threshold=DB_FREEABLE_MEMORY_ALARM_BYTES,
            comparison=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            description="Under 100 MiB of freeable memory on the checkpoint database: it swaps "
            "or is about to be killed for memory; move to a larger dbInstanceClass.",
            periods=3,
            datapoints=2,
        )

    def _alarm(
        self,
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
        """An alarm on ``metric`` (which carries its period) that notifies on ALARM and OK."""
        alarm = cloudwatch.Alarm(
            self,
            name,
            metric=metric,
            threshold=threshold,
            comparison_operator=comparison,
            evaluation_periods=periods,
            datapoints_to_alarm=datapoints or periods,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=description,
        )
        alarm.add_alarm_action(actions.SnsAction(self.topic))
        alarm.add_ok_action(actions.SnsAction(self.topic))
        self.alarms[name] = alarm

    def _dashboard(
        self,
        settings: PipelineSettings,
        queue: sqs.IQueue,
        dlq: sqs.IQueue,
        writer: lambda_.IFunction,
        proxy: rds.IDatabaseProxy,
        instance: rds.IDatabaseInstance | None,
    ) -> cloudwatch.Dashboard:
        # Named, because people open it by name; dashboards are global to the account (their
        # ARN has no region), so the region is part of the name and the same stack in two regions
        # gets two dashboards.
        dashboard = cloudwatch.Dashboard(
            self, "Dashboard", dashboard_name=f"{settings.stack_name}-{Aws.REGION}"
        )
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Queue",
                left=[
                    queue.metric_approximate_number_of_messages_visible(period=_PERIOD),
                    queue.metric_approximate_number_of_messages_not_visible(period=_PERIOD),
                    dlq.metric_approximate_number_of_messages_visible(period=_PERIOD),
                ],
                right=[queue.metric_approximate_age_of_oldest_message(period=_PERIOD)],
            ),
            cloudwatch.GraphWidget(
                title="Writer",
                left=[
                    writer.metric_invocations(period=_PERIOD),
                    writer.metric_errors(period=_PERIOD),
                    writer.metric_throttles(period=_PERIOD),
                ],
                right=[
                    writer.metric_duration(period=_PERIOD, statistic="p99"),
                    writer.metric_duration(period=_PERIOD, statistic="Maximum"),
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
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(self.alarms.values())),
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
        if instance is not None:
            dashboard.add_widgets(
                cloudwatch.GraphWidget(
                    title="Database CPU (%)",
                    left=[instance.metric_cpu_utilization(period=_MINUTE)],
                    left_y_axis=cloudwatch.YAxisProps(min=0, max=100),
                ),
                cloudwatch.GraphWidget(
                    title="Database free storage and memory (bytes)",
                    left=[instance.metric_free_storage_space(period=_PERIOD)],
                    right=[instance.metric_freeable_memory(period=_PERIOD)],
                ),
            )
        return dashboard

    def show_breaker(self, breaker: WriterCircuitBreaker) -> None:
        """Put the breaker's metrics and alarms on the dashboard, one row of their own.

        Its alarms notify the topic already (infra/breaker.py); they are listed in ``alarms``
        too, so that ``alarms`` holds every alarm of the pipeline. An alarm status widget copies
        its alarm list when it is built, hence a second one for these two.
        """
        self.alarms.update(breaker.alarms)
        errors = breaker.function.metric_errors(period=_PERIOD, statistic="Sum")
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Circuit breaker (1 = open / healthy)",
                left=[breaker_metric(name) for name in BREAKER_METRICS],
                left_y_axis=cloudwatch.YAxisProps(min=0, max=1),
                right=[
                    breaker.function.metric_invocations(period=_PERIOD, statistic="Sum"),
                    errors,
                ],
            ),
            cloudwatch.AlarmStatusWidget(
                title="Circuit breaker alarms", alarms=list(breaker.alarms.values())
            ),
        )

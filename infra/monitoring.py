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
from infra.settings import PipelineSettings

_PERIOD = Duration.seconds(constants.ALARM_PERIOD_S)
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
    """``topic`` (encrypted, TLS only), ``alarms`` by name, and ``dashboard``."""

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
    ) -> None:
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

        # Each writer holds at most one proxy connection; old execution environments can linger
        # for a while after a deploy, hence twice (writers + migration).
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
        self.dashboard = self._dashboard(settings, queue, dlq, writer, proxy)

    def _alarm(
        self,
        name: str,
        metric: cloudwatch.IMetric,
        *,
        threshold: float,
        description: str,
        periods: int = 1,
        datapoints: int | None = None,
    ) -> None:
        alarm = cloudwatch.Alarm(
            self,
            name,
            metric=metric,
            threshold=threshold,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
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
                right=[writer.metric_duration(period=_PERIOD, statistic="p99")],
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
        )
        return dashboard

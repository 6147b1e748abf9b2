"""The metrics the alarms and the dashboard watch: RDS Proxy's, and the writer's and the
breaker's own EMF metrics (Powertools: namespace + ``service`` dimension)."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_rds as rds

from infra import constants

PERIOD = Duration.seconds(constants.ALARM_PERIOD_S)
MINUTE = Duration.minutes(1)
BREAKER_METRICS = ("BreakerOpen", "DatabaseHealthy")
PRUNER_METRICS = ("CheckpointsPruned", "ShardRowsPruned")


def proxy_metric(proxy: rds.IDatabaseProxy, name: str) -> cloudwatch.Metric:
    """An RDS Proxy metric for the whole proxy (dimension set ``ProxyName``)

    (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-proxy.monitoring.html).
    """
    return cloudwatch.Metric(
        namespace="AWS/RDS",
        metric_name=name,
        dimensions_map={"ProxyName": proxy.db_proxy_name},
        statistic="Maximum",
        period=PERIOD,
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
        period=MINUTE,
    )


def writer_metric(name: str, statistic: str = "Sum") -> cloudwatch.Metric:
    """An EMF metric of the writer (Powertools: namespace + ``service`` dimension)."""
    return cloudwatch.Metric(
        namespace=constants.METRICS_NAMESPACE,
        metric_name=name,
        dimensions_map={"service": constants.WRITER_SERVICE_NAME},
        statistic=statistic,
        period=PERIOD,
    )


def breaker_metric(name: str) -> cloudwatch.Metric:
    """An EMF metric of the breaker (Powertools: namespace + ``service`` dimension), per minute."""
    return cloudwatch.Metric(
        namespace=constants.METRICS_NAMESPACE,
        metric_name=name,
        dimensions_map={"service": constants.BREAKER_SERVICE_NAME},
        statistic="Maximum",
        period=MINUTE,
    )


def pruner_metric(name: str) -> cloudwatch.Metric:
    """An EMF metric of the scheduled prune (``service=ckpt-pruner``): rows removed, per day."""
    return cloudwatch.Metric(
        namespace=constants.METRICS_NAMESPACE,
        metric_name=name,
        dimensions_map={"service": constants.PRUNER_SERVICE_NAME},
        statistic="Sum",
        period=Duration.days(1),
    )

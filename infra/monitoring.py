"""The pipeline's monitoring, composed: the alarm topic (``alarm_topic.py``), every alarm
(``alarms.py``) and the dashboard (``dashboard.py``), under one construct."""

from __future__ import annotations

from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_rds as rds
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.alarm_topic import alarm_topic
from infra.alarms import Alarms, pipeline_alarms
from infra.breaker import WriterCircuitBreaker
from infra.dashboard import add_breaker_row, add_pruner_row, pipeline_dashboard
from infra.pruner import ScheduledPruner
from infra.settings import PipelineSettings


class PipelineMonitoring(Construct):
    """``topic`` (encrypted, TLS only), ``alarms`` by name (every alarm of the pipeline once
    :meth:`show_breaker` ran), and ``dashboard``.

    The circuit breaker needs ``topic`` for its alarms, so it is built after this construct and
    shown afterwards: :meth:`show_breaker`.
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
        self.topic = alarm_topic(self, settings)
        self.alarms: Alarms = pipeline_alarms(
            self,
            settings=settings,
            topic=self.topic,
            queue=queue,
            dlq=dlq,
            writer=writer,
            proxy=proxy,
            instance=instance,
        )
        self.dashboard = pipeline_dashboard(
            self,
            settings=settings,
            queue=queue,
            dlq=dlq,
            writer=writer,
            proxy=proxy,
            instance=instance,
            alarms=self.alarms,
        )

    def show_breaker(self, breaker: WriterCircuitBreaker) -> None:
        """List the breaker's alarms (``alarms.breaker_alarms``, in the breaker's scope) in
        ``alarms`` and give it a row of the dashboard."""
        self.alarms.update(breaker.alarms)
        add_breaker_row(self.dashboard, function=breaker.function, alarms=breaker.alarms)

    def show_pruner(self, pruner: ScheduledPruner) -> None:
        """List the scheduled prune's alarm in ``alarms`` and give it a row of the dashboard."""
        self.alarms.update(pruner.alarms)
        add_pruner_row(self.dashboard, function=pruner.function, alarms=pruner.alarms)

"""The writer's circuit breaker: a scheduled function that disables the writer's event source
mapping while the database is unreachable and enables it again once a check passes.

Why (``lambda_writer/breaker/circuit.py`` has the long form): without it, a database outage longer
than maxReceiveCount x visibility timeout (5 x 180 s as deployed) moves every valid report to the
DLQ. Lambda stops polling a disabled mapping and resumes where it stopped, so the reports wait in
the queue (retention 14 days) instead, with no receive counts spent.

* ``function``: the writer's code bundle, handler ``lambda_writer.breaker.handler.handler``, the
  writer's database settings and role (it checks exactly what the writer needs), reserved
  concurrency 1 (two runs never race on the mapping).
* ``rule``: EventBridge, every minute; no retries and a one-minute maximum event age, so a late
  or throttled run is dropped rather than acting on stale health.
* IAM: ``lambda:GetEventSourceMapping`` and ``lambda:UpdateEventSourceMapping`` on the writer's
  one mapping ARN (event source mapping actions take the mapping's ARN as resource,
  https://docs.aws.amazon.com/lambda/latest/dg/lambda-api-permissions-ref.html), and
  ``rds-db:connect`` as the writer's database user.
* ``alarms``: ``BreakerOpen`` (the mapping is disabled: the database is down, reports are
  queueing) and ``BreakerErrors`` (the breaker itself cannot run; while it fails an open breaker
  stays open), both to the pipeline's alarm topic; defined with every other alarm in
  ``infra/alarms.py``, created in this construct's scope.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from constructs import Construct

from infra import constants
from infra.alarms import breaker_alarms
from infra.database import DatabaseAccess
from infra.database_function import DatabaseFunction
from infra.network import PipelineNetwork
from infra.settings import PipelineSettings
from infra.writer import WriterFunction

BREAKER_SCHEDULE = Duration.minutes(1)


class WriterCircuitBreaker(DatabaseFunction):
    """``function``, its schedule ``rule`` and ``alarms`` by name."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: PipelineSettings,
        code: lambda_.Code,
        network: PipelineNetwork,
        database: DatabaseAccess,
        writer: WriterFunction,
        topic: sns.ITopic,
    ) -> None:
        mapping = writer.event_source
        # It checks the database exactly as the writer connects: same user, through the proxy.
        super().__init__(
            scope,
            construct_id,
            settings=settings,
            code=code,
            network=network,
            database=database,
            handler=constants.BREAKER_HANDLER,
            db_user=constants.WRITER_DB_USER,
            service=constants.BREAKER_SERVICE_NAME,
            description="Checkpoint pipeline: pauses the writer's queue while the DB is down",
            timeout_s=constants.BREAKER_TIMEOUT_S,
            memory_mb=constants.BREAKER_MEMORY_MB,
            environment={"EVENT_SOURCE_MAPPING_ID": mapping.event_source_mapping_id},
            reserved_concurrency=1,
        )
        self.function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["lambda:GetEventSourceMapping", "lambda:UpdateEventSourceMapping"],
                resources=[mapping.event_source_mapping_arn],
            )
        )
        network.add_lambda_api_endpoint(self, self.function)
        self.rule = events.Rule(
            self,
            "Schedule",
            description="Checkpoint pipeline: database health check for the writer's breaker",
            schedule=events.Schedule.rate(BREAKER_SCHEDULE),
            targets=[
                targets.LambdaFunction(
                    self.function, retry_attempts=0, max_event_age=Duration.minutes(1)
                )
            ],
        )
        self.alarms = breaker_alarms(self, function=self.function, topic=topic)

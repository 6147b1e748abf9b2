"""The scheduled prune (optional, off by default): an EventBridge schedule runs a small function
that applies the context's retention policy to every job, as ``ckpt-pipeline prune --all
--apply`` would, rows only (docs/operations.md "Scheduled prune", DESIGN "Retention: the
scheduled prune").

* ``function``: the writer's code bundle, handler ``lambda_writer.prune.handler.handler``,
  ``PRUNE_POLICY`` (the policy as JSON), reserved concurrency 1 (two runs never prune at once).
* Database: as role ``ckpt_pruner`` (migration 0011: the prune's reads, deletes, tombstones and
  functions, nothing of the writer's), straight to the instance with its own secret and SCRAM
  channel binding, as the migration connects. Not through the RDS Proxy: the proxy logs in with
  the secrets registered on it (the writer's only), and one connection a day needs no pool.
* IAM: ``secretsmanager:GetSecretValue`` on the pruner's secret; nothing else beyond Lambda's
  execution policies (no S3: objects stay where they are).
* ``rule``: EventBridge, every ``pruneEveryHours`` hours; two retries within an hour.
* ``alarms``: ``PrunerErrors`` (``infra/alarms.py``), to the pipeline's alarm topic.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from constructs import Construct

from infra import constants
from infra.alarms import pruner_alarms
from infra.database import DatabaseAccess
from infra.database_function import DatabaseFunction
from infra.exceptions import InfraError
from infra.network import PipelineNetwork
from infra.settings import PipelineSettings, ScheduledPrune


class ScheduledPruner(DatabaseFunction):
    """``function``, its schedule ``rule`` and ``alarms`` by name."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: PipelineSettings,
        schedule: ScheduledPrune,
        code: lambda_.Code,
        network: PipelineNetwork,
        database: DatabaseAccess,
        topic: sns.ITopic,
    ) -> None:
        if database.pruner_secret is None:
            raise InfraError("ScheduledPruner: the database construct made no pruner secret")
        super().__init__(
            scope,
            construct_id,
            settings=settings,
            code=code,
            network=network,
            database=database,
            handler=constants.PRUNER_HANDLER,
            db_user=constants.PRUNER_DB_USER,
            direct_secret=database.pruner_secret,
            service=constants.PRUNER_SERVICE_NAME,
            description="Checkpoint pipeline: scheduled prune of old checkpoints' rows",
            timeout_s=constants.PRUNER_TIMEOUT_S,
            memory_mb=constants.PRUNER_MEMORY_MB,
            environment={"PRUNE_POLICY": schedule.policy.to_json()},
            reserved_concurrency=1,
        )
        self.rule = events.Rule(
            self,
            "Schedule",
            description="Checkpoint pipeline: scheduled prune (the context's retention policy)",
            schedule=events.Schedule.rate(Duration.hours(schedule.every_hours)),
            targets=[
                targets.LambdaFunction(
                    self.function, retry_attempts=2, max_event_age=Duration.hours(1)
                )
            ],
        )
        self.alarms = pruner_alarms(
            self, function=self.function, every_hours=schedule.every_hours, topic=topic
        )

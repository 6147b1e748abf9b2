"""The checkpoint pipeline stack: composes one construct per concern and exports the outputs."""

from __future__ import annotations

from aws_cdk import CfnOutput, Stack
from aws_cdk import aws_lambda as lambda_
from cdk_nag import NagPackSuppression, NagSuppressions
from constructs import Construct

from infra import bundling
from infra.breaker import WriterCircuitBreaker
from infra.checkpoint_store import CheckpointStore
from infra.database import DatabaseAccess
from infra.database_function import LAMBDA_BASIC_POLICY, LOG_RETENTION
from infra.log_retention import give_provider_functions_log_retention
from infra.migrations import SchemaMigrations
from infra.monitoring import PipelineMonitoring
from infra.network import PipelineNetwork
from infra.pruner import ScheduledPruner
from infra.queueing import CheckpointQueues
from infra.settings import PipelineSettings
from infra.trainer_access import TrainerAccess
from infra.writer import RUNTIME, WriterFunction


class CheckpointPipelineStack(Stack):
    """Queues -> writer -> RDS Proxy -> PostgreSQL, with trainer access, migrations and alarms."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: PipelineSettings) -> None:
        super().__init__(
            scope,
            construct_id,
            description="Checkpoint metadata: SQS FIFO -> Lambda writer -> RDS Proxy -> PostgreSQL",
        )
        self.settings = settings
        code = bundling.writer_code(RUNTIME, wheelhouse=settings.wheelhouse)
        self.network = PipelineNetwork(self, "Network", settings=settings)
        self.queues = CheckpointQueues(self, "Queues", settings=settings)
        self.database = DatabaseAccess(self, "Database", settings=settings, network=self.network)
        self.migrations = SchemaMigrations(
            self,
            "Migrations",
            settings=settings,
            code=code,
            network=self.network,
            database=self.database,
        )
        self.writer = WriterFunction(
            self,
            "Writer",
            settings=settings,
            code=code,
            network=self.network,
            queues=self.queues,
            database=self.database,
        )
        # The proxy logs in as ckpt_writer, which the migration creates (infra/database.py).
        self.migrations.run_before(self.database.proxy, self.writer)
        self.checkpoint_store = (
            CheckpointStore(
                self,
                "CheckpointStore",
                store=settings.checkpoint_store,
                queue=self.queues.queue,
            )
            if settings.checkpoint_store is not None
            else None
        )
        self.trainer_access = TrainerAccess(
            self,
            "TrainerAccess",
            settings=settings,
            queue=self.queues.queue,
            store=self.checkpoint_store,
        )
        self.monitoring = PipelineMonitoring(
            self,
            "Monitoring",
            settings=settings,
            queue=self.queues.queue,
            dlq=self.queues.dlq,
            writer=self.writer.function,
            proxy=self.database.proxy,
            instance=self.database.instance if settings.creates_database else None,
        )
        self.breaker = WriterCircuitBreaker(
            self,
            "Breaker",
            settings=settings,
            code=code,
            network=self.network,
            database=self.database,
            writer=self.writer,
            topic=self.monitoring.topic,
        )
        self.monitoring.show_breaker(self.breaker)
        # Off unless the context turns it on: then the pruner's secret, role and schedule.
        self.pruner = (
            ScheduledPruner(
                self,
                "Pruner",
                settings=settings,
                schedule=settings.scheduled_prune,
                code=code,
                network=self.network,
                database=self.database,
                topic=self.monitoring.topic,
            )
            if settings.scheduled_prune is not None
            else None
        )
        if self.pruner is not None:
            self.migrations.run_before(self.pruner)
            self.monitoring.show_pruner(self.pruner)
        self._restrict_endpoints()
        self._outputs()
        self._suppress_trigger_provider()
        # Last, so that every provider function CDK added on its way is there to be found.
        give_provider_functions_log_retention(self, LOG_RETENTION)

    def _restrict_endpoints(self) -> None:
        """Only the stack's functions in the VPC (the callers of the endpoints) may use them, and
        SQS and Secrets Manager only on the stack's queues and secrets."""
        roles = [
            fn.role
            for fn in self.node.find_all()
            if isinstance(fn, lambda_.Function) and fn.is_bound_to_vpc and fn.role is not None
        ]
        database = self.database
        secrets = [database.master_secret, database.writer_secret]
        if database.pruner_secret is not None:
            secrets.append(database.pruner_secret)
        self.network.restrict_endpoints(
            roles,
            {
                "sqs": [self.queues.queue.queue_arn, self.queues.dlq.queue_arn],
                "secretsmanager": [secret.secret_arn for secret in secrets],
            },
        )

    def _outputs(self) -> None:
        store = self.checkpoint_store
        checkpoint_outputs = (
            (
                (
                    "CheckpointBucketName",
                    store.bucket.bucket_name,
                    "The checkpoint bucket (upload_to= / reconcile --store s3://<it>/<prefix>)",
                ),
                (
                    "ReconcilePolicyArn",
                    store.reconcile_policy.managed_policy_arn,
                    "Attach to the operators' role for ckpt-pipeline reconcile",
                ),
            )
            if store is not None
            else ()
        )
        for name, value, description in (
            *checkpoint_outputs,
            ("QueueUrl", self.queues.queue.queue_url, "CKPT_QUEUE_URL for the trainers"),
            ("DlqUrl", self.queues.dlq.queue_url, "Dead-letter queue (ckpt-pipeline replay-dlq)"),
            (
                "TrainerPolicyArn",
                self.trainer_access.policy.managed_policy_arn,
                "Attach to the training instances' role",
            ),
            ("ProxyEndpoint", self.database.proxy.endpoint, "RDS Proxy endpoint (IAM auth, TLS)"),
            (
                "AlarmTopicArn",
                self.monitoring.topic.topic_arn,
                "SNS topic of the alarms: subscribe on-call here",
            ),
        ):
            # Export names are an interface (Fn::ImportValue in the training stacks), so they are
            # named, but after this stack: a second stack (another prefix or region) never
            # collides, and nobody has to know the prefix to import them.
            CfnOutput(
                self,
                name,
                value=value,
                description=description,
                export_name=f"{self.stack_name}-{name}",
            )

    def _suppress_trigger_provider(self) -> None:
        # The Trigger's provider is CDK's own singleton custom-resource Lambda at stack level.
        NagSuppressions.add_resource_suppressions_by_path(
            self,
            f"/{self.stack_name}/AWSCDK.TriggerCustomResourceProviderCustomResourceProvider",
            [
                NagPackSuppression(
                    id="AwsSolutions-IAM4",
                    reason="CDK Trigger provider (framework code): basic execution role only.",
                    applies_to=[LAMBDA_BASIC_POLICY],
                ),
                NagPackSuppression(
                    id="AwsSolutions-L1",
                    reason="Runtime of CDK's Trigger provider is chosen by aws-cdk-lib, not by us.",
                ),
            ],
            apply_to_children=True,
        )

"""The writer Lambda: SQS FIFO event source -> RDS Proxy (IAM auth) -> PostgreSQL.

Concurrency. Reserved concurrency (1 or 2) is what bounds the database connections, whatever the
number of ranks. But Lambda's SQS pollers do not respect reserved concurrency: when they fetch more
batches than the function may run, the invocations are throttled, the messages come back after the
visibility timeout with a higher receive count, and valid reports drift towards the DLQ. The event
source's ``ScalingConfig.MaximumConcurrency`` caps the pollers instead, so:

* reserved concurrency 2 -> MaximumConcurrency 2 (never above the reserved concurrency);
* reserved concurrency 1 -> MaximumConcurrency cannot be set (its minimum is 2), so the queue's
  maxReceiveCount is raised to ``MAX_RECEIVE_COUNT_RESERVED_1`` to absorb throttled receives.

(https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html,
https://aws.amazon.com/blogs/compute/introducing-maximum-concurrency-of-aws-lambda-functions-when-using-amazon-sqs-as-an-event-source/)
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as event_sources
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra import constants
from infra.database import DatabaseAccess
from infra.network import PipelineNetwork
from infra.queueing import CheckpointQueues
from infra.settings import PipelineSettings

# The runtime CDK knows by that name (its bundling image and family come with it).
RUNTIME = next(
    rt for rt in lambda_.Runtime.ALL if rt.name == f"python{constants.LAMBDA_PYTHON_VERSION}"
)
ARCHITECTURE = lambda_.Architecture.ARM_64


def database_environment(
    settings: PipelineSettings, database: DatabaseAccess, *, db_user: str, service: str
) -> dict[str, str]:
    """The connection settings the writer code reads; never a secret value, only names."""
    return {
        "DB_HOST": database.proxy.endpoint,
        "DB_PORT": str(constants.DB_PORT),
        "DB_NAME": settings.db_name,
        "DB_USER": db_user,
        "DB_AUTH": "iam",
        "POWERTOOLS_SERVICE_NAME": service,
        "POWERTOOLS_METRICS_NAMESPACE": constants.METRICS_NAMESPACE,
    }


def pipeline_function(
    scope: Construct,
    construct_id: str,
    *,
    code: lambda_.Code,
    handler: str,
    network: PipelineNetwork,
    description: str,
    timeout_s: int,
    memory_mb: int,
    environment: dict[str, str],
    reserved_concurrency: int | None = None,
) -> lambda_.Function:
    """A function of the pipeline: arm64, private subnets, own security group and log group."""
    security_group = ec2.SecurityGroup(
        scope,
        f"{construct_id}SecurityGroup",
        vpc=network.vpc,
        description=f"{description}: out to the RDS Proxy and AWS APIs only",
        allow_all_outbound=False,
    )
    function = lambda_.Function(
        scope,
        construct_id,
        description=description,
        runtime=RUNTIME,
        architecture=ARCHITECTURE,
        code=code,
        handler=handler,
        timeout=Duration.seconds(timeout_s),
        memory_size=memory_mb,
        vpc=network.vpc,
        vpc_subnets=network.private_subnets,
        security_groups=[security_group],
        environment=environment,
        reserved_concurrent_executions=reserved_concurrency,
        log_group=logs.LogGroup(
            scope, f"{construct_id}Logs", retention=logs.RetentionDays.ONE_MONTH
        ),
    )
    network.allow_aws_api_access(function)
    return function


class CheckpointWriter(Construct):
    """``function`` (reserved concurrency 1-2) and its SQS ``event_source``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: PipelineSettings,
        code: lambda_.Code,
        network: PipelineNetwork,
        queues: CheckpointQueues,
        database: DatabaseAccess,
    ) -> None:
        super().__init__(scope, construct_id)
        environment = database_environment(
            settings,
            database,
            db_user=constants.WRITER_DB_USER,
            service=constants.WRITER_SERVICE_NAME,
        )
        environment["DLQ_URL"] = queues.dlq.queue_url
        self.function = pipeline_function(
            self,
            "Function",
            code=code,
            handler=constants.WRITER_HANDLER,
            network=network,
            description="Checkpoint pipeline writer: SQS FIFO reports into PostgreSQL",
            timeout_s=constants.WRITER_TIMEOUT_S,
            memory_mb=constants.WRITER_MEMORY_MB,
            environment=environment,
            reserved_concurrency=settings.writer_reserved_concurrency,
        )
        self.event_source = event_sources.SqsEventSource(
            queues.queue,
            # The FIFO maximum; FIFO event sources take no batching window
            # (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-configure.html).
            batch_size=constants.BATCH_SIZE,
            report_batch_item_failures=True,
            max_concurrency=settings.event_source_max_concurrency,
        )
        self.function.add_event_source(self.event_source)
        queues.dlq.grant_send_messages(self.function)
        database.allow_client(self.function)
        database.grant_connect(self.function, constants.WRITER_DB_USER)

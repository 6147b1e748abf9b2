"""One construct for "a pipeline function that talks to the database" (writer, migrations, ...).

Every such function is built the same way, so it is built in one place: the writer's code bundle on
arm64 in the private subnets, its own security group (out to the database path and the AWS APIs
only) and log group, the connection settings the code reads (names, never secret values), and one
way to the database as exactly one database user:

* through the RDS Proxy with an IAM token (the default; the writer, the breaker): a way to the
  proxy and ``rds-db:connect`` for that user on it;
* directly to the instance with a secret (``direct_secret``; the migration, which runs before the
  proxy exists): a way to the instance's port, ``secretsmanager:GetSecretValue`` on that secret,
  ``DB_AUTH=secret`` and ``DB_TLS=channel-binding`` (``lambda_writer.shared.settings.DbTls``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from aws_cdk import Duration
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from cdk_nag import NagPackSuppression, NagSuppressions
from constructs import Construct

from infra import constants
from infra.database import DatabaseAccess
from infra.exceptions import InfraError
from infra.network import PipelineNetwork
from infra.settings import PipelineSettings

# The runtime CDK knows by that name (its bundling image and family come with it).
RUNTIME = next(
    rt for rt in lambda_.Runtime.ALL if rt.name == f"python{constants.LAMBDA_PYTHON_VERSION}"
)
ARCHITECTURE = lambda_.Architecture.ARM_64
# Long enough to read back an incident a few weeks later; logs are not where the data lives.
LOG_RETENTION = logs.RetentionDays.ONE_MONTH
# AWS's managed execution policies as cdk-nag's AwsSolutions-IAM4 findings name them.
LAMBDA_BASIC_POLICY = (
    "Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"
)
LAMBDA_VPC_POLICY = (
    "Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole"
)


# Characters a VPC security group description may hold; anything else fails the deploy
# (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateSecurityGroup.html).
_GROUP_DESCRIPTION_REFUSED = re.compile(r"[^a-zA-Z0-9 ._\-:/()#,@\[\]+=&;{}!$*]")


def _group_description(text: str) -> str:
    """``text`` without the characters EC2 refuses in a security group description (e.g. ')."""
    return _GROUP_DESCRIPTION_REFUSED.sub("", text)


def database_environment(
    settings: PipelineSettings,
    database: DatabaseAccess,
    *,
    db_user: str,
    service: str,
    direct_secret: secretsmanager.ISecret | None = None,
) -> dict[str, str]:
    """The connection settings the writer code reads; never a secret value, only names."""
    path: dict[str, str]
    if direct_secret is None:
        # RDS Proxy for PostgreSQL listens on 5432 whatever the instance's own port.
        path = {
            "DB_HOST": database.proxy.endpoint,
            "DB_PORT": str(constants.DB_PORT),
            "DB_AUTH": "iam",
        }
    else:
        path = {
            "DB_HOST": database.instance.db_instance_endpoint_address,
            "DB_PORT": str(database.port),
            "DB_AUTH": "secret",
            "DB_SECRET_ARN": direct_secret.secret_arn,
            # No RDS CA bundle ships with the code; SCRAM channel binding authenticates the server.
            "DB_TLS": "channel-binding",
        }
    return {
        **path,
        "DB_NAME": settings.db_name,
        "DB_USER": db_user,
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
    environment: Mapping[str, str],
    reserved_concurrency: int | None = None,
    tracing: lambda_.Tracing | None = None,
    reaches: str = "the RDS Proxy",
) -> lambda_.Function:
    """A function of the pipeline: arm64, private subnets, own security group and log group."""
    security_group = ec2.SecurityGroup(
        scope,
        f"{construct_id}SecurityGroup",
        vpc=network.vpc,
        description=_group_description(f"{description}: out to {reaches} and AWS APIs only"),
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
        environment=dict(environment),
        reserved_concurrent_executions=reserved_concurrency,
        tracing=tracing,
        # Retained with the stack (aws-cdk's default for log groups): what the function logged
        # is evidence after a deletion too, and the retention bounds its cost.
        log_group=logs.LogGroup(scope, f"{construct_id}Logs", retention=LOG_RETENTION),
    )
    network.allow_aws_api_access(function)
    return function


class DatabaseFunction(Construct):
    """``function`` connected as ``db_user``: environment, network path and grant.

    Through the proxy with an IAM token, or, given ``direct_secret``, directly to the instance with
    that secret's password. ``environment`` adds to (never replaces) the connection settings;
    ``tracing`` is X-Ray's mode.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: PipelineSettings,
        code: lambda_.Code,
        network: PipelineNetwork,
        database: DatabaseAccess,
        handler: str,
        db_user: str,
        service: str,
        description: str,
        timeout_s: int,
        memory_mb: int,
        environment: Mapping[str, str] | None = None,
        reserved_concurrency: int | None = None,
        tracing: lambda_.Tracing | None = None,
        direct_secret: secretsmanager.ISecret | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        connection = database_environment(
            settings, database, db_user=db_user, service=service, direct_secret=direct_secret
        )
        clash = sorted(set(connection) & set(environment or {}))
        if clash:
            raise InfraError(
                f"environment: {clash} are connection settings made from db_user/service; "
                "they cannot be overridden"
            )
        self.db_user = db_user
        self.function = pipeline_function(
            self,
            "Function",
            code=code,
            handler=handler,
            network=network,
            description=description,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            environment={**connection, **(environment or {})},
            reserved_concurrency=reserved_concurrency,
            tracing=tracing,
            reaches="the RDS Proxy" if direct_secret is None else "the PostgreSQL instance",
        )
        if direct_secret is None:
            database.allow_client(self.function)
            database.grant_connect(self.function, db_user)
        else:
            database.allow_direct_client(self.function)
            database.grant_secret_value(self.function, direct_secret)
        assert self.function.role is not None
        suppressions = [
            NagPackSuppression(
                id="AwsSolutions-IAM4",
                reason="AWS's Lambda basic/VPC execution policies: log writes and the ENI "
                "calls a VPC function needs, which cannot be scoped to resources.",
                applies_to=[LAMBDA_BASIC_POLICY, LAMBDA_VPC_POLICY],
            )
        ]
        if tracing == lambda_.Tracing.ACTIVE:
            suppressions.append(
                NagPackSuppression(
                    id="AwsSolutions-IAM5",
                    reason="Active tracing: xray:PutTraceSegments/PutTelemetryRecords "
                    "support no resource-level permissions, so '*' is the only resource "
                    "(https://docs.aws.amazon.com/service-authorization/latest/reference/"
                    "list_awsx-ray.html).",
                    applies_to=["Resource::*"],
                )
            )
        NagSuppressions.add_resource_suppressions(
            self.function.role, suppressions, apply_to_children=True
        )

"""Deploy-time schema migrations: a CDK Trigger runs the migration function through the proxy.

The trigger runs after the database access (proxy, secrets, security group rules) exists and before
the writer (and so its event source mapping) is created or updated; it runs again whenever the
function's code changes, which includes every new file under ``lambda_writer/migrations``. A failed
migration fails the deployment, and CloudFormation rolls back before the writer sees a message.
"""

from __future__ import annotations

from typing import cast

from aws_cdk import Duration, triggers
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from infra import constants
from infra.database import DatabaseAccess
from infra.database_function import DatabaseFunction
from infra.network import PipelineNetwork
from infra.settings import PipelineSettings


class SchemaMigrations(DatabaseFunction):
    """``function`` (applies the versioned SQL as the master user) and its ``trigger``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: PipelineSettings,
        code: lambda_.Code,
        network: PipelineNetwork,
        database: DatabaseAccess,
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            settings=settings,
            code=code,
            network=network,
            database=database,
            handler=constants.MIGRATION_HANDLER,
            db_user=settings.db_master_user,
            service=constants.MIGRATION_SERVICE_NAME,
            description="Checkpoint pipeline: applies the versioned schema migrations",
            timeout_s=constants.MIGRATION_TIMEOUT_S,
            memory_mb=constants.MIGRATION_MEMORY_MB,
            # The proxy logs in as ckpt_writer with this secret, so the migration sets the role's
            # password from it; only the ARN travels in the environment.
            environment={"WRITER_PASSWORD_SECRET_ARN": database.writer_secret.secret_arn},
        )
        database.writer_secret.grant_read(self.function)
        self.trigger = triggers.Trigger(
            self,
            "Trigger",
            handler=self.function,
            invocation_type=triggers.InvocationType.REQUEST_RESPONSE,
            timeout=Duration.seconds(constants.MIGRATION_TIMEOUT_S),
            # The function's security group owns its rules towards the proxy and the endpoints.
            execute_after=[
                database,
                network,
                *(cast(Construct, g) for g in self.function.connections.security_groups),
            ],
            execute_on_handler_change=True,
        )

    def run_before(self, *constructs: Construct) -> None:
        """Create/update ``constructs`` only after the migrations succeeded."""
        self.trigger.execute_before(*constructs)

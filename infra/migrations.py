"""Deploy-time schema migrations: a CDK Trigger runs the migration function against the instance.

The function connects directly to the instance (not through the proxy) as the master user with the
master secret, over TLS with SCRAM channel binding. The trigger runs after the instance, both
secrets and the function's security group rules exist, and before the proxy (which logs in as the
``ckpt_writer`` role the migration creates; see ``infra/database.py`` for the order and its
sources) and the writer (and so its event source mapping) are created or updated. It runs again
whenever the function's code changes, which includes every new file under
``lambda_writer/migrations``. A failed migration fails the deployment, and CloudFormation rolls
back before the proxy or the writer exists.
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
            direct_secret=database.master_secret,
            service=constants.MIGRATION_SERVICE_NAME,
            description="Checkpoint pipeline: applies the versioned schema migrations",
            timeout_s=constants.MIGRATION_TIMEOUT_S,
            memory_mb=constants.MIGRATION_MEMORY_MB,
            # The proxy logs in as ckpt_writer with this secret, so the migration sets the role's
            # password from it; only the ARN travels in the environment.
            environment={
                "WRITER_PASSWORD_SECRET_ARN": database.writer_secret.secret_arn,
                # With the scheduled prune: role ckpt_pruner's password, from its own secret.
                **(
                    {"PRUNER_PASSWORD_SECRET_ARN": database.pruner_secret.secret_arn}
                    if database.pruner_secret is not None
                    else {}
                ),
            },
        )
        database.grant_secret_value(self.function, database.writer_secret)
        if database.pruner_secret is not None:
            database.grant_secret_value(self.function, database.pruner_secret)
        self.trigger = triggers.Trigger(
            self,
            "Trigger",
            handler=self.function,
            invocation_type=triggers.InvocationType.REQUEST_RESPONSE,
            timeout=Duration.seconds(constants.MIGRATION_TIMEOUT_S),
            # The function's security group owns its rules towards the instance and the endpoints.
            # Not ``database`` as a whole: it holds the proxy, which runs after the trigger.
            execute_after=[
                *database.migration_prerequisites,
                network,
                *(cast(Construct, g) for g in self.function.connections.security_groups),
            ],
            execute_on_handler_change=True,
        )

    def run_before(self, *constructs: Construct) -> None:
        """Create/update ``constructs`` (every resource under them) only after the migrations."""
        self.trigger.execute_before(*constructs)

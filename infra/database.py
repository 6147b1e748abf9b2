"""Database access: the PostgreSQL instance (imported or new), its RDS Proxy and the DB secrets.

The writer and its breaker authenticate to the proxy with IAM tokens only, over TLS; the proxy logs
in to PostgreSQL with the one secret registered on it, a generated secret for ``ckpt_writer``. The
master secret is not registered: the master user is not reachable through the proxy at all.

The migration connects directly to the instance as the master user with the master secret
(SCRAM with channel binding over TLS, ``lambda_writer.shared.settings.DbTls``), creates role
``ckpt_writer`` and sets its password from the writer secret; only then is the proxy created. A
secret registered on a proxy must hold the credentials of a user that exists
(https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-proxy-secrets-arns.html), and
CloudFormation's DBProxyTargetGroup waits for its target to become available
(https://github.com/aws/aws-cdk/issues/8919): a proxy created before the role could time out
before the migration ever ran. Deploy order: instance, secrets and security group rules ->
migration trigger -> proxy -> writer and breaker. Only the proxy and the migration function are
let into the database's security group.

Not the newer end-to-end IAM scheme (``DefaultAuthScheme.IAM_AUTH``, supported by aws-cdk-lib
2.275): it needs IAM database authentication switched on at the instance, ``rds-db:connect`` for
the proxy's role on the instance resource id, and an IAM-enabled (``rds_iam``) master user, whose
password login then stops working for everyone else on a shared instance such as ``ml-postgres``.
"""

from __future__ import annotations

import hashlib
import json
from typing import cast

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_rds as rds
from aws_cdk import aws_secretsmanager as secretsmanager
from cdk_nag import NagPackSuppression, NagSuppressions
from constructs import Construct

from infra import constants
from infra.network import PipelineNetwork, allow_client_to
from infra.settings import ExistingDatabase, NewDatabase, PipelineSettings

# Characters that break DSNs or shell quoting when an operator copies the password by hand.
_PASSWORD_EXCLUDE = " %+~`#$&*()|[]{}:;<>?!'/@\"\\"


class DatabaseAccess(Construct):
    """``instance``, ``proxy``, ``master_secret``, ``writer_secret``, ``port``; grant methods.

    ``migration_prerequisites``: what the migration needs before it runs (never the proxy, which
    is created after it).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: PipelineSettings,
        network: PipelineNetwork,
    ) -> None:
        super().__init__(scope, construct_id)
        self._settings = settings
        if isinstance(settings.database, NewDatabase):
            self.port = constants.DB_PORT
            self.instance, self.master_secret = self._new_instance(settings.database, network)
        else:
            self.port = settings.database.port
            self.instance, self.master_secret = self._existing_instance(settings.database)

        self.writer_secret = rds.DatabaseSecret(
            self,
            "WriterSecret",
            username=constants.WRITER_DB_USER,
            exclude_characters=_PASSWORD_EXCLUDE,
        )
        # Deleted with the stack on purpose: the role ckpt_writer lives in the database, and the
        # next stack's migration sets its password from that stack's new secret.
        self.writer_secret.apply_removal_policy(RemovalPolicy.DESTROY)
        # The scheduled prune's login (role ckpt_pruner, migration 0011), only with the schedule:
        # the migration sets the role's password from it, the pruner reads it to log in.
        self.pruner_secret: rds.DatabaseSecret | None = None
        if settings.scheduled_prune is not None:
            self.pruner_secret = rds.DatabaseSecret(
                self,
                "PrunerSecret",
                username=constants.PRUNER_DB_USER,
                exclude_characters=_PASSWORD_EXCLUDE,
            )
            self.pruner_secret.apply_removal_policy(RemovalPolicy.DESTROY)
        self.proxy_security_group = ec2.SecurityGroup(
            self,
            "ProxySecurityGroup",
            vpc=network.vpc,
            description="RDS Proxy of the checkpoint pipeline: in from the pipeline functions only",
            allow_all_outbound=False,
        )
        self.proxy = rds.DatabaseProxy(
            self,
            "Proxy",
            db_proxy_name=self._proxy_name(network),
            proxy_target=rds.ProxyTarget.from_instance(self.instance),
            # ckpt_writer only: the role exists when the proxy is created (the stack creates the
            # proxy after the migration), and the master user stays off the proxy.
            secrets=[self.writer_secret],
            vpc=network.vpc,
            vpc_subnets=network.private_subnets,
            security_groups=[self.proxy_security_group],
            iam_auth=True,
            require_tls=True,
            # Leaves the rest of max_connections to the instance's other clients; the writers need
            # at most reserved concurrency + 1 (migration) connections.
            max_connections_percent=settings.proxy_max_connections_percent,
            # Must not exceed MaxConnectionsPercent
            # (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-proxy-connections.html).
            max_idle_connections_percent=max(settings.proxy_max_connections_percent // 2, 0),
            borrow_timeout=Duration.seconds(constants.PROXY_BORROW_TIMEOUT_S),
            debug_logging=False,
        )
        # DatabaseProxy itself lets the proxy's group into the instance's security group on the
        # instance port (on an existing instance: one ingress rule added, nothing else changed);
        # the migration function's rule (allow_direct_client) is the only other one.
        # A new instance holds its master secret; an imported instance and secret are no resources.
        self.migration_prerequisites: tuple[Construct, ...] = (
            cast(Construct, self.instance),
            self.writer_secret,
            *((self.pruner_secret,) if self.pruner_secret is not None else ()),
        )
        for secret, role in (
            (self.writer_secret, constants.WRITER_DB_USER),
            (self.pruner_secret, constants.PRUNER_DB_USER),
        ):
            if secret is None:
                continue
            NagSuppressions.add_resource_suppressions(
                secret,
                [
                    NagPackSuppression(
                        id="AwsSolutions-SMG4",
                        reason=f"{role}'s password is set by the deploy-time migration from "
                        "this secret; rotating it needs a rotation function with DB access, "
                        "left to the operators.",
                    )
                ],
            )

    def _new_instance(
        self, spec: NewDatabase, network: PipelineNetwork
    ) -> tuple[rds.IDatabaseInstance, secretsmanager.ISecret]:
        security_group = ec2.SecurityGroup(
            self,
            "DatabaseSecurityGroup",
            vpc=network.vpc,
            description="Checkpoint pipeline PostgreSQL: in from the RDS Proxy and the migration",
            allow_all_outbound=False,
        )
        instance = rds.DatabaseInstance(
            self,
            "Database",
            engine=rds.DatabaseInstanceEngine.postgres(
                version=rds.PostgresEngineVersion.of(
                    constants.POSTGRES_MAJOR_VERSION, constants.POSTGRES_MAJOR_VERSION
                )
            ),
            instance_type=ec2.InstanceType(spec.instance_class),
            vpc=network.vpc,
            vpc_subnets=network.private_subnets,
            security_groups=[security_group],
            credentials=rds.Credentials.from_generated_secret(
                self._settings.db_master_user,
                exclude_characters=_PASSWORD_EXCLUDE,
            ),
            database_name=self._settings.db_name,
            port=constants.DB_PORT,
            allocated_storage=spec.allocated_storage_gib,
            storage_type=rds.StorageType.GP3,
            storage_encrypted=True,
            multi_az=spec.multi_az,
            deletion_protection=spec.deletion_protection,
            removal_policy=RemovalPolicy.SNAPSHOT
            if self._settings.retains_data
            else RemovalPolicy.DESTROY,
            backup_retention=Duration.days(spec.backup_retention_days),
            iam_authentication=True,
            publicly_accessible=False,
            auto_minor_version_upgrade=True,
            cloudwatch_logs_exports=["postgresql"],
            # RDS creates the export's log group without a retention (kept forever); CDK sets it
            # through its LogRetention provider.
            cloudwatch_logs_retention=logs.RetentionDays.ONE_MONTH,
        )
        assert instance.secret is not None  # from_generated_secret always attaches one
        # The final snapshot is useless without the master password it was taken with, so the
        # master secret outlives the stack exactly when the snapshot does.
        # (``instance.secret`` is the attachment; the generated secret is the child "Secret".)
        cast(secretsmanager.Secret, instance.node.find_child("Secret")).apply_removal_policy(
            RemovalPolicy.RETAIN if self._settings.retains_data else RemovalPolicy.DESTROY
        )
        # cfn-lint's W3691 knows only full versions and calls the bare major "deprecated"; RDS
        # accepts it and picks the default minor (see constants.POSTGRES_MAJOR_VERSION).
        cast(rds.CfnDBInstance, instance.node.default_child).add_metadata(
            "cfn-lint", {"config": {"ignore_checks": ["W3691"]}}
        )
        suppressions = [
            NagPackSuppression(
                id="AwsSolutions-SMG4",
                reason="The migration reads the master secret at connect time; rotation is an "
                "operator choice (add_rotation_single_user) that needs a rotation Lambda in the "
                "VPC.",
            ),
            NagPackSuppression(
                id="AwsSolutions-RDS11",
                reason="Only the RDS Proxy's and the migration function's security groups may "
                "connect; a non-default port adds no protection on top of that and would differ "
                "from every client's default.",
            ),
        ]
        if not spec.multi_az:
            suppressions.append(
                NagPackSuppression(
                    id="AwsSolutions-RDS3",
                    reason="Greenfield default is a small single-AZ instance; set "
                    "-c dbMultiAz=true "
                    "for production. Reports wait in SQS (14 days) during an outage.",
                )
            )
        if not spec.deletion_protection:
            suppressions.append(
                NagPackSuppression(
                    id="AwsSolutions-RDS10",
                    reason="Deletion protection was switched off explicitly with "
                    "-c dbDeletionProtection=false (throwaway environments).",
                )
            )
        NagSuppressions.add_resource_suppressions(instance, suppressions, apply_to_children=True)
        return instance, instance.secret

    def _existing_instance(
        self, spec: ExistingDatabase
    ) -> tuple[rds.IDatabaseInstance, secretsmanager.ISecret]:
        security_group = ec2.SecurityGroup.from_security_group_id(
            self, "DatabaseSecurityGroup", spec.security_group_id, mutable=True
        )
        instance = rds.DatabaseInstance.from_database_instance_attributes(
            self,
            "Database",
            instance_identifier=spec.instance_id,
            instance_endpoint_address=spec.endpoint,
            port=spec.port,
            security_groups=[security_group],
            engine=rds.DatabaseInstanceEngine.POSTGRES,
        )
        key = (
            kms.Key.from_key_arn(self, "MasterSecretKey", spec.secret_kms_key_arn)
            if spec.secret_kms_key_arn
            else None
        )
        secret = secretsmanager.Secret.from_secret_attributes(
            self, "MasterSecret", secret_complete_arn=spec.secret_arn, encryption_key=key
        )
        return instance, secret

    def _proxy_name(self, network: PipelineNetwork) -> str:
        """A proxy name unique to this stack that changes whenever the proxy must be replaced.

        DBProxyName is required by CloudFormation (it generates none) and unique per account and
        region (https://docs.aws.amazon.com/AmazonRDS/latest/APIReference/API_CreateDBProxy.html).
        A change of subnets or engine family replaces the proxy, and CloudFormation creates the
        new one before deleting the old, so those values are hashed into the name: a replacement
        never collides with the proxy it replaces.
        """
        selection = network.private_subnets
        subnets = network.vpc.select_subnets(
            subnet_type=selection.subnet_type, subnets=selection.subnets
        ).subnet_ids
        replaced_by = json.dumps(Stack.of(self).resolve(["POSTGRESQL", subnets]), sort_keys=True)
        digest = hashlib.sha256(replaced_by.encode()).hexdigest()[:8]
        # <= 20 + 20 + 9 characters, within the 60 allowed; the prefix rule forbids "--".
        return f"{self._settings.stack_name}-{digest}"

    def grant_connect(self, grantee: iam.IGrantable, db_user: str) -> None:
        """``rds-db:connect`` for ``db_user`` on this proxy only."""
        self.proxy.grant_connect(grantee, db_user)

    def grant_secret_value(self, grantee: iam.IGrantable, secret: secretsmanager.ISecret) -> None:
        """``secretsmanager:GetSecretValue`` on ``secret`` (and decrypt with its own KMS key).

        Not ``grant_read``: that adds DescribeSecret, which no function calls. A secret under
        AWS's ``aws/secretsmanager`` key needs nothing more; under a customer key, the caller
        needs ``kms:Decrypt`` through Secrets Manager
        (https://docs.aws.amazon.com/secretsmanager/latest/userguide/security-encryption.html).
        """
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["secretsmanager:GetSecretValue"], resources=[secret.secret_arn]
            )
        )
        if secret.encryption_key is not None:
            stack = Stack.of(self)
            grantee.grant_principal.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=["kms:Decrypt"],
                    resources=[secret.encryption_key.key_arn],
                    conditions={
                        "StringEquals": {
                            "kms:ViaService": f"secretsmanager.{stack.region}.{stack.url_suffix}"
                        }
                    },
                )
            )

    def allow_direct_client(self, client: ec2.IConnectable) -> None:
        """Let ``client`` reach the instance itself on its port (the migration: no proxy yet)."""
        allow_client_to(
            client,
            self.instance,
            self.port,
            "checkpoint pipeline migration to the PostgreSQL instance",
        )

    def allow_client(self, client: ec2.IConnectable) -> None:
        """Let ``client`` (a function's security group) reach the proxy on the PostgreSQL port."""
        # RDS Proxy for PostgreSQL listens on 5432 whatever the instance's own port.
        allow_client_to(
            client, self.proxy, constants.DB_PORT, "checkpoint pipeline function to RDS Proxy"
        )

"""The stack's settings: what ``ckpt_stack.context.parse_context`` builds from the CDK context.

Frozen, validated values; the CDK app (``infra``) builds the stack from :class:`PipelineSettings`
and ``ckpt-pipeline preflight`` asks the account whether that stack would deploy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lambda_writer import RetentionPolicy
from lambda_writer.shared.constants import MAX_RECEIVE_COUNT, MAX_RECEIVE_COUNT_RESERVED_1


@dataclass(frozen=True)
class ExistingNetwork:
    """An existing VPC, imported by attributes so that synth needs no AWS lookup."""

    vpc_id: str
    availability_zones: tuple[str, ...]
    private_subnet_ids: tuple[str, ...]


@dataclass(frozen=True)
class ExistingDatabase:
    """An existing RDS PostgreSQL instance (e.g. ``ml-postgres``) and its master secret."""

    instance_id: str
    endpoint: str
    port: int
    security_group_id: str
    secret_arn: str
    secret_kms_key_arn: str | None


@dataclass(frozen=True)
class NewDatabase:
    """A small greenfield PostgreSQL instance in private isolated subnets."""

    instance_class: str
    allocated_storage_gib: int
    multi_az: bool
    deletion_protection: bool
    backup_retention_days: int


@dataclass(frozen=True)
class CheckpointStoreSettings:
    """Where the jobs' checkpoints live on S3: an existing bucket, or one the stack creates."""

    # None when the stack creates the bucket (CloudFormation names it).
    bucket: str | None
    # "" (the whole bucket) or a key prefix ending in "/".
    prefix: str
    # A created bucket: days before S3 deletes a noncurrent version (None: kept forever, and
    # always for an existing bucket, whose lifecycle is its owner's).
    noncurrent_days: int | None = None
    # The trainers' UploadSettings.spread_prefixes (0: none): their objects are also at
    # ``<hex>/prefix…`` (one hex digit per power of 16), which the grants then cover too.
    spread_prefixes: int = 0

    @property
    def spread_width(self) -> int:
        """The hex digits in front of a spread key (0: not spread)."""
        return {0: 0, 16: 1, 256: 2, 4_096: 3, 65_536: 4}[self.spread_prefixes]

    @property
    def creates_bucket(self) -> bool:
        return self.bucket is None


@dataclass(frozen=True)
class ScheduledPrune:
    """The scheduled prune: how often, and the retention policy it applies to every job."""

    every_hours: int
    policy: RetentionPolicy


@dataclass(frozen=True)
class PipelineSettings:
    """Everything the stack is configured with; built only by :func:`parse_context`."""

    prefix: str
    network: ExistingNetwork | None
    database: ExistingDatabase | NewDatabase
    db_name: str
    db_master_user: str
    writer_reserved_concurrency: int
    alarm_email: str | None
    proxy_max_connections_percent: int
    high_throughput_fifo: bool
    create_vpc_endpoints: bool
    wheelhouse: Path | None
    # None: no checkpoint bucket is configured, and no S3 permission is granted.
    checkpoint_store: CheckpointStoreSettings | None = None
    # None (the default): no scheduled prune, and none of its resources.
    scheduled_prune: ScheduledPrune | None = None
    # The principal whose re-sends the writer takes for replays (REPLAY_PRINCIPAL_ID); None: a
    # replay is applied only where its sender owns the job itself.
    replay_principal_id: str | None = None
    # The stricter mode: the job-id prefixes each principal may write (JOB_PREFIXES); None: off.
    job_prefixes: Mapping[str, tuple[str, ...]] | None = None

    @property
    def creates_database(self) -> bool:
        """True for the greenfield deploy (a new instance), False for an existing one."""
        return isinstance(self.database, NewDatabase)

    @property
    def retains_data(self) -> bool:
        """Whether stack deletion keeps what holds data (queues, DLQ, database, master secret).

        Only a greenfield deploy with deletion protection switched off explicitly (a throwaway
        environment) deletes them; every other deploy keeps one consistent set.
        """
        return not (
            isinstance(self.database, NewDatabase) and not self.database.deletion_protection
        )

    @property
    def max_receive_count(self) -> int:
        """The redrive maxReceiveCount that goes with the reserved concurrency (see writer.py)."""
        if self.writer_reserved_concurrency == 1:
            return MAX_RECEIVE_COUNT_RESERVED_1
        return MAX_RECEIVE_COUNT

    @property
    def event_source_max_concurrency(self) -> int | None:
        """ScalingConfig.MaximumConcurrency: equal to reserved concurrency, impossible below 2."""
        if self.writer_reserved_concurrency >= 2:
            return self.writer_reserved_concurrency
        return None

    @property
    def stack_name(self) -> str:
        """The CloudFormation stack name."""
        return f"{self.prefix}-checkpoint-pipeline"

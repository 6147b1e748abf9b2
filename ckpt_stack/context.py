"""The CDK context (``cdk.json`` + ``-c key=value``): every key, its default and its rules, parsed
once into frozen, validated settings.

The one definition both readers import: the CDK app (``infra.settings``, which builds the stack
from :class:`PipelineSettings`) and ``ckpt-pipeline preflight`` (which asks the account whether
that stack would deploy). Plain Python, no aws_cdk import, so the rules are tested without
synthesizing anything and the operator tools need no CDK. Values given with ``-c`` arrive as
strings, so booleans, integers and lists also accept their string forms.

Adding a key: a field of ``ckpt_stack.settings.PipelineSettings`` (or of the dataclass it belongs
to) and the line here of :func:`parse_context` that reads and checks it (its default beside it,
in ``cdk.json`` too when operators should see it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path

from ckpt_contract.message import MODES
from ckpt_stack.context_keys import check_keys
from ckpt_stack.exceptions import ContextError
from ckpt_stack.settings import (
    CheckpointStoreSettings,
    ExistingDatabase,
    ExistingNetwork,
    NewDatabase,
    PipelineSettings,
    ScheduledPrune,
)
from lambda_writer import PolicyError, RetentionPolicy, SettingsError, parse_job_prefixes
from lambda_writer.shared.constants import DB_PORT, WRITER_DB_USER

# Defaults of context keys that the stack also uses on its own (infra.constants re-exports them).
DEFAULT_DB_NAME = "ckpt"
DEFAULT_MASTER_USER = "postgres"
DEFAULT_PROXY_MAX_CONNECTIONS_PERCENT = 20
# Days a created bucket keeps an object version after it stops being current (overwritten, or
# deleted by prune --delete-objects): a month to recover it, then S3 stops billing it.
DEFAULT_NONCURRENT_DAYS = 30

ContextGetter = Callable[[str], object]

# Keys that configure the new instance only: beside createDatabase=false nothing reads them.
_NEW_DATABASE_KEYS = (
    "dbInstanceClass",
    "dbAllocatedStorageGiB",
    "dbMultiAz",
    "dbBackupRetentionDays",
)

_PREFIX = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_PREFIX_MAX = 20
_VPC_ID = re.compile(r"^vpc-[0-9a-f]{8,17}$")
_SUBNET_ID = re.compile(r"^subnet-[0-9a-f]{8,17}$")
_SG_ID = re.compile(r"^sg-[0-9a-f]{8,17}$")
_AZ = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")
# RDS instance identifiers: 1-63 letters, digits, hyphens; start with a letter; no "--", no
# trailing hyphen (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/CHAP_Limits.html).
_DB_INSTANCE_ID = re.compile(r"^[a-zA-Z](?!.*--)[a-zA-Z0-9-]{0,62}(?<!-)$")
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)([a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?\.)+[a-zA-Z]{2,63}$"
)
_SECRET_ARN = re.compile(
    r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:[A-Za-z0-9/_+=.@!-]+$"
)
_KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[0-9a-f-]{36}$")
_PG_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# An IAM role's or user's unique id (https://docs.aws.amazon.com/IAM/latest/UserGuide/
# reference_identifiers.html#identifiers-unique-ids): what SQS's SenderId starts with.
_PRINCIPAL_ID = re.compile(r"^(AROA|AIDA)[A-Z0-9]{12,124}$")
_EMAIL = re.compile(r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$")
_INSTANCE_CLASS = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
# S3 bucket names (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# A key prefix used in IAM resources and conditions: printable, and no IAM wildcard in it.
_KEY_PREFIX = re.compile(r"^[\x21-\x29\x2b-\x3e\x40-\x7e]+$")


class _Context:
    """Typed reads of raw context values; every failure names the key and the rule."""

    def __init__(self, get: ContextGetter) -> None:
        self._get = get

    def raw(self, key: str) -> object:
        value = self._get(key)
        if isinstance(value, str) and value.strip() == "":
            return None
        return value

    def has(self, key: str) -> bool:
        return self.raw(key) is not None

    def text(self, key: str, *, default: str | None = None) -> str | None:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ContextError(key, f"must be a string, got {value!r}")
        return value.strip()

    def text_or(self, key: str, default: str) -> str:
        value = self.text(key)
        return default if value is None else value

    def required_text(self, key: str, *, because: str) -> str:
        value = self.text(key)
        if value is None:
            raise ContextError(key, f"is required {because}")
        return value

    def matching(self, key: str, pattern: re.Pattern[str], rule: str, *, because: str) -> str:
        value = self.required_text(key, because=because)
        if not pattern.fullmatch(value):
            raise ContextError(key, f"must be {rule}, got {value!r}")
        return value

    def flag(self, key: str, *, default: bool) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ContextError(key, f"must be true or false, got {value!r}")

    def integer(self, key: str, *, default: int, low: int, high: int) -> int:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool):
            raise ContextError(key, f"must be an integer, got {value!r}")
        if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
            value = int(value)
        if not isinstance(value, int):
            raise ContextError(key, f"must be an integer, got {value!r}")
        if not low <= value <= high:
            raise ContextError(key, f"must be between {low} and {high}, got {value}")
        return value

    def text_list(self, key: str, *, because: str) -> tuple[str, ...]:
        value = self.raw(key)
        if value is None:
            raise ContextError(key, f"is required {because}")
        if isinstance(value, str):
            items = [item.strip() for item in value.split(",") if item.strip()]
        elif isinstance(value, list) and all(isinstance(item, str) for item in value):
            items = [item.strip() for item in value]
        else:
            raise ContextError(
                key, f"must be a list of strings or a comma-separated string, got {value!r}"
            )
        return tuple(items)


def _network(ctx: _Context, *, create_database: bool) -> ExistingNetwork | None:
    if not ctx.has("vpcId"):
        if not create_database:
            raise ContextError(
                "vpcId",
                "is required when createDatabase is false "
                "(an existing database lives in an existing VPC)",
            )
        for key in ("privateSubnetIds", "availabilityZones"):
            if ctx.has(key):
                raise ContextError(key, "is only used together with vpcId")
        return None
    because = "when vpcId is set"
    vpc_id = ctx.matching("vpcId", _VPC_ID, "a VPC id like vpc-0123abcd", because=because)
    azs = ctx.text_list("availabilityZones", because=because)
    subnets = ctx.text_list("privateSubnetIds", because=because)
    for az in azs:
        if not _AZ.fullmatch(az):
            raise ContextError(
                "availabilityZones", f"must be availability zone names like eu-west-1a, got {az!r}"
            )
    for subnet in subnets:
        if not _SUBNET_ID.fullmatch(subnet):
            raise ContextError(
                "privateSubnetIds", f"must be subnet ids like subnet-0123abcd, got {subnet!r}"
            )
    # RDS Proxy needs subnets in at least two AZs
    # (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-proxy-network-prereqs.html).
    if len(set(azs)) < 2 or len(set(azs)) != len(azs):
        raise ContextError(
            "availabilityZones", f"must name at least two distinct zones, got {list(azs)}"
        )
    if len(subnets) % len(azs) != 0 or len(set(subnets)) != len(subnets):
        raise ContextError(
            "privateSubnetIds",
            f"must list distinct subnets, a multiple of the {len(azs)} availabilityZones "
            f"in the same order, got {list(subnets)}",
        )
    return ExistingNetwork(vpc_id=vpc_id, availability_zones=azs, private_subnet_ids=subnets)


def _existing_database(ctx: _Context) -> ExistingDatabase:
    because = "when createDatabase is false"
    for key in _NEW_DATABASE_KEYS:
        if ctx.has(key):
            raise ContextError(
                key,
                "configures the instance the stack creates and does not apply with createDatabase"
                " false (the existing instance is changed in RDS, not by this stack); remove it",
            )
    # cdk.json carries dbDeletionProtection=true for the greenfield default; false would read as
    # "the existing instance may be deleted", which the stack never does (it imports the instance).
    if not ctx.flag("dbDeletionProtection", default=True):
        raise ContextError(
            "dbDeletionProtection",
            "false does not apply with createDatabase false: the stack never deletes or changes"
            " an existing instance's deletion protection; remove it",
        )
    kms = ctx.text("dbSecretKmsKeyArn")
    if kms is not None and not _KMS_KEY_ARN.fullmatch(kms):
        raise ContextError(
            "dbSecretKmsKeyArn", f"must be a KMS key ARN (arn:aws:kms:…:key/<uuid>), got {kms!r}"
        )
    return ExistingDatabase(
        instance_id=ctx.matching(
            "dbInstanceId",
            _DB_INSTANCE_ID,
            "an RDS instance identifier (letters, digits, hyphens)",
            because=because,
        ),
        endpoint=ctx.matching(
            "dbEndpoint", _HOSTNAME, "the instance's DNS endpoint", because=because
        ),
        port=ctx.integer("dbPort", default=DB_PORT, low=1150, high=65535),
        security_group_id=ctx.matching(
            "dbSecurityGroupId", _SG_ID, "a security group id like sg-0123abcd", because=because
        ),
        secret_arn=ctx.matching(
            "dbSecretArn",
            _SECRET_ARN,
            "the complete ARN of a Secrets Manager secret holding username and password",
            because=because + " (RDS Proxy logs in to PostgreSQL with it)",
        ),
        secret_kms_key_arn=kms,
    )


def _new_database(ctx: _Context) -> NewDatabase:
    for key in (
        "dbInstanceId",
        "dbEndpoint",
        "dbSecurityGroupId",
        "dbSecretArn",
        "dbSecretKmsKeyArn",
    ):
        if ctx.has(key):
            raise ContextError(
                key, "describes an existing database and conflicts with createDatabase true"
            )
    instance_class = ctx.text_or("dbInstanceClass", "t4g.micro")
    if not _INSTANCE_CLASS.fullmatch(instance_class):
        raise ContextError(
            "dbInstanceClass", f"must be an instance class like t4g.micro, got {instance_class!r}"
        )
    return NewDatabase(
        instance_class=instance_class,
        # gp3 storage starts at 20 GiB for RDS
        # (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/CHAP_Storage.html).
        allocated_storage_gib=ctx.integer("dbAllocatedStorageGiB", default=20, low=20, high=65536),
        multi_az=ctx.flag("dbMultiAz", default=False),
        deletion_protection=ctx.flag("dbDeletionProtection", default=True),
        # RDS keeps automated backups 1-35 days.
        backup_retention_days=ctx.integer("dbBackupRetentionDays", default=7, low=1, high=35),
    )


def _checkpoint_store(ctx: _Context) -> CheckpointStoreSettings | None:
    create = ctx.flag("createCheckpointBucket", default=False)
    bucket = ctx.text("checkpointBucket")
    prefix = ctx.text("checkpointPrefix") or ""
    if create and bucket is not None:
        raise ContextError(
            "checkpointBucket", "names an existing bucket and conflicts with createCheckpointBucket"
        )
    if not create and bucket is None:
        if prefix:
            raise ContextError(
                "checkpointPrefix", "is only used with checkpointBucket or createCheckpointBucket"
            )
        return None
    if bucket is not None and (not _BUCKET.fullmatch(bucket) or ".." in bucket):
        raise ContextError(
            "checkpointBucket",
            f"must be an S3 bucket name (3-63 lowercase letters, digits, dots, hyphens), "
            f"got {bucket!r}",
        )
    if prefix.startswith("/") or len(prefix) > 512 or not _KEY_PREFIX.fullmatch(prefix or "x"):
        raise ContextError(
            "checkpointPrefix",
            f"must be a key prefix like team/checkpoints/ (no leading '/', printable, at most "
            f"512 characters, no '*' or '?'), got {prefix!r}",
        )
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    noncurrent_days: int | None = None
    if create:
        noncurrent_days = ctx.integer(
            "checkpointNoncurrentDays", default=DEFAULT_NONCURRENT_DAYS, low=0, high=36500
        )
    elif ctx.has("checkpointNoncurrentDays"):
        raise ContextError(
            "checkpointNoncurrentDays",
            "is only used with createCheckpointBucket=true (an existing bucket's lifecycle"
            " rules are its owner's)",
        )
    # The counts trainer_client.storage.uri.SPREAD_PREFIXES allows (a power of 16: 1-4 hex digits).
    spread = ctx.integer("checkpointSpreadPrefixes", default=0, low=0, high=65_536)
    if spread not in (0, 16, 256, 4_096, 65_536):
        raise ContextError(
            "checkpointSpreadPrefixes",
            f"must be 0 or 16, 256, 4096 or 65536 (the trainers' UploadSettings.spread_prefixes),"
            f" got {spread}",
        )
    return CheckpointStoreSettings(
        bucket=bucket,
        prefix=prefix,
        noncurrent_days=noncurrent_days or None,
        spread_prefixes=spread,
    )


# The policy's context keys, by the option name a PolicyError carries (the CLI's).
_PRUNE_KEYS = {
    "--keep-last": "pruneKeepLast",
    "--keep-best": "pruneKeepBest",
    "--metric": "pruneMetric",
    "--mode": "pruneMode",
    "--keep-every": "pruneKeepEvery",
    "--superseded": "pruneSuperseded",
}


def _scheduled_prune(ctx: _Context) -> ScheduledPrune | None:
    """``scheduledPrune`` (default false) and its policy: the options of ``ckpt-pipeline prune
    --all`` as context keys, under the same rules (``lambda_writer.prune.policy``)."""
    enabled = ctx.flag("scheduledPrune", default=False)
    given = [key for key in ("pruneEveryHours", *_PRUNE_KEYS.values()) if ctx.has(key)]
    if not enabled:
        if given:
            raise ContextError(given[0], "is only used with scheduledPrune=true")
        return None
    big = 2**31 - 1
    keep_last = ctx.integer("pruneKeepLast", default=0, low=1, high=big) or None
    mode = ctx.text_or("pruneMode", "min")
    if mode not in MODES:
        raise ContextError("pruneMode", f"must be min or max, got {mode!r}")
    try:
        policy = RetentionPolicy(
            keep_last=keep_last,
            keep_best=ctx.integer("pruneKeepBest", default=0, low=0, high=big),
            metric=ctx.text("pruneMetric"),
            mode=mode,  # type: ignore[arg-type]  # checked against MODES above
            keep_every=ctx.integer("pruneKeepEvery", default=0, low=1, high=big) or None,
            superseded=ctx.flag("pruneSuperseded", default=False),
        )
    except PolicyError as exc:
        rule = exc.rule
        for option, key in _PRUNE_KEYS.items():
            rule = rule.replace(option, key)
        raise ContextError(_PRUNE_KEYS.get(exc.name, exc.name), rule) from None
    # EventBridge rate expressions in whole hours; at most a week between runs.
    every = ctx.integer("pruneEveryHours", default=24, low=1, high=168)
    return ScheduledPrune(every_hours=every, policy=policy)


def parse_context(get: ContextGetter, keys: Iterable[str] | None = None) -> PipelineSettings:
    """Validate the context once; raises :class:`ContextError` naming the key and the rule.

    ``keys``: every key the context holds (cdk.json, ``-c``, the CDK's own); an app key that is
    not known is refused first (:func:`ckpt_stack.context_keys.check_keys`)."""
    if keys is not None:
        check_keys(keys)
    ctx = _Context(get)
    prefix = ctx.text_or("prefix", "ckpt")
    if len(prefix) > _PREFIX_MAX or not _PREFIX.fullmatch(prefix):
        raise ContextError(
            "prefix",
            f"must be 1-{_PREFIX_MAX} lowercase letters, digits and single hyphens, "
            f"starting with a letter, got {prefix!r}",
        )
    create_database = ctx.flag("createDatabase", default=True)
    network = _network(ctx, create_database=create_database)
    database = _new_database(ctx) if create_database else _existing_database(ctx)

    db_name = ctx.text_or("dbName", DEFAULT_DB_NAME)
    if not _PG_IDENT.fullmatch(db_name):
        raise ContextError(
            "dbName",
            f"must be a lowercase PostgreSQL identifier ([a-z_][a-z0-9_]*), got {db_name!r}",
        )
    master_user = ctx.text_or("dbMasterUsername", DEFAULT_MASTER_USER)
    if not _PG_IDENT.fullmatch(master_user) or master_user == WRITER_DB_USER:
        raise ContextError(
            "dbMasterUsername",
            f"must be a lowercase PostgreSQL identifier other than "
            f"{WRITER_DB_USER!r}, got {master_user!r}",
        )

    concurrency_raw = ctx.raw("writerReservedConcurrency")
    concurrency = ctx.integer("writerReservedConcurrency", default=2, low=-(2**31), high=2**31)
    if concurrency not in (1, 2):
        # 1-2 writers bound the database connections whatever the number of ranks (DESIGN.md).
        raise ContextError("writerReservedConcurrency", f"must be 1 or 2, got {concurrency_raw!r}")

    email = ctx.text("alarmEmail")
    if email is not None and not _EMAIL.fullmatch(email):
        raise ContextError(
            "alarmEmail", f"must be an e-mail address like ops@example.com, got {email!r}"
        )

    replay_principal = ctx.text("replayPrincipalId")
    if replay_principal is not None and not _PRINCIPAL_ID.fullmatch(replay_principal):
        raise ContextError(
            "replayPrincipalId",
            "must be the unique id of the role (AROA…) or user (AIDA…) that runs replay-dlq"
            f" (aws iam get-role --role-name NAME --query Role.RoleId), got {replay_principal!r}",
        )

    prefixes_raw = ctx.raw("jobPrefixesByPrincipal")
    try:
        job_prefixes = (
            None
            if prefixes_raw is None
            else parse_job_prefixes(prefixes_raw, name="jobPrefixesByPrincipal")
        )
    except SettingsError as exc:
        raise ContextError(exc.name, exc.rule) from None

    wheelhouse_text = ctx.text("wheelhouse")
    wheelhouse = Path(wheelhouse_text).expanduser().resolve() if wheelhouse_text else None
    if wheelhouse is not None and not wheelhouse.is_dir():
        raise ContextError(
            "wheelhouse", f"must be an existing directory of wheels, got {wheelhouse_text!r}"
        )

    return PipelineSettings(
        prefix=prefix,
        network=network,
        database=database,
        db_name=db_name,
        db_master_user=master_user,
        writer_reserved_concurrency=concurrency,
        alarm_email=email,
        replay_principal_id=replay_principal,
        job_prefixes=job_prefixes,
        proxy_max_connections_percent=ctx.integer(
            "proxyMaxConnectionsPercent",
            default=DEFAULT_PROXY_MAX_CONNECTIONS_PERCENT,
            low=1,
            high=100,
        ),
        high_throughput_fifo=ctx.flag("highThroughputFifo", default=True),
        # A new VPC has no route to AWS APIs without them; an existing one usually has NAT or own
        # endpoints, and a second private-DNS endpoint for the same service fails to create.
        create_vpc_endpoints=ctx.flag("createVpcEndpoints", default=network is None),
        wheelhouse=wheelhouse,
        checkpoint_store=_checkpoint_store(ctx),
        scheduled_prune=_scheduled_prune(ctx),
    )

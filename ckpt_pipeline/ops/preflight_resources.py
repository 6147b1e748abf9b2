"""Preflight's questions about what the context names: does each resource exist and fit?

Pure decisions over :class:`ReferencedFacts` (gathered by ``preflight_lookup``): the existing VPC,
its subnets and zones, the database's security group, the instance, its master secret, and the
CDK bootstrap of the account and Region. One :class:`Finding` per question, its subject the
context key an operator would change, its detail what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ckpt_pipeline.ops.preflight import Finding, Unavailable
from ckpt_stack.settings import ExistingDatabase, ExistingNetwork, PipelineSettings

# The oldest PostgreSQL major the migrations and the writer are tested on (15 locally, 16 for the
# greenfield instance, infra.constants.POSTGRES_MAJOR_VERSION).
MIN_POSTGRES_MAJOR = 15
# The synthesized template's CheckBootstrapVersion rule refuses a bootstrap older than this (the
# default synthesizer of aws-cdk-lib v2; https://docs.aws.amazon.com/cdk/v2/guide/bootstrapping-env.html).
MIN_BOOTSTRAP_VERSION = 6
DEFAULT_BOOTSTRAP_QUALIFIER = "hnb659fds"
BOOTSTRAP_QUALIFIER_KEY = "@aws-cdk/core:bootstrapQualifier"
# The keys naming principals (checked against IAM by preflight_principals).
PREFIXES_KEY = "jobPrefixesByPrincipal"
REPLAY_KEY = "replayPrincipalId"


@dataclass(frozen=True)
class Missing:
    """The account answered: no such resource (``code`` is the API's error code)."""

    code: str


@dataclass(frozen=True)
class Subnet:
    vpc_id: str
    availability_zone: str


@dataclass(frozen=True)
class SecurityGroup:
    vpc_id: str


@dataclass(frozen=True)
class DbInstance:
    engine: str
    engine_version: str
    address: str | None
    port: int | None
    vpc_id: str | None
    security_group_ids: tuple[str, ...]
    status: str


@dataclass(frozen=True)
class Secret:
    """A secret's shape, never its values: which JSON keys hold strings, and its username."""

    string_keys: frozenset[str] | None  # None: the value is not a JSON object
    username: str | None
    kms_key_id: str | None


@dataclass(frozen=True)
class ReferencedFacts:
    """What the account said about each resource the context names (None: not named)."""

    bootstrap_version: int | Missing | Unavailable
    vpc: bool | Missing | Unavailable | None = None
    subnets: Mapping[str, Subnet | Missing | Unavailable] | None = None
    security_group: SecurityGroup | Missing | Unavailable | None = None
    db_instance: DbInstance | Missing | Unavailable | None = None
    secret: Secret | Missing | Unavailable | None = None


def _fail(key: str, detail: str) -> Finding:
    return Finding("fail", key, detail)


def _answered(key: str, answer: object, what: str) -> Finding | None:
    """The finding for an answer that is not the resource itself (missing, unanswered)."""
    if isinstance(answer, Unavailable):
        return Finding("unchecked", key, answer.reason)
    if isinstance(answer, Missing):
        return _fail(
            key,
            f"{what} does not exist in this account and Region ({answer.code}): check the id,"
            " and the credentials' account and Region",
        )
    return None


def bootstrap(facts: ReferencedFacts, qualifier: str) -> list[Finding]:
    """Is the account and Region bootstrapped for CDK (the version the template checks)?"""
    key = f"CDK bootstrap (/cdk-bootstrap/{qualifier}/version)"
    answer = facts.bootstrap_version
    if isinstance(answer, Missing):
        return [
            _fail(key, "not bootstrapped: run `npx cdk bootstrap` once for this account and Region")
        ]
    if isinstance(answer, Unavailable):
        return [Finding("unchecked", key, answer.reason)]
    if answer < MIN_BOOTSTRAP_VERSION:
        return [
            _fail(
                key,
                f"version {answer} < {MIN_BOOTSTRAP_VERSION}: run `npx cdk bootstrap`"
                " again to upgrade it",
            )
        ]
    return [Finding("ok", key, f"version {answer} >= {MIN_BOOTSTRAP_VERSION}")]


def network(net: ExistingNetwork, facts: ReferencedFacts) -> list[Finding]:
    """The VPC exists; each subnet exists, lies in it and in the zone the context pairs it with."""
    found = _answered("vpcId", facts.vpc, net.vpc_id)
    findings = [found or Finding("ok", "vpcId", f"{net.vpc_id} exists")]
    subnets = facts.subnets or {}
    zones_seen: set[str] = set()
    bad = False
    for index, subnet_id in enumerate(net.private_subnet_ids):
        answer = subnets.get(subnet_id, Unavailable("not asked"))
        problem = _answered("privateSubnetIds", answer, subnet_id)
        if problem is not None:
            findings.append(problem)
            bad = True
            continue
        assert isinstance(answer, Subnet)
        zones_seen.add(answer.availability_zone)
        # infra.network imports the subnets by position: subnet i lives in zone i mod n.
        expected_zone = net.availability_zones[index % len(net.availability_zones)]
        if answer.vpc_id != net.vpc_id:
            findings.append(
                _fail(
                    "privateSubnetIds",
                    f"{subnet_id} is in {answer.vpc_id}, not"
                    f" in vpcId {net.vpc_id}: list subnets of that VPC",
                )
            )
            bad = True
        elif answer.availability_zone != expected_zone:
            findings.append(
                _fail(
                    "availabilityZones",
                    f"{subnet_id} is in"
                    f" {answer.availability_zone}, but availabilityZones pairs it"
                    f" with {expected_zone}: list the zones in the subnets' order",
                )
            )
            bad = True
    if not bad:
        # RDS Proxy needs subnets in at least two zones
        # (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-proxy-network-prereqs.html).
        if len(zones_seen) < 2:
            findings.append(
                _fail(
                    "privateSubnetIds",
                    f"all in {sorted(zones_seen)}: RDS Proxy"
                    " needs subnets in at least two availability zones",
                )
            )
        else:
            findings.append(
                Finding(
                    "ok",
                    "privateSubnetIds",
                    f"{len(net.private_subnet_ids)}"
                    f" subnets of {net.vpc_id} in {', '.join(sorted(zones_seen))}",
                )
            )
    return findings


def _postgres_major(version: str) -> int | None:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def database(db: ExistingDatabase, net: ExistingNetwork, facts: ReferencedFacts) -> list[Finding]:
    """The instance is PostgreSQL of a supported major, in the VPC, behind the named group."""
    findings: list[Finding] = []
    group = facts.security_group
    problem = _answered("dbSecurityGroupId", group, db.security_group_id)
    if problem is not None:
        findings.append(problem)
    elif isinstance(group, SecurityGroup) and group.vpc_id != net.vpc_id:
        findings.append(
            _fail(
                "dbSecurityGroupId",
                f"{db.security_group_id} belongs to {group.vpc_id}, not vpcId {net.vpc_id}",
            )
        )
    instance = facts.db_instance
    problem = _answered("dbInstanceId", instance, db.instance_id)
    if problem is not None:
        return [*findings, problem]
    assert isinstance(instance, DbInstance)
    major = _postgres_major(instance.engine_version)
    if instance.engine != "postgres":
        findings.append(
            _fail(
                "dbInstanceId",
                f"{db.instance_id} runs {instance.engine}: the"
                " stack needs RDS for PostgreSQL (engine postgres)",
            )
        )
    elif major is None or major < MIN_POSTGRES_MAJOR:
        findings.append(
            _fail(
                "dbInstanceId",
                f"{db.instance_id} runs PostgreSQL"
                f" {instance.engine_version}: the migrations need"
                f" {MIN_POSTGRES_MAJOR} or later; upgrade the instance",
            )
        )
    if instance.vpc_id is not None and instance.vpc_id != net.vpc_id:
        findings.append(
            _fail(
                "vpcId",
                f"{db.instance_id} is in {instance.vpc_id}, not in"
                f" {net.vpc_id}: the proxy must live in the instance's VPC",
            )
        )
    if instance.address is not None and instance.address != db.endpoint:
        findings.append(
            _fail(
                "dbEndpoint",
                f"{db.endpoint} is not {db.instance_id}'s endpoint ({instance.address})",
            )
        )
    if instance.port is not None and instance.port != db.port:
        findings.append(
            _fail("dbPort", f"{db.port}, but {db.instance_id} listens on {instance.port}")
        )
    if db.security_group_id not in instance.security_group_ids and isinstance(group, SecurityGroup):
        findings.append(
            _fail(
                "dbSecurityGroupId",
                f"{db.security_group_id} is not attached to"
                f" {db.instance_id} (it has {', '.join(instance.security_group_ids)}):"
                " the stack's ingress rules would open nothing",
            )
        )
    if not findings:
        # IAM database authentication at the instance is not needed: clients use IAM towards the
        # proxy, the proxy logs in with the ckpt_writer secret (infra/database.py).
        findings.append(
            Finding(
                "ok",
                "dbInstanceId",
                f"{db.instance_id}: PostgreSQL"
                f" {instance.engine_version} ({instance.status}) in {net.vpc_id}"
                f" behind {db.security_group_id}",
            )
        )
    return findings


def master_secret(db: ExistingDatabase, master_user: str, facts: ReferencedFacts) -> list[Finding]:
    """The secret holds ``username``/``password`` for the master user, and its key is named."""
    secret = facts.secret
    problem = _answered("dbSecretArn", secret, db.secret_arn)
    if problem is not None:
        return [problem]
    assert isinstance(secret, Secret)
    if secret.string_keys is None or not {"username", "password"} <= secret.string_keys:
        return [
            _fail(
                "dbSecretArn",
                "must be a JSON object with string 'username' and"
                " 'password' (RDS's master-secret shape); it has"
                f" {sorted(secret.string_keys or [])}",
            )
        ]
    findings: list[Finding] = []
    if secret.username != master_user:
        findings.append(
            _fail(
                "dbMasterUsername",
                f"is {master_user!r} but the secret's username"
                f" is {secret.username!r}: set -c dbMasterUsername to it",
            )
        )
    customer_key = secret.kms_key_id is not None and "alias/aws/secretsmanager" not in (
        secret.kms_key_id
    )
    if customer_key and db.secret_kms_key_arn is None:
        findings.append(
            _fail(
                "dbSecretKmsKeyArn",
                f"is not set, but the secret is encrypted with"
                f" {secret.kms_key_id}: set it to that key's ARN (the migration"
                " must decrypt the secret)",
            )
        )
    return findings or [
        Finding("ok", "dbSecretArn", f"JSON with username and password ({secret.username})")
    ]


def evaluate_referenced(
    settings: PipelineSettings, facts: ReferencedFacts, *, qualifier: str
) -> list[Finding]:
    """Every finding about the named resources and the bootstrap, in the context's order."""
    findings = bootstrap(facts, qualifier)
    if settings.network is not None:
        findings += network(settings.network, facts)
        if isinstance(settings.database, ExistingDatabase):
            findings += database(settings.database, settings.network, facts)
            findings += master_secret(settings.database, settings.db_master_user, facts)
    return findings

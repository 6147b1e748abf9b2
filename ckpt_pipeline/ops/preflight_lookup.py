"""The AWS side of preflight's resource questions: read-only Describe*/Get* calls that fill
:class:`ReferencedFacts`.

Each resource is asked about on its own; "not found" (the API's own error code) becomes
:class:`Missing`, any other error :class:`Unavailable`. The master secret's value is read
(``secretsmanager:GetSecretValue``) only to check its shape: which keys hold strings and the
username; the password never leaves this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

from ckpt_pipeline.ops.preflight import Unavailable
from ckpt_pipeline.ops.preflight_aws import Clients, reason
from ckpt_pipeline.ops.preflight_resources import (
    DbInstance,
    Missing,
    ReferencedFacts,
    Secret,
    SecurityGroup,
    Subnet,
)
from ckpt_stack.settings import ExistingDatabase, PipelineSettings

T = TypeVar("T")

# The error codes each API answers for "no such resource".
_NOT_FOUND = {
    "InvalidVpcID.NotFound",
    "InvalidSubnetID.NotFound",
    "InvalidGroup.NotFound",
    "InvalidGroupId.Malformed",
    "DBInstanceNotFound",
    "DBInstanceNotFoundFault",
    "ResourceNotFoundException",
    "ParameterNotFound",
}


def _find(question: Callable[[], T]) -> T | Missing | Unavailable:
    """``question``'s answer; Missing when the API says not found, Unavailable otherwise."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return question()
    except _NotFound as exc:
        return Missing(exc.code)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in _NOT_FOUND:
            return Missing(code)
        return Unavailable(reason(exc))
    except BotoCoreError as exc:
        return Unavailable(reason(exc))


def _bootstrap_version(clients: Clients, qualifier: str) -> int:
    name = f"/cdk-bootstrap/{qualifier}/version"
    return int(clients("ssm").get_parameter(Name=name)["Parameter"]["Value"])


def _vpc(clients: Clients, vpc_id: str) -> bool:
    vpcs = clients("ec2").describe_vpcs(VpcIds=[vpc_id])["Vpcs"]
    if not vpcs:
        raise _not_found("InvalidVpcID.NotFound")
    return True


def _subnet(clients: Clients, subnet_id: str) -> Subnet:
    subnets = clients("ec2").describe_subnets(SubnetIds=[subnet_id])["Subnets"]
    if not subnets:
        raise _not_found("InvalidSubnetID.NotFound")
    return Subnet(vpc_id=subnets[0]["VpcId"], availability_zone=subnets[0]["AvailabilityZone"])


def _security_group(clients: Clients, group_id: str) -> SecurityGroup:
    groups = clients("ec2").describe_security_groups(GroupIds=[group_id])["SecurityGroups"]
    if not groups:
        raise _not_found("InvalidGroup.NotFound")
    return SecurityGroup(vpc_id=groups[0]["VpcId"])


def _db_instance(clients: Clients, instance_id: str) -> DbInstance:
    found = clients("rds").describe_db_instances(DBInstanceIdentifier=instance_id)["DBInstances"]
    if not found:
        raise _not_found("DBInstanceNotFound")
    db: dict[str, Any] = found[0]
    endpoint = db.get("Endpoint") or {}
    return DbInstance(
        engine=str(db.get("Engine", "")),
        engine_version=str(db.get("EngineVersion", "")),
        address=endpoint.get("Address"),
        port=int(endpoint["Port"]) if "Port" in endpoint else None,
        vpc_id=(db.get("DBSubnetGroup") or {}).get("VpcId"),
        security_group_ids=tuple(g["VpcSecurityGroupId"] for g in db.get("VpcSecurityGroups", [])),
        status=str(db.get("DBInstanceStatus", "unknown")),
    )


def _secret(clients: Clients, secret_arn: str) -> Secret:
    client = clients("secretsmanager")
    described = client.describe_secret(SecretId=secret_arn)
    value = client.get_secret_value(SecretId=secret_arn).get("SecretString")
    try:
        parsed = json.loads(value) if value is not None else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return Secret(string_keys=None, username=None, kms_key_id=described.get("KmsKeyId"))
    keys = frozenset(k for k, v in parsed.items() if isinstance(v, str) and v)
    username = parsed.get("username") if isinstance(parsed.get("username"), str) else None
    return Secret(string_keys=keys, username=username, kms_key_id=described.get("KmsKeyId"))


class _NotFound(Exception):
    """An empty answer where AWS would have said not found (some emulators answer so)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def _not_found(code: str) -> _NotFound:
    return _NotFound(code)


def gather_referenced(
    settings: PipelineSettings, clients: Clients, *, qualifier: str
) -> ReferencedFacts:
    """Ask about the bootstrap and every resource the context names; read-only."""
    facts = ReferencedFacts(bootstrap_version=_find(lambda: _bootstrap_version(clients, qualifier)))
    net = settings.network
    if net is None:
        return facts
    vpc_id = net.vpc_id
    facts = replace(
        facts,
        vpc=_find(lambda: _vpc(clients, vpc_id)),
        subnets={s: _find(partial(_subnet, clients, s)) for s in net.private_subnet_ids},
    )
    db = settings.database
    if not isinstance(db, ExistingDatabase):
        return facts
    return replace(
        facts,
        security_group=_find(partial(_security_group, clients, db.security_group_id)),
        db_instance=_find(partial(_db_instance, clients, db.instance_id)),
        secret=_find(partial(_secret, clients, db.secret_arn)),
    )

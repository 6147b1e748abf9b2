"""RDS Proxy (IAM auth + TLS, pool limits), security groups, per-user connect grants, new DB.

The deploy order and the migration's direct connection are in test_ordering.py.
"""

from __future__ import annotations

import json
from typing import Any

from infra import constants
from tests.infra.conftest import Synth


def test_proxy_requires_iam_and_tls(any_synth: Synth) -> None:
    props = any_synth.only("AWS::RDS::DBProxy")["Properties"]
    assert props["RequireTLS"] is True
    assert props["EngineFamily"] == "POSTGRESQL"
    # ckpt_writer's secret only: the master user is not reachable through the proxy.
    (auth,) = props["Auth"]
    writer_secret = next(
        lid
        for lid, r in any_synth.resources("AWS::SecretsManager::Secret").items()
        if constants.WRITER_DB_USER in json.dumps(r["Properties"])
    )
    assert auth == {
        "AuthScheme": "SECRETS",
        "IAMAuth": "REQUIRED",
        "SecretArn": {"Ref": writer_secret},
    }


def test_proxy_pool_limits(any_synth: Synth) -> None:
    pool = any_synth.only("AWS::RDS::DBProxyTargetGroup")["Properties"][
        "ConnectionPoolConfigurationInfo"
    ]
    assert pool["MaxConnectionsPercent"] == constants.DEFAULT_PROXY_MAX_CONNECTIONS_PERCENT < 100
    assert pool["MaxIdleConnectionsPercent"] <= pool["MaxConnectionsPercent"]
    assert (
        pool["ConnectionBorrowTimeout"]
        == constants.PROXY_BORROW_TIMEOUT_S
        < constants.WRITER_TIMEOUT_S
    )


def _ingress_into(synth: Synth, group: object) -> list[dict[str, Any]]:
    rules = [r["Properties"] for r in synth.resources("AWS::EC2::SecurityGroupIngress").values()]
    return [r for r in rules if r["GroupId"] == group]


def test_only_pipeline_functions_reach_the_proxy(any_synth: Synth) -> None:
    proxy_group = any_synth.only("AWS::RDS::DBProxy")["Properties"]["VpcSecurityGroupIds"][0]
    rules = _ingress_into(any_synth, proxy_group)
    function_groups = [
        fn["Properties"]["VpcConfig"]["SecurityGroupIds"][0]
        for fn in any_synth.resources("AWS::Lambda::Function").values()
        # not the migration: it runs before the proxy exists and goes to the instance
        if fn["Properties"].get("Handler") in (constants.WRITER_HANDLER, constants.BREAKER_HANDLER)
    ]
    assert sorted(json.dumps(r["SourceSecurityGroupId"]) for r in rules) == sorted(
        json.dumps(g) for g in function_groups
    )
    assert all(r["FromPort"] == r["ToPort"] == 5432 for r in rules)
    proxy_sg_id = proxy_group["Fn::GetAtt"][0]
    assert "SecurityGroupIngress" not in any_synth.json["Resources"][proxy_sg_id]["Properties"]


def _migration_group(synth: Synth) -> Any:
    (group,) = next(
        fn["Properties"]["VpcConfig"]["SecurityGroupIds"]
        for fn in synth.resources("AWS::Lambda::Function").values()
        if fn["Properties"].get("Handler") == constants.MIGRATION_HANDLER
    )
    return group


def test_only_the_proxy_and_the_migration_reach_a_new_database(greenfield: Synth) -> None:
    instance = greenfield.only("AWS::RDS::DBInstance")["Properties"]
    db_group = instance["VPCSecurityGroups"][0]
    proxy_group = greenfield.only("AWS::RDS::DBProxy")["Properties"]["VpcSecurityGroupIds"][0]
    rules = _ingress_into(greenfield, db_group)
    assert sorted(json.dumps(r["SourceSecurityGroupId"]) for r in rules) == sorted(
        json.dumps(g) for g in (proxy_group, _migration_group(greenfield))
    )
    # the instance port: a literal for the migration's rule, the instance's attribute for CDK's
    port = {"Fn::GetAtt": [instance_id(greenfield), "Endpoint.Port"]}
    assert all(r["FromPort"] == r["ToPort"] and r["FromPort"] in (5432, port) for r in rules)
    assert (
        "SecurityGroupIngress"
        not in greenfield.json["Resources"][db_group["Fn::GetAtt"][0]]["Properties"]
    )


def instance_id(synth: Synth) -> str:
    (lid,) = synth.resources("AWS::RDS::DBInstance")
    return lid


def test_existing_database_gets_a_rule_from_the_proxy_and_the_migration(existing: Synth) -> None:
    rules = _ingress_into(existing, "sg-0123456789abcdef0")
    proxy_group = existing.only("AWS::RDS::DBProxy")["Properties"]["VpcSecurityGroupIds"][0]
    assert sorted(json.dumps(r["SourceSecurityGroupId"]) for r in rules) == sorted(
        json.dumps(g) for g in (proxy_group, _migration_group(existing))
    )
    assert all(r["FromPort"] == r["ToPort"] == 5432 for r in rules)
    assert not existing.resources("AWS::RDS::DBInstance")
    target = existing.only("AWS::RDS::DBProxyTargetGroup")["Properties"]
    assert target["DBInstanceIdentifiers"] == ["ml-postgres"]
    auth = existing.only("AWS::RDS::DBProxy")["Properties"]["Auth"]
    assert EXISTING_SECRET not in json.dumps(auth)  # the master secret is not on the proxy


EXISTING_SECRET = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:ml-postgres-master-AbCdEf"


def test_connect_grants_are_per_user_on_the_proxy(any_synth: Synth) -> None:
    grants: list[str] = []
    for policy in any_synth.resources("AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if statement["Action"] == "rds-db:connect":
                grants.append(json.dumps(statement["Resource"]))
    # The writer and its circuit breaker (which checks with the writer's login) as ckpt_writer;
    # the migration connects to the instance with the master secret, not through the proxy.
    assert len(grants) == 2
    assert sum(f"/{constants.WRITER_DB_USER}" in g for g in grants) == 2
    assert all("dbuser:" in g and "DBProxyArn" in g and "*" not in g for g in grants)


def test_new_database_is_small_encrypted_private(greenfield: Synth) -> None:
    props = greenfield.only("AWS::RDS::DBInstance")["Properties"]
    assert props["Engine"] == "postgres"
    # The major only, with automatic minor upgrades: no minor that AWS can retire is pinned.
    assert props["EngineVersion"] == constants.POSTGRES_MAJOR_VERSION == "16"
    assert props["AutoMinorVersionUpgrade"] is True
    assert props["StorageEncrypted"] is True
    assert props["PubliclyAccessible"] is False
    assert props["DeletionProtection"] is True
    assert props["DBInstanceClass"] == "db.t4g.micro"
    assert props["EnableIAMDatabaseAuthentication"] is True
    subnet_group = greenfield.only("AWS::RDS::DBSubnetGroup")["Properties"]
    assert len(subnet_group["SubnetIds"]) == 2
    assert not greenfield.resources("AWS::EC2::NatGateway")
    assert not greenfield.resources("AWS::EC2::InternetGateway")
    services = sorted(
        json.dumps(e["Properties"]["ServiceName"]).split(".")[-1].strip('"]}')
        for e in greenfield.resources("AWS::EC2::VPCEndpoint").values()
    )
    assert services == ["lambda", "secretsmanager", "sqs", "xray"]
    assert greenfield.resources("AWS::EC2::FlowLog")


def test_existing_vpc_creates_no_network(existing: Synth) -> None:
    assert not existing.resources("AWS::EC2::VPC")
    assert not existing.resources("AWS::EC2::VPCEndpoint")
    writer_egress = [
        r["Properties"] for r in existing.resources("AWS::EC2::SecurityGroupEgress").values()
    ]
    assert all(r["FromPort"] == 5432 for r in writer_egress)

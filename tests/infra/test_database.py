"""RDS Proxy (IAM auth + TLS, pool limits), security groups, per-user connect grants, new DB."""

from __future__ import annotations

import json
from typing import Any

from infra import constants
from infra.breaker import BREAKER_HANDLER
from tests.infra.conftest import Synth


def test_proxy_requires_iam_and_tls(any_synth: Synth) -> None:
    props = any_synth.only("AWS::RDS::DBProxy")["Properties"]
    assert props["RequireTLS"] is True
    assert props["EngineFamily"] == "POSTGRESQL"
    assert len(props["Auth"]) == 2  # master + ckpt_writer secrets
    assert all(auth["IAMAuth"] == "REQUIRED" for auth in props["Auth"])
    assert all(auth["AuthScheme"] == "SECRETS" for auth in props["Auth"])


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
        if fn["Properties"].get("Handler")
        in (constants.WRITER_HANDLER, constants.MIGRATION_HANDLER, BREAKER_HANDLER)
    ]
    assert sorted(json.dumps(r["SourceSecurityGroupId"]) for r in rules) == sorted(
        json.dumps(g) for g in function_groups
    )
    assert all(r["FromPort"] == r["ToPort"] == 5432 for r in rules)
    proxy_sg_id = proxy_group["Fn::GetAtt"][0]
    assert "SecurityGroupIngress" not in any_synth.json["Resources"][proxy_sg_id]["Properties"]


def test_only_the_proxy_reaches_a_new_database(greenfield: Synth) -> None:
    instance = greenfield.only("AWS::RDS::DBInstance")["Properties"]
    db_group = instance["VPCSecurityGroups"][0]
    proxy_group = greenfield.only("AWS::RDS::DBProxy")["Properties"]["VpcSecurityGroupIds"][0]
    rules = _ingress_into(greenfield, db_group)
    assert [r["SourceSecurityGroupId"] for r in rules] == [proxy_group]
    assert (
        "SecurityGroupIngress"
        not in greenfield.json["Resources"][db_group["Fn::GetAtt"][0]]["Properties"]
    )


def test_existing_database_gets_one_rule_from_the_proxy(existing: Synth) -> None:
    rules = _ingress_into(existing, "sg-0123456789abcdef0")
    assert len(rules) == 1 and rules[0]["FromPort"] == 5432
    assert not existing.resources("AWS::RDS::DBInstance")
    target = existing.only("AWS::RDS::DBProxyTargetGroup")["Properties"]
    assert target["DBInstanceIdentifiers"] == ["ml-postgres"]
    auth = existing.only("AWS::RDS::DBProxy")["Properties"]["Auth"]
    assert {"SecretArn": EXISTING_SECRET} in [{"SecretArn": a["SecretArn"]} for a in auth]


EXISTING_SECRET = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:ml-postgres-master-AbCdEf"


def test_connect_grants_are_per_user_on_the_proxy(any_synth: Synth) -> None:
    grants: list[str] = []
    for policy in any_synth.resources("AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if statement["Action"] == "rds-db:connect":
                grants.append(json.dumps(statement["Resource"]))
    assert len(grants) == 3
    # The writer and its circuit breaker (which checks with the writer's login) as ckpt_writer.
    assert sum(f"/{constants.WRITER_DB_USER}" in g for g in grants) == 2
    assert sum(f"/{any_synth.settings.db_master_user}" in g for g in grants) == 1
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

"""Deploy order (issue 13 item 2) and the migration's direct connection, from the synthesized stack.

instance + secrets + security group rules -> migration trigger -> proxy -> writer and breaker: a
secret registered on an RDS Proxy must hold the credentials of a user that exists
(https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-proxy-secrets-arns.html), and the
migration creates ckpt_writer, the proxy's one user.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from infra import constants
from tests.infra.conftest import Synth
from tests.infra.test_permissions import references

PROXY_TYPES = ("AWS::RDS::DBProxy", "AWS::RDS::DBProxyTargetGroup")


def _lid(synth: Synth, cfn_type: str) -> str:
    (lid,) = synth.resources(cfn_type)
    return lid


def _function_lid(synth: Synth, handler: str) -> str:
    (lid,) = (
        lid
        for lid, r in synth.resources("AWS::Lambda::Function").items()
        if r["Properties"].get("Handler") == handler
    )
    return lid


def _direct(resource: Mapping[str, Any]) -> set[str]:
    """What CloudFormation creates before ``resource``: DependsOn plus every Ref/GetAtt/Sub."""
    depends = resource.get("DependsOn", [])
    return set([depends] if isinstance(depends, str) else depends) | set(
        references(resource.get("Properties", {}))
    )


def created_before(synth: Synth, lid: str) -> set[str]:
    """Every resource CloudFormation must have created before ``lid`` (transitively)."""
    resources = synth.json["Resources"]
    seen: set[str] = set()
    todo = [lid]
    while todo:
        for dep in _direct(resources[todo.pop()]) & resources.keys():
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_the_proxy_is_created_after_the_migration_trigger(any_synth: Synth) -> None:
    resources = any_synth.json["Resources"]
    trigger = _lid(any_synth, "Custom::Trigger")
    for cfn_type in PROXY_TYPES:
        lid = _lid(any_synth, cfn_type)
        assert trigger in resources[lid]["DependsOn"], (cfn_type, resources[lid]["DependsOn"])
    # and the trigger waits for nothing of the proxy: no cycle, the proxy really comes later
    before_trigger = created_before(any_synth, trigger)
    proxy_parts = {
        lid
        for lid, r in resources.items()
        if r["Type"] in PROXY_TYPES or lid.startswith("DatabaseProxy")
    }
    assert proxy_parts and not before_trigger & proxy_parts, before_trigger & proxy_parts


def test_the_trigger_runs_after_the_instance_secrets_and_its_network_rules(
    any_synth: Synth,
) -> None:
    trigger = _lid(any_synth, "Custom::Trigger")
    before = created_before(any_synth, trigger)
    resources = any_synth.json["Resources"]
    migration_group = resources[_function_lid(any_synth, constants.MIGRATION_HANDLER)][
        "Properties"
    ]["VpcConfig"]["SecurityGroupIds"][0]
    rules = {
        lid
        for lid, r in resources.items()
        if r["Type"] in ("AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress")
        and migration_group
        in (r["Properties"].get("SourceSecurityGroupId"), r["Properties"].get("GroupId"))
    }
    assert rules and rules <= before
    secrets = set(any_synth.resources("AWS::SecretsManager::Secret"))
    assert secrets and secrets <= before  # ckpt_writer's (and a new instance's master) secret
    instances = set(any_synth.resources("AWS::RDS::DBInstance"))
    assert instances <= before and len(instances) == int(any_synth.settings.creates_database)
    if instances:
        attachment = set(any_synth.resources("AWS::SecretsManager::SecretTargetAttachment"))
        assert attachment and attachment <= before


def test_writer_and_breaker_come_after_the_proxy(any_synth: Synth) -> None:
    proxy = _lid(any_synth, "AWS::RDS::DBProxy")
    trigger = _lid(any_synth, "Custom::Trigger")
    for handler in (constants.WRITER_HANDLER, constants.BREAKER_HANDLER):
        before = created_before(any_synth, _function_lid(any_synth, handler))
        assert {proxy, trigger} <= before, handler
    mapping = _lid(any_synth, "AWS::Lambda::EventSourceMapping")
    assert {proxy, trigger} <= created_before(any_synth, mapping)


def test_the_migration_connects_directly_with_the_master_secret(any_synth: Synth) -> None:
    resources = any_synth.json["Resources"]
    props = resources[_function_lid(any_synth, constants.MIGRATION_HANDLER)]["Properties"]
    env = props["Environment"]["Variables"]
    assert env["DB_AUTH"] == "secret"
    assert env["DB_TLS"] == "channel-binding"
    assert env["DB_USER"] == any_synth.settings.db_master_user
    if any_synth.settings.creates_database:
        instance = _lid(any_synth, "AWS::RDS::DBInstance")
        assert env["DB_HOST"] == {"Fn::GetAtt": [instance, "Endpoint.Address"]}
        assert env["DB_PORT"] == str(constants.DB_PORT)
        attachment = _lid(any_synth, "AWS::SecretsManager::SecretTargetAttachment")
        assert env["DB_SECRET_ARN"] == {"Ref": attachment}
    else:
        database = any_synth.settings.database
        assert env["DB_HOST"] == database.endpoint  # type: ignore[union-attr]
        assert env["DB_PORT"] == str(database.port)  # type: ignore[union-attr]
        assert env["DB_SECRET_ARN"] == database.secret_arn  # type: ignore[union-attr]
    assert "DBProxy" not in json.dumps(env)  # nothing of the proxy in its environment
    # and no rds-db:connect: the proxy is not its way in
    role = references(props["Role"])
    for policy in any_synth.resources("AWS::IAM::Policy").values():
        if role & references(policy["Properties"]["Roles"]):
            assert "rds-db" not in json.dumps(policy["Properties"]["PolicyDocument"])

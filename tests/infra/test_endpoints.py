"""Interface endpoints: only the stack's own functions may use them, and their groups open no
egress (issue 45: no endpoint policy, and CDK's default groups allowed all egress)."""

from __future__ import annotations

from typing import Any

import pytest

from infra.network import PRINCIPAL_TAG
from tests.infra.conftest import Synth, synthesize
from tests.infra.test_permissions import needs_of

# CDK's rule for a group with allow_all_outbound=False: a placeholder that matches no traffic.
NO_EGRESS = [
    {
        "CidrIp": "255.255.255.255/32",
        "Description": "Disallow all traffic",
        "FromPort": 252,
        "IpProtocol": "icmp",
        "ToPort": 86,
    }
]


def _vpc_function_roles(synth: Synth) -> list[Any]:
    return [
        fn["Properties"]["Role"]
        for fn in synth.resources("AWS::Lambda::Function").values()
        if "VpcConfig" in fn["Properties"]
    ]


def test_each_endpoint_admits_only_the_stacks_functions(greenfield: Synth) -> None:
    endpoints = greenfield.resources("AWS::EC2::VPCEndpoint")
    interface = {
        k: v for k, v in endpoints.items() if v["Properties"]["VpcEndpointType"] == "Interface"
    }
    assert len(interface) == 4  # SQS, Secrets Manager, X-Ray, Lambda
    roles = _vpc_function_roles(greenfield)
    assert len(roles) >= 3  # writer, migration, breaker
    # Every VPC function's role carries the tag the condition admits, and no other role does
    iam_roles = greenfield.resources("AWS::IAM::Role")
    tagged = {
        logical_id
        for logical_id, role in iam_roles.items()
        if {"Key": PRINCIPAL_TAG, "Value": "ckpt-checkpoint-pipeline"}
        in role["Properties"].get("Tags", [])
    }
    assert tagged == {role["Fn::GetAtt"][0] for role in roles}
    services = set()
    for endpoint in interface.values():
        [statement] = endpoint["Properties"]["PolicyDocument"]["Statement"]
        assert statement["Effect"] == "Allow" and statement["Principal"] == {"AWS": "*"}
        assert statement["Condition"]["StringEquals"] == {
            f"aws:PrincipalTag/{PRINCIPAL_TAG}": "ckpt-checkpoint-pipeline",
            "aws:PrincipalAccount": {"Ref": "AWS::AccountId"},
        }
        action = statement["Action"]
        services.add(action.split(":")[0])
        if action in ("sqs:*", "secretsmanager:*"):
            # only the stack's own queues and secrets
            assert statement["Resource"] != "*"
    assert services == {"sqs", "secretsmanager", "xray", "lambda"}


def test_endpoint_groups_allow_no_egress(greenfield: Synth) -> None:
    groups = greenfield.resources("AWS::EC2::SecurityGroup")
    endpoint_groups = [
        g for g in groups.values() if "interface endpoint" in g["Properties"]["GroupDescription"]
    ]
    assert len(endpoint_groups) == 4
    for group in endpoint_groups:
        assert group["Properties"]["SecurityGroupEgress"] == NO_EGRESS
    # and no group of the stack allows all egress
    for group in groups.values():
        for rule in group["Properties"].get("SecurityGroupEgress", []):
            assert rule.get("CidrIp") != "0.0.0.0/0" or rule.get("IpProtocol") != "-1", group


@pytest.fixture(scope="module")
def greenfield_pruned(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The greenfield stack (endpoints) with the scheduled prune (a fourth in-VPC function)."""
    return synthesize(
        {"scheduledPrune": "true", "pruneKeepLast": "3"}, tmp_path_factory.mktemp("gp")
    )


def test_the_endpoint_policies_admit_every_call_the_functions_make(
    greenfield_pruned: Synth,
) -> None:
    # The calls each in-VPC function's code makes (tests/infra/aws_calls.py, as the permission
    # test derives them) that go through an endpoint: each is allowed by that endpoint's policy.
    template = greenfield_pruned.json
    policies: dict[str, dict[str, Any]] = {}
    for endpoint in greenfield_pruned.resources("AWS::EC2::VPCEndpoint").values():
        [statement] = endpoint["Properties"]["PolicyDocument"]["Statement"]
        policies[statement["Action"].split(":")[0]] = statement
    checked = 0
    for lid, fn in greenfield_pruned.resources("AWS::Lambda::Function").items():
        if "VpcConfig" not in fn["Properties"]:
            continue
        _, needs = needs_of(template, lid)
        for need in needs:
            service = need.action.split(":")[0]
            if service not in policies or need.why == "SQS event source":
                continue  # the event source polls from Lambda's side, not through the VPC
            resources = policies[service]["Resource"]
            resources = resources if isinstance(resources, list) else [resources]
            assert "*" in resources or any(need.matches(need.action, r) for r in resources), (
                lid,
                need,
            )
            checked += 1
    assert checked >= 5

"""X-Ray on the writer, and a retention on every log group the stack leads to (ours and CDK's)."""

from __future__ import annotations

import json

from infra import constants
from tests.infra.conftest import Synth


def test_writer_traces_actively_and_can_ship_traces(any_synth: Synth) -> None:
    functions = any_synth.resources("AWS::Lambda::Function").values()
    (writer,) = [f for f in functions if f["Properties"].get("Handler") == constants.WRITER_HANDLER]
    assert writer["Properties"]["TracingConfig"] == {"Mode": "Active"}
    role_id = writer["Properties"]["Role"]["Fn::GetAtt"][0]
    actions: set[str] = set()
    for policy in any_synth.resources("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                action = statement["Action"]
                actions.update([action] if isinstance(action, str) else action)
    assert {"xray:PutTraceSegments", "xray:PutTelemetryRecords"} <= actions
    if any_synth.settings.create_vpc_endpoints:
        # No NAT in a new VPC: the X-Ray daemon reaches the API through an interface endpoint.
        services = [
            json.dumps(e["Properties"]["ServiceName"])
            for e in any_synth.resources("AWS::EC2::VPCEndpoint").values()
        ]
        assert any(".xray" in s for s in services)


def test_every_function_logs_to_a_group_with_retention(any_synth: Synth) -> None:
    resources = any_synth.json["Resources"]
    functions = any_synth.resources("AWS::Lambda::Function")
    # Ours and CDK's providers (Trigger; in a new VPC the default-SG and LogRetention ones too).
    assert len(functions) >= 3
    for logical_id, function in functions.items():
        group_ref = function["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
        group = resources[group_ref]
        assert group["Type"] == "AWS::Logs::LogGroup", logical_id
        assert group["Properties"]["RetentionInDays"] == 30, logical_id


def test_rds_log_export_has_a_retention(greenfield: Synth, existing: Synth) -> None:
    (retention,) = greenfield.resources("Custom::LogRetention").values()
    props = retention["Properties"]
    assert props["RetentionInDays"] == 30
    assert "/aws/rds/instance/" in json.dumps(props["LogGroupName"])
    assert "/postgresql" in json.dumps(props["LogGroupName"])
    assert greenfield.only("AWS::RDS::DBInstance")["Properties"]["EnableCloudwatchLogsExports"] == [
        "postgresql"
    ]
    assert not existing.resources("Custom::LogRetention")

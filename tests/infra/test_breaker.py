"""The writer's circuit breaker in the synthesized stack: function, schedule, least privilege,
alarms, and the names it shares with its code."""

from __future__ import annotations

import json
from typing import Any

from infra import constants
from lambda_writer.breaker import handler as breaker_handler
from lambda_writer.shared.constants import BREAKER_SERVICE_NAME, BREAKER_TIMEOUT_S
from tests.infra.conftest import Synth


def _function(synth: Synth, handler: str) -> tuple[str, dict[str, Any]]:
    for logical_id, resource in synth.resources("AWS::Lambda::Function").items():
        if resource["Properties"].get("Handler") == handler:
            return logical_id, dict(resource["Properties"])
    raise AssertionError(f"no function with handler {handler}")


def _mapping_id(synth: Synth) -> str:
    (logical_id,) = synth.resources("AWS::Lambda::EventSourceMapping")
    return logical_id


def test_stack_names_the_code_handler() -> None:
    module, _, name = constants.BREAKER_HANDLER.rpartition(".")
    assert module == breaker_handler.__name__ and callable(getattr(breaker_handler, name))


def test_breaker_function_checks_as_the_writer(any_synth: Synth) -> None:
    _, props = _function(any_synth, constants.BREAKER_HANDLER)
    _, writer = _function(any_synth, constants.WRITER_HANDLER)
    env = props["Environment"]["Variables"]
    assert env["EVENT_SOURCE_MAPPING_ID"] == {"Ref": _mapping_id(any_synth)}
    for name in ("DB_HOST", "DB_PORT", "DB_NAME", "DB_USER", "DB_AUTH"):
        assert env[name] == writer["Environment"]["Variables"][name]
    assert env["POWERTOOLS_SERVICE_NAME"] == BREAKER_SERVICE_NAME
    assert props["Timeout"] == BREAKER_TIMEOUT_S
    assert props["ReservedConcurrentExecutions"] == 1
    assert props["Architectures"] == ["arm64"] and props["VpcConfig"]["SubnetIds"]


def test_scheduled_every_minute_without_retries(any_synth: Synth) -> None:
    fn_id, _ = _function(any_synth, constants.BREAKER_HANDLER)
    (rule,) = [
        r["Properties"]
        for r in any_synth.resources("AWS::Events::Rule").values()
        if r["Properties"]["Targets"][0]["Arn"] == {"Fn::GetAtt": [fn_id, "Arn"]}
    ]
    assert rule["ScheduleExpression"] == "rate(1 minute)" and rule["State"] == "ENABLED"
    (target,) = rule["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [fn_id, "Arn"]}
    assert target["RetryPolicy"] == {"MaximumRetryAttempts": 0, "MaximumEventAgeInSeconds": 60}


def test_may_switch_only_the_writers_mapping(any_synth: Synth) -> None:
    _, props = _function(any_synth, constants.BREAKER_HANDLER)
    role = props["Role"]["Fn::GetAtt"][0]
    statements = [
        statement
        for policy in any_synth.resources("AWS::IAM::Policy").values()
        if {"Ref": role} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    lambda_statements = [s for s in statements if "lambda:UpdateEventSourceMapping" in s["Action"]]
    (statement,) = lambda_statements
    assert sorted(statement["Action"]) == [
        "lambda:GetEventSourceMapping",
        "lambda:UpdateEventSourceMapping",
    ]
    # arn:<partition>:lambda:<region>:<account>:event-source-mapping:<the writer's mapping id>
    parts = statement["Resource"]["Fn::Join"][1]
    assert parts[-2].endswith(":event-source-mapping:")
    assert parts[-1] == {"Ref": _mapping_id(any_synth)}
    actions = {
        action
        for s in statements
        for action in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert actions == {
        "lambda:GetEventSourceMapping",
        "lambda:UpdateEventSourceMapping",
        "rds-db:connect",
    }


def test_alarms_go_to_the_topic(any_synth: Synth) -> None:
    alarms = {
        json.dumps(a["Properties"].get("Dimensions")): a["Properties"]
        for a in any_synth.resources("AWS::CloudWatch::Alarm").values()
        if a["Properties"].get("MetricName") in ("BreakerOpen", "Errors")
    }
    open_alarm = next(a for a in alarms.values() if a["MetricName"] == "BreakerOpen")
    assert open_alarm["Namespace"] == "CkptPipeline"
    assert open_alarm["Dimensions"] == [{"Name": "service", "Value": "ckpt-breaker"}]
    assert open_alarm["Period"] == 60 and open_alarm["TreatMissingData"] == "ignore"
    assert open_alarm["AlarmActions"] and open_alarm["OKActions"]
    fn_id, _ = _function(any_synth, constants.BREAKER_HANDLER)
    errors = next(
        a
        for a in alarms.values()
        if a["MetricName"] == "Errors" and a["Dimensions"][0]["Value"] == {"Ref": fn_id}
    )
    assert errors["AlarmActions"] == open_alarm["AlarmActions"]


def test_lambda_endpoint_only_without_nat(greenfield: Synth, existing: Synth) -> None:
    def lambda_endpoints(synth: Synth) -> list[Any]:
        return [
            e
            for e in synth.resources("AWS::EC2::VPCEndpoint").values()
            if "lambda" in json.dumps(e["Properties"]["ServiceName"])
        ]

    assert len(lambda_endpoints(greenfield)) == (
        1 if greenfield.settings.create_vpc_endpoints else 0
    )
    assert len(lambda_endpoints(existing)) == (1 if existing.settings.create_vpc_endpoints else 0)

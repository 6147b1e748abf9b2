"""Alarms (DLQ depth, message age, writer errors/throttles, proxy connections), topic, dashboard."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from infra import constants
from infra.alarm_topic import NO_SUBSCRIBER_WARNING
from tests.infra.conftest import Synth


def _alarm_props(synth: Synth, metric: str) -> list[dict[str, Any]]:
    return [
        dict(a["Properties"])
        for logical_id, a in synth.resources("AWS::CloudWatch::Alarm").items()
        # The circuit breaker's and the pruner's own alarms: test_breaker.py, test_pruner.py.
        if a["Properties"].get("MetricName") == metric
        and not logical_id.startswith(("Breaker", "Pruner"))
    ]


def test_dlq_alarm_fires_on_any_message(any_synth: Synth) -> None:
    (alarm,) = _alarm_props(any_synth, "ApproximateNumberOfMessagesVisible")
    assert alarm["Threshold"] == 0
    assert alarm["ComparisonOperator"] == "GreaterThanThreshold"
    assert alarm["Namespace"] == "AWS/SQS"
    assert "-checkpoints-dlq.fifo" in str(alarm["Dimensions"]) or "QueueName" in str(
        alarm["Dimensions"]
    )
    assert alarm["AlarmActions"] and alarm["OKActions"]


def test_age_errors_throttles_and_proxy_alarms(any_synth: Synth) -> None:
    (age,) = _alarm_props(any_synth, "ApproximateAgeOfOldestMessage")
    assert age["Threshold"] == constants.QUEUE_AGE_ALARM_S
    for metric in ("Errors", "Throttles"):
        (alarm,) = _alarm_props(any_synth, metric)
        assert alarm["Namespace"] == "AWS/Lambda" and alarm["Threshold"] == 0
    expected = 2 * (any_synth.settings.writer_reserved_concurrency + 1)
    for metric in ("ClientConnections", "DatabaseConnections"):
        (alarm,) = _alarm_props(any_synth, metric)
        assert alarm["Namespace"] == "AWS/RDS"
        assert alarm["Dimensions"][0]["Name"] == "ProxyName"
        assert alarm["Threshold"] == expected


def test_every_alarm_notifies_the_topic(any_synth: Synth) -> None:
    topic_id = next(iter(any_synth.resources("AWS::SNS::Topic")))
    alarms = any_synth.resources("AWS::CloudWatch::Alarm")
    # PipelineMonitoring's: queue 2, writer 2 + 4 (its EMF metrics: poison, transient failures,
    # restart loops; and its duration), proxy 2 + 2, a new database 3; and the circuit breaker's
    # 2 (infra/breaker.py), which show_breaker lists with them.
    ours = 6 + 4 + 2 + (3 if any_synth.settings.creates_database else 0)
    assert set(any_synth.stack.breaker.alarms) <= set(any_synth.stack.monitoring.alarms)
    # ... and the scheduled prune's one (infra/pruner.py), with the context only.
    pruner = any_synth.stack.pruner
    pruner_alarms = 1 if pruner is not None else 0
    if pruner is not None:
        assert set(pruner.alarms) <= set(any_synth.stack.monitoring.alarms)
    assert len(any_synth.stack.monitoring.alarms) == ours + 2 + pruner_alarms
    assert len(alarms) == ours + 2 + pruner_alarms
    for alarm in alarms.values():
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": topic_id}]


def _one_alarm(synth: Synth, metric: str) -> dict[str, Any]:
    (alarm,) = _alarm_props(synth, metric)
    return alarm


WRITER_TIMEOUT_MS = constants.WRITER_TIMEOUT_S * 1000


def test_writer_duration_alarm_fires_before_the_timeout(any_synth: Synth) -> None:
    alarm = _one_alarm(any_synth, "Duration")
    assert alarm["Namespace"] == "AWS/Lambda" and alarm["Statistic"] == "Maximum"
    assert alarm["ComparisonOperator"] == "GreaterThanThreshold"
    assert 0.5 * WRITER_TIMEOUT_MS <= alarm["Threshold"] < WRITER_TIMEOUT_MS
    (dimension,) = alarm["Dimensions"]
    assert dimension["Name"] == "FunctionName"
    writer = any_synth.json["Resources"][dimension["Value"]["Ref"]]["Properties"]
    assert writer["Handler"] == constants.WRITER_HANDLER


def test_writer_emf_metrics_are_alarmed(any_synth: Synth) -> None:
    # The names and namespace the handler emits (Powertools: namespace + service dimension).
    env = next(
        f["Properties"]["Environment"]["Variables"]
        for f in any_synth.resources("AWS::Lambda::Function").values()
        if f["Properties"].get("Handler") == constants.WRITER_HANDLER
    )
    for metric in ("PoisonRecords", "TransientFailures"):
        assert metric in constants.WRITER_METRICS
        alarm = _one_alarm(any_synth, metric)
        assert alarm["Namespace"] == env["POWERTOOLS_METRICS_NAMESPACE"]
        assert alarm["Dimensions"] == [{"Name": "service", "Value": env["POWERTOOLS_SERVICE_NAME"]}]
        assert alarm["Statistic"] == "Sum" and alarm["Threshold"] == 0
    assert _one_alarm(any_synth, "TransientFailures")["EvaluationPeriods"] == 3


def test_proxy_availability_and_borrow_latency_alarms(any_synth: Synth) -> None:
    proxy_id = next(iter(any_synth.resources("AWS::RDS::DBProxy")))
    availability = _one_alarm(any_synth, "AvailabilityPercentage")
    assert availability["ComparisonOperator"] == "LessThanThreshold"
    assert availability["Threshold"] == 100 and availability["Period"] == 60
    assert {d["Name"]: d["Value"] for d in availability["Dimensions"]} == {
        "ProxyName": {"Ref": proxy_id},
        "TargetGroup": "default",
        "TargetRole": "READ_WRITE",
    }
    borrow = _one_alarm(any_synth, "DatabaseConnectionsBorrowLatency")
    # Microseconds, below the proxy's borrow timeout (where borrows start to fail).
    assert 0 < borrow["Threshold"] < constants.PROXY_BORROW_TIMEOUT_S * 1_000_000


def test_database_alarms_on_a_new_database_only(greenfield: Synth, existing: Synth) -> None:
    instance_id = next(iter(greenfield.resources("AWS::RDS::DBInstance")))
    cpu = _one_alarm(greenfield, "CPUUtilization")
    assert cpu["Threshold"] == 90 and cpu["Period"] == 60 and cpu["EvaluationPeriods"] == 5
    assert cpu["Dimensions"] == [{"Name": "DBInstanceIdentifier", "Value": {"Ref": instance_id}}]
    storage = _one_alarm(greenfield, "FreeStorageSpace")
    allocated = int(greenfield.only("AWS::RDS::DBInstance")["Properties"]["AllocatedStorage"])
    assert storage["ComparisonOperator"] == "LessThanThreshold"
    assert storage["Threshold"] == allocated * 2**30 / 10
    memory = _one_alarm(greenfield, "FreeableMemory")
    assert memory["ComparisonOperator"] == "LessThanThreshold" and memory["Threshold"] > 0
    for metric in ("CPUUtilization", "FreeStorageSpace", "FreeableMemory"):
        assert _alarm_props(existing, metric) == []  # another team's instance


def test_topic_is_encrypted_tls_only_with_optional_email(
    greenfield: Synth, existing: Synth
) -> None:
    for synth in (greenfield, existing):
        assert "KmsMasterKeyId" in synth.only("AWS::SNS::Topic")["Properties"]
        statements = synth.only("AWS::SNS::TopicPolicy")["Properties"]["PolicyDocument"][
            "Statement"
        ]
        assert any(
            s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}} for s in statements
        )
    assert not greenfield.resources("AWS::SNS::Subscription")
    sub = existing.only("AWS::SNS::Subscription")["Properties"]
    assert sub == {**sub, "Protocol": "email", "Endpoint": "ml-ops@example.com"}


def _alarms_of_this_account(statement: dict[str, Any]) -> bool:
    condition = statement.get("Condition", {})
    source_arn = json.dumps(condition.get("ArnLike", {}).get("aws:SourceArn"))
    return (
        condition.get("StringEquals") == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
        and ":cloudwatch:" in source_arn
        and ":alarm:*" in source_arn
        and "AWS::AccountId" in source_arn
    )


def test_cloudwatch_may_publish_to_the_topic_for_this_accounts_alarms(any_synth: Synth) -> None:
    # A topic policy replaces SNS's default one: without an Allow, alarm actions are refused.
    statements = any_synth.only("AWS::SNS::TopicPolicy")["Properties"]["PolicyDocument"][
        "Statement"
    ]
    topic_id = next(iter(any_synth.resources("AWS::SNS::Topic")))
    (allow,) = [s for s in statements if s["Effect"] == "Allow"]
    assert allow["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    assert allow["Action"] == "sns:Publish"
    assert allow["Resource"] == {"Ref": topic_id}
    assert _alarms_of_this_account(allow)


def test_topic_key_lets_only_this_accounts_alarms_encrypt(any_synth: Synth) -> None:
    topic = any_synth.only("AWS::SNS::Topic")["Properties"]
    key_id = topic["KmsMasterKeyId"]["Fn::GetAtt"][0]
    key = any_synth.json["Resources"][key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    cloudwatch = [
        s
        for s in key["KeyPolicy"]["Statement"]
        if s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}
    ]
    assert len(cloudwatch) == 1
    assert sorted(cloudwatch[0]["Action"]) == ["kms:Decrypt", "kms:GenerateDataKey*"]
    assert _alarms_of_this_account(cloudwatch[0])


def test_synth_warns_when_nobody_is_subscribed(greenfield: Synth, existing: Synth) -> None:
    (warning,) = [w for w in greenfield.messages("warning") if NO_SUBSCRIBER_WARNING in w]
    assert "nobody is subscribed" in warning and "alarmEmail" in warning
    assert not [w for w in existing.messages("warning") if NO_SUBSCRIBER_WARNING in w]
    assert "AlarmTopicArn" in greenfield.json["Outputs"]


def test_dashboard_shows_the_pipeline(any_synth: Synth) -> None:
    body = str(any_synth.only("AWS::CloudWatch::Dashboard")["Properties"]["DashboardBody"])
    for needle in (
        "RecordsWritten",
        "PoisonRecords",
        "TransientFailures",
        "DatabaseConnections",
        "ApproximateAgeOfOldestMessage",
        "Duration",
        "AvailabilityPercentage",
        "DatabaseConnectionsBorrowLatency",
        # The circuit breaker's EMF metrics, under its own service dimension.
        "BreakerOpen",
        "DatabaseHealthy",
        "ckpt-breaker",
    ):
        assert needle in body
    alarm_ids = list(any_synth.resources("AWS::CloudWatch::Alarm"))
    assert any(alarm_id.startswith("Breaker") for alarm_id in alarm_ids)
    for alarm_id in alarm_ids:
        assert alarm_id in body  # the alarm status widgets list every alarm, the breaker's too
    breaker_fn = any_synth.stack.resolve(any_synth.stack.breaker.function.function_name)
    assert str(breaker_fn) in body  # its invocations and errors
    database_metrics = ("CPUUtilization", "FreeStorageSpace", "FreeableMemory")
    assert all((m in body) == any_synth.settings.creates_database for m in database_metrics)


def test_every_alarm_of_the_stack_is_defined_in_the_alarms_module() -> None:
    # infra/alarms.py is where an alarm is defined (the breaker's too); other modules call it.
    infra = Path(__file__).resolve().parents[2] / "infra"
    makers = {
        path.name
        for path in infra.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "Alarm"
    }
    assert makers == {"alarms.py"}

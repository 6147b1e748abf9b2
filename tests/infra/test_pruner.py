"""The scheduled prune in the synthesized stack: absent by default; with the context, a function
as role ckpt_pruner with exactly its secret, a schedule, an alarm on its errors, the policy as
the code reads it. (Least privilege over every role: test_permissions; cdk-nag: test_compliance;
both run on this configuration too, the ``pruned`` synth.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra import constants
from infra.exceptions import SettingsError
from infra.settings import load_settings
from lambda_writer.prune import handler as prune_handler
from lambda_writer.prune.policy import RetentionPolicy
from lambda_writer.shared.constants import PRUNER_DB_USER, PRUNER_SERVICE_NAME, PRUNER_TIMEOUT_S
from tests.infra.conftest import DEFAULT_CONTEXT, PRUNE_CONTEXT, Synth


def _pruner(synth: Synth) -> tuple[str, dict[str, Any]]:
    found = [
        (lid, dict(r["Properties"]))
        for lid, r in synth.resources("AWS::Lambda::Function").items()
        if r["Properties"].get("Handler") == constants.PRUNER_HANDLER
    ]
    assert len(found) == 1, found
    return found[0]


def _policy_statements(synth: Synth, function_props: dict[str, Any]) -> list[dict[str, Any]]:
    role = function_props["Role"]["Fn::GetAtt"][0]
    return [
        statement
        for policy in synth.resources("AWS::IAM::Policy").values()
        if {"Ref": role} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_stack_names_the_code_handler() -> None:
    module, _, name = constants.PRUNER_HANDLER.rpartition(".")
    assert module == prune_handler.__name__ and callable(getattr(prune_handler, name))


@pytest.mark.slow  # synthesizes (request.getfixturevalue)
@pytest.mark.parametrize("config", ["greenfield", "existing"])
def test_off_by_default_no_pruner_resources(config: str, request: pytest.FixtureRequest) -> None:
    synth: Synth = request.getfixturevalue(config)
    template = json.dumps(synth.json)
    assert constants.PRUNER_HANDLER not in template
    assert "PRUNER_PASSWORD_SECRET_ARN" not in template and PRUNER_DB_USER not in template
    assert len(synth.resources("AWS::Events::Rule")) == 1  # the breaker's only
    assert not any("Pruner" in lid for lid in synth.json["Resources"])


def test_the_function_prunes_as_ckpt_pruner_with_the_contexts_policy(pruned: Synth) -> None:
    _, props = _pruner(pruned)
    env = props["Environment"]["Variables"]
    assert env["DB_USER"] == PRUNER_DB_USER and env["DB_AUTH"] == "secret"
    assert env["DB_TLS"] == "channel-binding"
    assert env["POWERTOOLS_SERVICE_NAME"] == PRUNER_SERVICE_NAME
    assert RetentionPolicy.from_json(env["PRUNE_POLICY"]) == RetentionPolicy(
        keep_last=3, keep_best=2, metric="loss", mode="min", keep_every=1000, superseded=True
    )
    assert props["Timeout"] == PRUNER_TIMEOUT_S and props["ReservedConcurrentExecutions"] == 1
    assert props["Architectures"] == ["arm64"] and props["VpcConfig"]["SubnetIds"]
    # its secret is its own (not the master's, not the writer's), and the migration sets it
    (secret_id,) = [
        lid
        for lid, r in pruned.resources("AWS::SecretsManager::Secret").items()
        if PRUNER_DB_USER in json.dumps(r["Properties"])
    ]
    assert env["DB_SECRET_ARN"] == {"Ref": secret_id}
    migration = next(
        r["Properties"]["Environment"]["Variables"]
        for r in pruned.resources("AWS::Lambda::Function").values()
        if "WRITER_PASSWORD_SECRET_ARN"
        in r["Properties"].get("Environment", {}).get("Variables", {})
    )
    assert migration["PRUNER_PASSWORD_SECRET_ARN"] == {"Ref": secret_id}


def test_its_role_reads_its_secret_and_nothing_else(pruned: Synth) -> None:
    _, props = _pruner(pruned)
    statements = _policy_statements(pruned, props)
    assert [(s["Action"], s["Effect"]) for s in statements] == [
        ("secretsmanager:GetSecretValue", "Allow")
    ]
    assert props["Environment"]["Variables"]["DB_SECRET_ARN"] == statements[0]["Resource"]


def test_scheduled_with_retries_and_an_alarm_on_its_errors(pruned: Synth) -> None:
    fn_id, _ = _pruner(pruned)
    (rule,) = [
        r["Properties"]
        for r in pruned.resources("AWS::Events::Rule").values()
        if r["Properties"]["Targets"][0]["Arn"] == {"Fn::GetAtt": [fn_id, "Arn"]}
    ]
    assert rule["ScheduleExpression"] == "rate(12 hours)" and rule["State"] == "ENABLED"
    assert rule["Targets"][0]["RetryPolicy"] == {
        "MaximumRetryAttempts": 2,
        "MaximumEventAgeInSeconds": 3600,
    }
    (alarm,) = [
        a["Properties"]
        for lid, a in pruned.resources("AWS::CloudWatch::Alarm").items()
        if "PrunerErrors" in lid
    ]
    assert alarm["MetricName"] == "Errors" and alarm["Namespace"] == "AWS/Lambda"
    assert alarm["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": fn_id}}]
    assert alarm["Statistic"] == "Sum" and alarm["Period"] == 12 * 3600
    assert alarm["Threshold"] == 0 and alarm["TreatMissingData"] == "notBreaching"
    assert alarm["AlarmActions"] and alarm["OKActions"]


@pytest.mark.parametrize(
    ("overrides", "key", "rule"),
    [
        ({"pruneKeepLast": "3"}, "pruneKeepLast", "only used with scheduledPrune=true"),
        ({"scheduledPrune": "true"}, "pruneKeepLast", "is required unless pruneSuperseded"),
        (
            {"scheduledPrune": "true", "pruneKeepLast": "2", "pruneKeepBest": "1"},
            "pruneMetric",
            "is required with pruneKeepBest",
        ),
        ({"scheduledPrune": "true", "pruneKeepLast": "0"}, "pruneKeepLast", "between 1"),
        (
            {"scheduledPrune": "true", "pruneSuperseded": "true", "pruneEveryHours": "0"},
            "pruneEveryHours",
            "between 1 and 168",
        ),
        (
            {"scheduledPrune": "true", "pruneKeepLast": "2", "pruneMode": "best"},
            "pruneMode",
            "must be min or max",
        ),
    ],
)
def test_bad_prune_context_names_the_key(overrides: dict[str, str], key: str, rule: str) -> None:
    context = {**DEFAULT_CONTEXT, **overrides}
    with pytest.raises(SettingsError) as caught:
        load_settings(context.get)
    assert caught.value.name == key and rule in caught.value.rule, caught.value


def test_the_prune_context_parses() -> None:
    settings = load_settings({**DEFAULT_CONTEXT, **PRUNE_CONTEXT}.get)
    assert settings.scheduled_prune is not None and settings.scheduled_prune.every_hours == 12
    only_superseded = load_settings(
        {**DEFAULT_CONTEXT, "scheduledPrune": True, "pruneSuperseded": True}.get
    )
    assert only_superseded.scheduled_prune is not None
    assert only_superseded.scheduled_prune.policy == RetentionPolicy(superseded=True)
    assert only_superseded.scheduled_prune.every_hours == 24


def test_the_dashboard_shows_the_prune(pruned: Synth, greenfield: Synth) -> None:
    body = str(pruned.only("AWS::CloudWatch::Dashboard")["Properties"]["DashboardBody"])
    assert all(name in body for name in ("CheckpointsPruned", "ShardRowsPruned", "ckpt-pruner"))
    default = str(greenfield.only("AWS::CloudWatch::Dashboard")["Properties"]["DashboardBody"])
    assert "ckpt-pruner" not in default

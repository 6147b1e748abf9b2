"""Writer Lambda: runtime, arm64, VPC, reserved concurrency, event source, environment, grants."""

from __future__ import annotations

import json
from typing import Any

from infra import constants
from tests.infra.conftest import Synth


def _function(synth: Synth, handler: str) -> dict[str, Any]:
    for resource in synth.resources("AWS::Lambda::Function").values():
        if resource["Properties"].get("Handler") == handler:
            return dict(resource["Properties"])
    raise AssertionError(f"no function with handler {handler}")


def test_writer_runtime_architecture_vpc(any_synth: Synth) -> None:
    props = _function(any_synth, constants.WRITER_HANDLER)
    assert props["Runtime"] == f"python{constants.LAMBDA_PYTHON_VERSION}"
    assert tuple(int(p) for p in constants.LAMBDA_PYTHON_VERSION.split(".")) >= (3, 12)
    assert props["Architectures"] == ["arm64"]
    assert props["Timeout"] == constants.WRITER_TIMEOUT_S
    assert props["VpcConfig"]["SubnetIds"]
    assert len(props["VpcConfig"]["SecurityGroupIds"]) == 1


def test_reserved_concurrency_and_event_source(greenfield: Synth, existing: Synth) -> None:
    for synth, reserved in ((greenfield, 2), (existing, 1)):
        assert (
            _function(synth, constants.WRITER_HANDLER)["ReservedConcurrentExecutions"] == reserved
        )
        mapping = synth.only("AWS::Lambda::EventSourceMapping")["Properties"]
        assert mapping["BatchSize"] == 10
        assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
        assert "MaximumBatchingWindowInSeconds" not in mapping
        if reserved == 2:
            assert mapping["ScalingConfig"] == {"MaximumConcurrency": 2}
        else:
            assert "ScalingConfig" not in mapping


def test_writer_environment_has_names_not_secrets(any_synth: Synth) -> None:
    env = _function(any_synth, constants.WRITER_HANDLER)["Environment"]["Variables"]
    replay = any_synth.settings.replay_principal_id
    assert set(env) == {
        "DLQ_URL", "DB_HOST", "DB_PORT", "DB_NAME", "DB_USER", "DB_AUTH",
        "POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE", "PYDANTIC_DISABLE_PLUGINS",
    } | ({"REPLAY_PRINCIPAL_ID", "JOB_PREFIXES"} if replay else set())  # fmt: skip
    # The existing-database synth names a replay role and the stricter mode; the greenfield one
    # neither.
    assert env.get("REPLAY_PRINCIPAL_ID") == replay
    if replay:
        assert json.loads(env["JOB_PREFIXES"]) == {
            "AROATEAMAROLEEXAMPLE": ["teamA-"],
            "AROATEAMBROLEEXAMPLE": ["b/"],
        }
    assert env["DB_USER"] == constants.WRITER_DB_USER
    assert env["DB_AUTH"] == "iam"
    assert env["DB_PORT"] == "5432"
    assert env["DB_NAME"] == any_synth.settings.db_name
    assert env["DB_HOST"] == {
        "Fn::GetAtt": [_logical_id(any_synth, "AWS::RDS::DBProxy"), "Endpoint"]
    }
    assert env["POWERTOOLS_METRICS_NAMESPACE"] == "CkptPipeline"
    assert env["POWERTOOLS_SERVICE_NAME"] == "ckpt-writer"
    assert env["PYDANTIC_DISABLE_PLUGINS"] == "__all__"  # no plugin scan at the cold start
    assert "Ref" in env["DLQ_URL"]


def test_migration_function_runs_as_master_user(any_synth: Synth) -> None:
    props = _function(any_synth, constants.MIGRATION_HANDLER)
    env = props["Environment"]["Variables"]
    assert env["DB_USER"] == any_synth.settings.db_master_user
    assert env["DB_AUTH"] == "secret"  # directly to the instance (tests/infra/test_ordering.py)
    assert "Ref" in env["WRITER_PASSWORD_SECRET_ARN"]  # the ARN, never the value
    assert props["Architectures"] == ["arm64"]


def _logical_id(synth: Synth, cfn_type: str) -> str:
    found = synth.resources(cfn_type)
    assert len(found) == 1
    return next(iter(found))


def test_writer_may_send_to_dlq_and_consume_queue(any_synth: Synth) -> None:
    actions: set[str] = set()
    writer_role = _function(any_synth, constants.WRITER_HANDLER)["Role"]["Fn::GetAtt"][0]
    for policy in any_synth.resources("AWS::IAM::Policy").values():
        if {"Ref": writer_role} in policy["Properties"]["Roles"]:
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                action = statement["Action"]
                actions.update([action] if isinstance(action, str) else action)
    assert {
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:SendMessage",
        "rds-db:connect",
    } <= actions
    assert not any(a.endswith("*") for a in actions if a.startswith("rds-db"))


def test_migrations_trigger_runs_before_the_writer(any_synth: Synth) -> None:
    trigger_id = _logical_id(any_synth, "Custom::Trigger")
    resources = any_synth.json["Resources"]
    writer_id = next(
        key for key, value in resources.items()
        if value["Type"] == "AWS::Lambda::Function"
        and value["Properties"].get("Handler") == constants.WRITER_HANDLER
    )  # fmt: skip
    mapping_id = _logical_id(any_synth, "AWS::Lambda::EventSourceMapping")
    assert trigger_id in resources[writer_id]["DependsOn"]
    assert trigger_id in resources[mapping_id]["DependsOn"]
    proxy_id = _logical_id(any_synth, "AWS::RDS::DBProxy")
    assert trigger_id in resources[proxy_id]["DependsOn"]  # the proxy after the migration


def test_database_functions_are_built_alike(any_synth: Synth) -> None:
    # One construct (infra/database_function.py) builds every function that talks to the database.
    resources = any_synth.json["Resources"]
    shape: list[tuple[Any, ...]] = []
    for handler in (constants.WRITER_HANDLER, constants.MIGRATION_HANDLER):
        props = _function(any_synth, handler)
        env = props["Environment"]["Variables"]
        (group,) = props["VpcConfig"]["SecurityGroupIds"]
        assert resources[group["Fn::GetAtt"][0]]["Type"] == "AWS::EC2::SecurityGroup"  # its own
        log_group = resources[props["LoggingConfig"]["LogGroup"]["Ref"]]["Properties"]
        shape.append(
            (
                props["Runtime"],
                tuple(props["Architectures"]),
                json.dumps(props["VpcConfig"]["SubnetIds"]),
                log_group["RetentionInDays"],
                # through the proxy (iam) or, the migration, to the instance (secret)
                (env["DB_NAME"], env["DB_AUTH"] in ("iam", "secret"), "DB_HOST" in env),
            )
        )
    assert shape[0] == shape[1]


def test_security_group_descriptions_keep_only_what_ec2_accepts() -> None:
    from infra.database_function import _group_description

    assert (
        _group_description("the writer's queue: out (TLS) #1") == "the writers queue: out (TLS) #1"
    )

"""Context validation: good values parse; bad ones fail at synth naming the key and the rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from infra import constants
from infra.exceptions import SettingsError
from infra.settings import ExistingDatabase, NewDatabase, load_settings
from tests.infra.conftest import DEFAULT_CONTEXT, EXISTING_CONTEXT, REPO_ROOT


def _load(context: dict[str, Any]) -> Any:
    # Every key, as the app passes them (app.node.get_all_context()): unknown ones are refused.
    return load_settings(context.get, context.keys())


def test_default_context_is_greenfield() -> None:
    settings = _load(DEFAULT_CONTEXT)
    assert isinstance(settings.database, NewDatabase)
    assert settings.network is None and settings.create_vpc_endpoints
    assert settings.writer_reserved_concurrency == 2
    assert settings.event_source_max_concurrency == 2
    assert settings.max_receive_count == constants.MAX_RECEIVE_COUNT
    assert settings.alarm_email is None
    assert settings.replay_principal_id is None


def test_existing_context_parses_cli_strings() -> None:
    settings = _load(EXISTING_CONTEXT)
    assert isinstance(settings.database, ExistingDatabase)
    assert settings.database.port == 5432
    assert settings.network is not None
    assert settings.network.private_subnet_ids == (
        "subnet-0aaaaaaaaaaaaaaa1",
        "subnet-0bbbbbbbbbbbbbbb2",
    )
    assert settings.writer_reserved_concurrency == 1
    assert settings.event_source_max_concurrency is None
    assert settings.max_receive_count == constants.MAX_RECEIVE_COUNT_RESERVED_1
    assert settings.high_throughput_fifo is False
    assert not settings.create_vpc_endpoints
    assert settings.replay_principal_id == "AROAOPSREPLAYEXAMPLE1"
    assert settings.job_prefixes == {
        "AROATEAMAROLEEXAMPLE": ("teamA-",),
        "AROATEAMBROLEEXAMPLE": ("b/",),
    }


@pytest.mark.parametrize(
    ("overrides", "key", "rule"),
    [
        ({"writerReservedConcurrency": 3}, "writerReservedConcurrency", "must be 1 or 2"),
        ({"writerReservedConcurrency": "0"}, "writerReservedConcurrency", "must be 1 or 2"),
        ({"writerReservedConcurrency": "two"}, "writerReservedConcurrency", "must be an integer"),
        ({"alarmEmail": "not-an-address"}, "alarmEmail", "must be an e-mail address"),
        (
            {"replayPrincipalId": "AROAOPSREPLAYEXAMPLE1:operator"},
            "replayPrincipalId",
            "unique id of the role",
        ),
        (
            {"jobPrefixesByPrincipal": '{"AROATEAMAROLEEXAMPLE:i-1": ["teamA-"]}'},
            "jobPrefixesByPrincipal",
            "without a session",
        ),
        ({"jobPrefixesByPrincipal": "teamA-"}, "jobPrefixesByPrincipal", "JSON object"),
        ({"prefix": "Bad_Prefix"}, "prefix", "lowercase letters"),
        ({"proxyMaxConnectionsPercent": 0}, "proxyMaxConnectionsPercent", "between 1 and 100"),
        ({"createDatabase": "yes"}, "createDatabase", "true or false"),
        ({"dbName": "drop table"}, "dbName", "PostgreSQL identifier"),
        ({"dbMasterUsername": "ckpt_writer"}, "dbMasterUsername", "other than 'ckpt_writer'"),
        (
            {"dbSecretArn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:x"},
            "dbSecretArn",
            "conflicts",
        ),
        ({"createDatabase": False}, "vpcId", "required when createDatabase is false"),
        (
            {"privateSubnetIds": "subnet-0aaaaaaaaaaaaaaa1"},
            "privateSubnetIds",
            "only used together with vpcId",
        ),
        ({"wheelhouse": "/nonexistent/wheels"}, "wheelhouse", "existing directory"),
    ],
)
def test_bad_greenfield_context(overrides: dict[str, Any], key: str, rule: str) -> None:
    with pytest.raises(SettingsError) as raised:
        _load({**DEFAULT_CONTEXT, **overrides})
    assert raised.value.name == key
    assert rule in raised.value.rule
    assert f"context {key!r}" in str(raised.value)


@pytest.mark.parametrize(
    ("overrides", "key", "rule"),
    [
        ({"dbSecretArn": None}, "dbSecretArn", "is required when createDatabase is false"),
        ({"dbSecretArn": "ml-postgres-secret"}, "dbSecretArn", "complete ARN"),
        ({"dbEndpoint": None}, "dbEndpoint", "is required"),
        ({"dbSecurityGroupId": "default"}, "dbSecurityGroupId", "security group id"),
        ({"availabilityZones": ["eu-west-1a"]}, "availabilityZones", "at least two"),
        (
            {"privateSubnetIds": ["subnet-0aaaaaaaaaaaaaaa1"]},
            "privateSubnetIds",
            "multiple of the 2",
        ),
        ({"vpcId": "my-vpc"}, "vpcId", "VPC id"),
        ({"dbPort": "80"}, "dbPort", "between 1150 and 65535"),
        ({"dbSecretKmsKeyArn": "alias/x"}, "dbSecretKmsKeyArn", "KMS key ARN"),
        # Keys of the instance the stack would create: nothing reads them here (issue 45).
        ({"dbMultiAz": "true"}, "dbMultiAz", "does not apply with createDatabase false"),
        ({"dbInstanceClass": "r6g.large"}, "dbInstanceClass", "does not apply"),
        ({"dbAllocatedStorageGiB": "100"}, "dbAllocatedStorageGiB", "does not apply"),
        ({"dbBackupRetentionDays": "14"}, "dbBackupRetentionDays", "does not apply"),
        ({"dbDeletionProtection": "false"}, "dbDeletionProtection", "never deletes"),
    ],
)
def test_bad_existing_context(overrides: dict[str, Any], key: str, rule: str) -> None:
    context = {**EXISTING_CONTEXT, **overrides}
    with pytest.raises(SettingsError) as raised:
        _load({k: v for k, v in context.items() if v is not None})
    assert (raised.value.name, rule in raised.value.rule) == (key, True), raised.value


@pytest.mark.parametrize(
    ("key", "rule"),
    [
        ("writerReservedConcurency", "did you mean writerReservedConcurrency?"),
        ("dbmultiaz", "did you mean dbMultiAz?"),
        ("alarmMail", "did you mean alarmEmail?"),
        ("createDatabse", "did you mean createDatabase?"),
        ("colour", "is not a context key of this app: see docs/deploy.md#context-keys"),
    ],
)
def test_an_unknown_key_is_refused_with_the_nearest_known_key(key: str, rule: str) -> None:
    # GIVEN a typo that would otherwise synthesize the default silently (issue 45)
    with pytest.raises(SettingsError) as raised:
        _load({**DEFAULT_CONTEXT, key: "1"})
    assert raised.value.name == key
    assert raised.value.rule.endswith(rule), raised.value.rule


def test_the_cdks_own_keys_are_not_the_apps_to_check() -> None:
    # Feature flags, what the CLI adds, cached lookups, acknowledged notices: all pass.
    context = {
        **DEFAULT_CONTEXT,
        "@aws-cdk/core:newStyleStackSynthesis": True,
        "aws:cdk:version-reporting": False,
        "aws:cdk:bundling-stacks": [],
        "availability-zones:account=123456789012:region=eu-west-1": ["eu-west-1a"],
        "acknowledged-issue-numbers": [12345],
    }
    assert _load(context).prefix == "ckpt"


def test_the_greenfield_keeps_dbdeletionprotection_beside_an_existing_database() -> None:
    # cdk.json carries dbDeletionProtection=true: the documented existing-database command
    # (cdk.json + -c createDatabase=false ...) must not be refused for it.
    assert DEFAULT_CONTEXT["dbDeletionProtection"] is True
    assert isinstance(_load({**DEFAULT_CONTEXT, **EXISTING_CONTEXT}).database, ExistingDatabase)


def test_settings_are_frozen() -> None:
    settings = _load(DEFAULT_CONTEXT)
    with pytest.raises(AttributeError):
        settings.prefix = "other"  # type: ignore[misc]


@pytest.mark.slow
def test_app_exits_with_the_key_and_rule() -> None:
    # The CLI hands context to the app through CDK_CONTEXT_JSON; the app must stop before synth.
    env = {
        **os.environ,
        "CDK_CONTEXT_JSON": json.dumps({**DEFAULT_CONTEXT, "writerReservedConcurrency": 3}),
    }
    result = subprocess.run(
        [sys.executable, "app.py"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert (
        "invalid configuration: context 'writerReservedConcurrency': must be 1 or 2, got 3"
        in result.stderr
    )
    assert "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cdk_synth_refuses_a_misspelled_key() -> None:
    # The real CDK CLI, as an operator types it (issue 45: this synthesized with concurrency 2).
    env = {**os.environ, "CDK_DISABLE_VERSION_CHECK": "true", "CDK_DISABLE_CLI_TELEMETRY": "true"}
    result = subprocess.run(
        ["npx", "cdk", "synth", "--no-notices", "-q", "-c", "writerReservedConcurency=1"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=230, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert (
        "ckpt-pipeline: invalid configuration: context 'writerReservedConcurency': is not a"
        " context key of this app: did you mean writerReservedConcurrency?"
    ) in result.stderr
    assert "Traceback" not in result.stderr

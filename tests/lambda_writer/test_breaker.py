"""Circuit breaker: the pure decision, the real database check, the mapping switch over moto's
Lambda API (HTTP), and the handler end to end against both."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import psycopg
import pytest

from ckpt_pipeline.local.receive_gate import LocalMapping, create_local_mapping
from lambda_writer.breaker import handler as breaker_handler
from lambda_writer.breaker.circuit import (
    BREAKER_BUDGET,
    BreakerSettings,
    HealthCheck,
    MappingSwitch,
    backoff_delay_s,
    check_database,
    decide_breaker,
    mapping_switch,
    run_breaker,
)
from lambda_writer.breaker.exceptions import BreakerError
from lambda_writer.shared.connection import CONNECT_TIMEOUT_S
from lambda_writer.shared.constants import BREAKER_TIMEOUT_S
from lambda_writer.shared.exceptions import SettingsError
from lambda_writer.shared.settings import WriterSettings

UNHEALTHY = HealthCheck(False, "OperationalError: connection refused")
HEALTHY = HealthCheck(True)
CLOSED_PORT_URL = "postgresql://postgres@127.0.0.1:9/ckpt"


# -- pure logic ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("health", "state", "action", "breaker_open"),
    [
        (UNHEALTHY, "Enabled", "disable", True),
        (UNHEALTHY, "Enabling", "disable", True),
        (UNHEALTHY, "Disabled", "none", True),
        (UNHEALTHY, "Disabling", "none", True),
        (HEALTHY, "Disabled", "enable", False),
        (HEALTHY, "Disabling", "enable", False),
        (HEALTHY, "Enabled", "none", False),
        (HEALTHY, "Updating", "none", False),
        (UNHEALTHY, "Updating", "none", True),
        (UNHEALTHY, "Creating", "none", True),
    ],
)
def test_decide(health: HealthCheck, state: str, action: str, breaker_open: bool) -> None:
    decision = decide_breaker(health, state)
    assert (decision.action, decision.breaker_open) == (action, breaker_open)
    if not health.healthy:
        assert "connection refused" in decision.reason or state in decision.reason


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff_delay_s(n, base_s=1, cap_s=10) for n in range(6)] == [0, 1, 2, 4, 8, 10]


def test_budget_fits_the_function_timeout() -> None:
    # One DB check (connect timeout + a secret read) and two mapping calls, each at worst case.
    worst = CONNECT_TIMEOUT_S + 3 * BREAKER_BUDGET.worst_case_s()
    assert worst < BREAKER_TIMEOUT_S


def test_settings_name_the_variable() -> None:
    with pytest.raises(SettingsError) as missing:
        BreakerSettings.from_env({"DATABASE_URL": CLOSED_PORT_URL})
    assert missing.value.name == "EVENT_SOURCE_MAPPING_ID"
    with pytest.raises(SettingsError, match="must be a mapping UUID"):
        BreakerSettings.from_env({"DATABASE_URL": CLOSED_PORT_URL, "EVENT_SOURCE_MAPPING_ID": "x"})
    mapping = str(uuid.uuid4())
    settings = BreakerSettings.from_env(
        {"DATABASE_URL": CLOSED_PORT_URL, "EVENT_SOURCE_MAPPING_ID": mapping}
    )
    assert settings.mapping_uuid == mapping and settings.writer.database_url == CLOSED_PORT_URL


# -- the real database --------------------------------------------------------------------------


def test_check_database_healthy_and_unreachable(clean_db: str) -> None:
    assert check_database(WriterSettings(database_url=clean_db)) == HEALTHY
    down = check_database(WriterSettings(database_url="postgresql://u:s3cret@127.0.0.1:9/x"))
    assert not down.healthy and "OperationalError" in down.reason
    assert "s3cret" not in down.reason and "\n" not in down.reason


# -- the mapping over moto's Lambda API ---------------------------------------------------------


@pytest.fixture
def local_mapping(moto_endpoint: str) -> Iterator[LocalMapping]:
    session = boto3.session.Session()
    yield create_local_mapping(
        session.client("lambda", endpoint_url=moto_endpoint),
        session.client("sqs", endpoint_url=moto_endpoint),
        session.client("iam", endpoint_url=moto_endpoint),
        prefix=f"b{uuid.uuid4().hex[:8]}",
    )


def test_switch_reads_and_flips_the_mapping(local_mapping: LocalMapping) -> None:
    switch = mapping_switch(local_mapping.uuid, region="us-east-1")
    assert switch.state() == "Enabled"
    assert switch.set_enabled(False) == "Disabled"
    assert switch.state() == "Disabled"
    assert switch.set_enabled(True) == "Enabled"


def test_switch_on_a_missing_mapping_raises_one_error(moto_endpoint: str) -> None:
    switch = mapping_switch(str(uuid.uuid4()), region="us-east-1")
    with pytest.raises(BreakerError, match="cannot read event source mapping"):
        switch.state()


def test_run_breaker_opens_then_closes(local_mapping: LocalMapping, clean_db: str) -> None:
    switch = mapping_switch(local_mapping.uuid, region="us-east-1")
    down = WriterSettings(database_url=CLOSED_PORT_URL)
    up = WriterSettings(database_url=clean_db)
    opened = run_breaker(lambda: check_database(down), switch)
    assert opened.changed and opened.state_after == "Disabled" and opened.decision.breaker_open
    again = run_breaker(lambda: check_database(down), switch)
    assert not again.changed and again.decision.breaker_open
    closed = run_breaker(lambda: check_database(up), switch)
    assert closed.changed and closed.state_after == "Enabled" and not closed.decision.breaker_open


class _BusyLambda:
    """A Lambda client whose update is refused as in-use (a mapping mid-transition)."""

    def get_event_source_mapping(self, UUID: str) -> dict[str, Any]:  # noqa: N803
        return {"UUID": UUID, "State": "Enabled"}

    def update_event_source_mapping(self, UUID: str, Enabled: bool) -> dict[str, Any]:  # noqa: N803
        from botocore.exceptions import ClientError

        error = {"Error": {"Code": "ResourceInUseException", "Message": "busy"}}
        raise ClientError(error, "UpdateEventSourceMapping")  # type: ignore[arg-type]


def test_a_busy_mapping_is_left_for_the_next_run() -> None:
    run = run_breaker(lambda: UNHEALTHY, MappingSwitch(_BusyLambda(), str(uuid.uuid4())))
    assert run.decision.action == "disable" and run.state_after is None and not run.changed


def test_handler_logs_and_emits_metrics(
    local_mapping: LocalMapping,
    clean_db: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN the breaker function's environment, the database unreachable
    monkeypatch.setenv("EVENT_SOURCE_MAPPING_ID", local_mapping.uuid)
    monkeypatch.setenv("DATABASE_URL", CLOSED_PORT_URL)
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    breaker_handler._environment.cache_clear()
    try:
        # WHEN it runs: the mapping is disabled, BreakerOpen=1, a WARNING says so
        result = breaker_handler.handler({}, _Context())
        assert result["action"] == "disable" and result["breaker_open"] is True
        assert any("circuit breaker OPEN" in r.getMessage() for r in caplog.records)
        emf = [
            json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line
        ]
        assert len(emf) == 1 and emf[0]["service"] == "ckpt-breaker"
        assert (emf[0]["BreakerOpen"], emf[0]["DatabaseHealthy"]) in (([1], [0]), (1, 0))
        assert emf[0]["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "CkptPipeline"
        # AND once the database is back, the next run enables it again
        monkeypatch.setenv("DATABASE_URL", clean_db)
        breaker_handler._environment.cache_clear()
        result = breaker_handler.handler({}, _Context())
        assert result["action"] == "enable" and result["mapping_state_after"] == "Enabled"
        emf = [
            json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line
        ]
        assert (emf[0]["BreakerOpen"], emf[0]["DatabaseHealthy"]) in (([0], [1]), (0, 1))
    finally:
        breaker_handler._environment.cache_clear()


class _Context:
    function_name = "ckpt-breaker"
    memory_limit_in_mb = 128
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:ckpt-breaker"
    aws_request_id = "req-1"


def test_writer_role_health_check_fails_at_connection_limit_zero(clean_db: str) -> None:
    # The breaker checks with the writer's own login: a role that may not connect is unhealthy.
    role = f"brk_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(clean_db, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0")
    try:
        url = psycopg.conninfo.make_conninfo(clean_db, user=role)
        health = check_database(WriterSettings(database_url=url))
        assert not health.healthy and "too many connections" in health.reason
    finally:
        with psycopg.connect(clean_db, autocommit=True) as admin:
            admin.execute(f"DROP ROLE {role}")

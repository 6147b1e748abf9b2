"""Circuit breaker for the writer: stop consuming the queue while the database is down.

Why. A record the writer cannot write goes back to the queue and is received again after the
visibility timeout; after maxReceiveCount receives SQS moves it to the DLQ. So a database outage
longer than maxReceiveCount x visibility timeout (5 x 180 s = 15 min as deployed) would move every
valid report to the DLQ. AWS's answer for a downstream that is failing is a circuit breaker: stop
calling it, detect when it works again, resume
(https://docs.aws.amazon.com/prescriptive-guidance/latest/cloud-design-patterns/circuit-breaker.html).
For an SQS event source the switch is the mapping itself: "If you disable the event source mapping,
AWS Lambda stops polling. If you enable again, it will resume polling [...] so you don't lose
processing of any records" (UpdateEventSourceMapping,
https://docs.aws.amazon.com/sdkfornet/latest/apidocs/items/TLambdaUpdateEventSourceMappingRequestNET45.html);
messages that are not received gain no receive count.

How. A scheduled function (``breaker_handler``, every minute) connects to the database exactly as
the writer does (same settings, same role, through the proxy) and runs one query. Unhealthy and
the mapping is polling: disable it (breaker open). Healthy and the mapping is disabled: enable it
(breaker closed). The mapping's own state is the breaker's state, so the function keeps none.

The decision (:func:`decide_breaker`) and the backoff (:func:`backoff_delay_s`) are pure; the
database check and the mapping switch are the I/O, and ``ckpt-pipeline poll`` uses the same
pieces locally.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import psycopg

from lambda_writer.breaker.exceptions import BreakerError
from lambda_writer.shared.aws import ClientBudget, client
from lambda_writer.shared.connection import connect, redact
from lambda_writer.shared.exceptions import SettingsError, TransientWriteError
from lambda_writer.shared.settings import WriterSettings

logger = logging.getLogger(__name__)

# The breaker's AWS calls (GetEventSourceMapping, UpdateEventSourceMapping): control-plane calls
# answer in well under a second; a second attempt covers one throttle. Worst case per call
# 2 x (2 + 3) + 1 = 11 s (lambda_writer.shared.aws.ClientBudget.worst_case_s). The function's
# timeout (lambda_writer.shared.constants.BREAKER_TIMEOUT_S, 45 s) is sized from this budget.
BREAKER_BUDGET = ClientBudget(connect_timeout_s=2.0, read_timeout_s=3.0, total_max_attempts=2)

# Lambda's event source mapping states: Creating, Enabling, Enabled, Disabling, Disabled, Updating,
# Deleting (https://docs.aws.amazon.com/sdk-for-kotlin/api/latest/lambda/aws.sdk.kotlin.services.lambda.model/-get-event-source-mapping-response/state.html).
ON_STATES = frozenset({"Enabled", "Enabling"})
OFF_STATES = frozenset({"Disabled", "Disabling"})
BUSY_STATES = frozenset({"Creating", "Updating", "Deleting"})

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

BreakerAction = Literal["disable", "enable", "none"]


@dataclass(frozen=True)
class HealthCheck:
    """One database check: ``healthy``, and why not (one redacted line) when it is not."""

    healthy: bool
    reason: str = ""


@dataclass(frozen=True)
class BreakerDecision:
    """What to do with the mapping, and whether the breaker is open afterwards."""

    action: BreakerAction
    breaker_open: bool
    reason: str


def decide_breaker(health: HealthCheck, mapping_state: str) -> BreakerDecision:
    """Disable a polling mapping when the database is unhealthy; enable a disabled one when it is.

    A mapping in transition (Creating, Updating, Deleting) is left alone: an update would be
    refused (ResourceInUseException) and the next run decides again a minute later.
    """
    if mapping_state in BUSY_STATES:
        return BreakerDecision(
            "none", not health.healthy, f"mapping is {mapping_state}; next run decides"
        )
    if not health.healthy:
        if mapping_state in ON_STATES:
            return BreakerDecision("disable", True, f"database unhealthy: {health.reason}")
        return BreakerDecision("none", True, f"database still unhealthy: {health.reason}")
    if mapping_state in OFF_STATES:
        return BreakerDecision("enable", False, "database healthy again")
    return BreakerDecision("none", False, "database healthy")


def backoff_delay_s(failed_checks: int, *, base_s: float = 1.0, cap_s: float = 30.0) -> float:
    """Seconds to wait before the next check after ``failed_checks`` consecutive failures.

    Exponential (1, 2, 4, ... s), capped: a short blip is noticed within seconds, a long outage
    costs one connection attempt per ``cap_s``.
    """
    if failed_checks < 1:
        return 0.0
    return float(min(cap_s, base_s * 2.0 ** (failed_checks - 1)))


def check_database(
    settings: WriterSettings, *, budget: ClientBudget = BREAKER_BUDGET
) -> HealthCheck:
    """Connect as the writer does and run one query; never raises for a database failure.

    ``pg_is_in_recovery()`` must be false: a connection that lands on a standby (a failover in
    progress) cannot write either. Settings errors still raise — they are not an outage.
    """
    try:
        with connect(settings, autocommit=True, budget=budget) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    except psycopg.Error as exc:
        return HealthCheck(False, _one_line(exc))
    except TransientWriteError as exc:  # the IAM token or the secret could not be had
        return HealthCheck(False, _one_line(exc))
    if row is None or row[0]:
        return HealthCheck(False, "database is in recovery (read-only)")
    return HealthCheck(True)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return redact(f"{type(exc).__name__}: {first}")


class MappingSwitch:
    """One event source mapping's state and its Enabled switch, through the Lambda API."""

    def __init__(self, lambda_client: Any, uuid: str) -> None:
        self._lambda = lambda_client
        self.uuid = uuid

    def state(self) -> str:
        """The mapping's State (Enabled, Disabled, Enabling, ...); raises :class:`BreakerError`."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            mapping = self._lambda.get_event_source_mapping(UUID=self.uuid)
        except (BotoCoreError, ClientError) as exc:
            raise BreakerError(f"cannot read event source mapping {self.uuid}: {exc}") from exc
        return str(mapping.get("State", ""))

    def set_enabled(self, enabled: bool) -> str | None:
        """Enable or disable the mapping: its new State, or None when busy (next run retries)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            mapping = self._lambda.update_event_source_mapping(UUID=self.uuid, Enabled=enabled)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ResourceInUseException":
                return None
            raise BreakerError(f"cannot update event source mapping {self.uuid}: {exc}") from exc
        except BotoCoreError as exc:
            raise BreakerError(f"cannot update event source mapping {self.uuid}: {exc}") from exc
        return str(mapping.get("State", ""))


def mapping_switch(uuid: str, *, region: str | None) -> MappingSwitch:
    """A :class:`MappingSwitch` with a Lambda client inside the breaker's budget."""
    return MappingSwitch(client("lambda", region=region, budget=BREAKER_BUDGET), uuid)


@dataclass(frozen=True)
class BreakerSettings:
    """The breaker function's configuration: the writer's database settings + the mapping."""

    writer: WriterSettings
    mapping_uuid: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BreakerSettings:
        """``EVENT_SOURCE_MAPPING_ID`` + the writer's variables; raises :class:`SettingsError`."""
        env = os.environ if env is None else env
        uuid = env.get("EVENT_SOURCE_MAPPING_ID", "").strip()
        if not uuid:
            raise SettingsError(
                "EVENT_SOURCE_MAPPING_ID", "is required (the writer's mapping UUID)"
            )
        if not _UUID.match(uuid):
            raise SettingsError("EVENT_SOURCE_MAPPING_ID", f"must be a mapping UUID, got {uuid!r}")
        return cls(writer=WriterSettings.from_env(env), mapping_uuid=uuid)


@dataclass(frozen=True)
class BreakerRun:
    """What one run saw and did (logged and turned into metrics by the handler)."""

    health: HealthCheck
    state_before: str
    decision: BreakerDecision
    state_after: str | None

    @property
    def changed(self) -> bool:
        """True when this run switched the mapping."""
        return self.decision.action != "none" and self.state_after is not None

    def as_dict(self) -> dict[str, object]:
        return {
            "healthy": self.health.healthy,
            "reason": self.decision.reason,
            "mapping_state_before": self.state_before,
            "action": self.decision.action,
            "mapping_state_after": self.state_after,
            "breaker_open": self.decision.breaker_open,
        }


def run_breaker(check: Callable[[], HealthCheck], switch: MappingSwitch) -> BreakerRun:
    """One breaker run: check the database, read the mapping, switch it if
    :func:`decide_breaker` says."""
    health = check()
    before = switch.state()
    decision = decide_breaker(health, before)
    after: str | None = before
    if decision.action != "none":
        after = switch.set_enabled(decision.action == "enable")
    return BreakerRun(health, before, decision, after)

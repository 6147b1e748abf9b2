"""When the local event source may receive: the mapping's Enabled state, or poll's own breaker.

Lambda's SQS event source stops polling while its event source mapping is disabled, and resumes
where it was when it is enabled again; nothing received means no receive count spent. The local
event source asks a :class:`ReceiveGate` before every ReceiveMessage:

* :class:`MappingGate` reads a real event source mapping through the Lambda API (moto's server
  over HTTP locally), so the deployed circuit breaker (``lambda_writer.breaker.circuit``) can be run
  against the local pipeline exactly as in AWS;
* :class:`HealthGate` is ``ckpt-pipeline poll``'s breaker in one process: after a batch with
  failed records it checks the database, and while the check fails it receives nothing, re-checking
  with exponential backoff, then resumes.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ckpt_pipeline.local.batch_response import BatchOutcome
from lambda_writer import HealthCheck, backoff_delay_s

logger = logging.getLogger(__name__)

# How often a closed gate re-reads the mapping's state (Lambda's pollers notice within seconds).
MAPPING_REFRESH_S = 0.5
_WAIT_SLICE_S = 0.2


class ReceiveGate(Protocol):
    """Asked before each receive, told after each invocation."""

    def wait_open(self, stop: threading.Event) -> bool:
        """Block while receiving is not allowed; False if ``stop`` was set meanwhile."""

    def record(self, outcome: BatchOutcome) -> None:
        """What the last invocation did (a gate may trip on failures)."""


class MappingGate:
    """Receive only while the event source mapping ``uuid`` is Enabled (GetEventSourceMapping)."""

    def __init__(self, lambda_client: Any, uuid: str, *, refresh_s: float = MAPPING_REFRESH_S):
        self._lambda = lambda_client
        self.uuid = uuid
        self._refresh_s = refresh_s
        self.paused = 0  # how many times a worker found the mapping disabled

    def enabled(self) -> bool:
        """Whether Lambda would be polling now."""
        state = self._lambda.get_event_source_mapping(UUID=self.uuid).get("State")
        return bool(state == "Enabled")

    def wait_open(self, stop: threading.Event) -> bool:
        if self.enabled():
            return True
        self.paused += 1
        logger.info("event source mapping %s is disabled: not polling", self.uuid)
        while not stop.wait(self._refresh_s):
            if self.enabled():
                logger.info("event source mapping %s is enabled: polling again", self.uuid)
                return True
        return False

    def record(self, outcome: BatchOutcome) -> None:
        return None  # Lambda's event source does not trip on failures; the breaker does


class HealthGate:
    """poll's circuit breaker: trip on failed records when the database check fails too.

    One worker probes (check, wait with backoff, check again); other workers wait for it.
    ``trips`` counts openings and ``checks_failed`` the failed checks, for poll's summary.
    """

    def __init__(
        self,
        check: Callable[[], HealthCheck],
        *,
        base_s: float = 1.0,
        cap_s: float = 30.0,
    ) -> None:
        self._check = check
        self._base_s = base_s
        self._cap_s = cap_s
        self._closed = threading.Event()  # set: receiving allowed
        self._closed.set()
        self._probe = threading.Lock()
        self._trip = threading.Lock()  # two workers failing at once trip the breaker once
        self.trips = 0
        self.checks_failed = 0

    @property
    def is_open(self) -> bool:
        """True while receiving is stopped."""
        return not self._closed.is_set()

    def record(self, outcome: BatchOutcome) -> None:
        if not outcome.failed:
            return
        with self._trip:
            if self.is_open:
                return
            health = self._check()
            if health.healthy:
                return
            self.checks_failed += 1
            self.trips += 1
            self._closed.clear()
            logger.warning(
                "database unreachable, stopped receiving (no receive counts spent meanwhile): %s",
                health.reason,
            )

    def wait_open(self, stop: threading.Event) -> bool:
        while not self._closed.is_set():
            if stop.is_set():
                return False
            if not self._probe.acquire(blocking=False):
                self._closed.wait(_WAIT_SLICE_S)  # another worker is probing
                continue
            try:
                return self._probe_until_healthy(stop)
            finally:
                self._probe.release()
        return not stop.is_set()

    def _probe_until_healthy(self, stop: threading.Event) -> bool:
        failed = 1
        while not self._closed.is_set():
            delay = backoff_delay_s(failed, base_s=self._base_s, cap_s=self._cap_s)
            if stop.wait(delay):
                return False
            health = self._check()
            if health.healthy:
                logger.warning("database reachable again, receiving resumes")
                self._closed.set()
                return True
            failed += 1
            self.checks_failed += 1
            logger.warning("database still unreachable (next check in %.0f s): %s",
                           backoff_delay_s(failed, base_s=self._base_s, cap_s=self._cap_s),
                           health.reason)  # fmt: skip
        return True


@dataclass(frozen=True)
class LocalMapping:
    """An event source mapping in the local Lambda API (moto), for the breaker to switch."""

    uuid: str
    arn: str
    function_name: str


def create_local_mapping(lambda_client: Any, sqs: Any, iam: Any, *, prefix: str) -> LocalMapping:
    """Create a stand-in writer function and its SQS event source mapping in moto's server.

    moto itself would consume a queue that has an enabled mapping (it invokes the function in
    Docker on every send), so the mapping names an anchor FIFO queue that nobody sends to; the
    local event source polls the real queue and only reads this mapping's State.
    """
    anchor_url = sqs.create_queue(
        QueueName=f"{prefix}-mapping-anchor.fifo", Attributes={"FifoQueue": "true"}
    )["QueueUrl"]
    anchor_arn = sqs.get_queue_attributes(QueueUrl=anchor_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "lambda.amazonaws.com"},
                "Action": "sts:AssumeRole",
            }
        ],
    }
    role = iam.create_role(RoleName=f"{prefix}-writer", AssumeRolePolicyDocument=json.dumps(trust))
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as archive:
        archive.writestr("stand_in.py", "def handler(event, context):\n    return None\n")
    name = f"{prefix}-writer"
    lambda_client.create_function(
        FunctionName=name,
        Runtime="python3.12",
        Role=role["Role"]["Arn"],
        Handler="stand_in.handler",
        Code={"ZipFile": code.getvalue()},
    )
    mapping = lambda_client.create_event_source_mapping(
        EventSourceArn=anchor_arn,
        FunctionName=name,
        BatchSize=10,
        FunctionResponseTypes=["ReportBatchItemFailures"],
    )
    return LocalMapping(mapping["UUID"], mapping["EventSourceMappingArn"], name)

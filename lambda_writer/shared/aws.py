"""Every AWS client the writer and the migrator make, with timeouts and retries inside the budget.

botocore's defaults are a 60 s connect and a 60 s read timeout per attempt, several attempts
(https://botocore.amazonaws.com/v1/documentation/api/latest/reference/config.html): one stalled
``SendMessageBatch`` alone would outlive the writer's 30 s timeout, the invocation would be killed
mid-batch and the whole batch redelivered. Each function gets one :class:`ClientBudget` whose
worst case (every attempt timing out, plus standard mode's backoff) fits in its timeout next to
the database's own connect timeout; ``tests/lambda_writer/test_units.py`` checks the sums.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

# Standard retry mode sleeps ``random() * 2**(attempt - 1)`` seconds, capped at 20 s, before
# retry ``attempt`` (https://docs.aws.amazon.com/sdkref/latest/guide/feature-retry-behavior.html).
_MAX_BACKOFF_S = 20.0


@dataclass(frozen=True)
class ClientBudget:
    """botocore timeouts and retries for one function's clients (``total`` includes the first)."""

    connect_timeout_s: float
    read_timeout_s: float
    total_max_attempts: int

    def worst_case_s(self) -> float:
        """Longest one API call can take: every attempt times out, every backoff is maximal."""
        attempts = self.total_max_attempts * (self.connect_timeout_s + self.read_timeout_s)
        backoff = sum(
            min(2.0 ** (n - 1), _MAX_BACKOFF_S) for n in range(1, self.total_max_attempts)
        )
        return attempts + backoff

    def config(self) -> Any:
        """The ``botocore.config.Config`` (standard mode: retries throttling and 5xx, not 4xx)."""
        from botocore.config import Config

        return Config(
            connect_timeout=self.connect_timeout_s,
            read_timeout=self.read_timeout_s,
            retries={"total_max_attempts": self.total_max_attempts, "mode": "standard"},
        )


# The writer (30 s, lambda_writer.shared.constants.WRITER_TIMEOUT_S) may, in one invocation, read
# the DB secret, connect to the database (connection.CONNECT_TIMEOUT_S) and send to the DLQ: 2 × 9 s
# + 5 s leaves 7 s for the batch itself. SQS and Secrets Manager answer in milliseconds when
# healthy, so 2 s per read is generous; a second attempt covers one dropped connection or throttle.
WRITER_BUDGET = ClientBudget(connect_timeout_s=2.0, read_timeout_s=2.0, total_max_attempts=2)
# The migrator (300 s, infra.constants.MIGRATION_TIMEOUT_S) reads two secrets (the master's and
# the writer's) and may spend minutes retrying its direct connection while a new instance's network
# settles (migrate_handler._connect_when_ready): its calls may take longer and retry more.
MIGRATION_BUDGET = ClientBudget(connect_timeout_s=5.0, read_timeout_s=10.0, total_max_attempts=3)


def client(service: str, *, region: str | None, budget: ClientBudget = WRITER_BUDGET) -> Any:
    """A boto3 client for ``service`` with ``budget``'s timeouts (AWS_ENDPOINT_URL honoured)."""
    import boto3  # deferred: the handler's import does not pay for boto3 (see bench.cold_start)

    if "aws_xray_sdk.core" in sys.modules:
        # The handler's Tracer is live (X-Ray active tracing in Lambda): trace AWS calls as
        # subsegments. Patched here, not at init, so the handler's import stays free of botocore;
        # patching twice is a no-op in the SDK.
        from aws_xray_sdk.core import patch  # type: ignore[import-untyped]

        patch(("botocore",))
    return boto3.client(service, region_name=region, config=budget.config())


def rds_auth_token(*, host: str, port: int, user: str, region: str) -> str:
    """The RDS IAM auth token ``boto3.client("rds").generate_db_auth_token`` makes, clientless.

    The token is a SigV4-presigned ``connect`` URL, signed locally with the function's
    credentials (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/UsingWithRDS.IAMDBAuth.Connecting.html).
    An RDS client would first load botocore's RDS service model and endpoint rules, which the
    signature never reads: on the writer's first connect that client is most of the cost
    (``bench.cold_start``, "IAM token"). botocore's own function signs, so the token is the same
    (``tests/lambda_writer/test_units.py`` compares them byte for byte).
    """
    from botocore.exceptions import NoCredentialsError
    from botocore.model import ServiceId
    from botocore.session import get_session
    from botocore.signers import RequestSigner, generate_db_auth_token

    session = get_session()
    credentials = session.get_credentials()
    if credentials is None:
        raise NoCredentialsError()
    signer = RequestSigner(
        ServiceId("rds"),
        region,
        "rds-db",
        "v4",
        credentials,
        session.get_component("event_emitter"),
    )
    # generate_db_auth_token is a client method; it reads only these two attributes of its client.
    shim = SimpleNamespace(meta=SimpleNamespace(region_name=region), _request_signer=signer)
    token: str = generate_db_auth_token(shim, host, port, user, Region=region)
    return token

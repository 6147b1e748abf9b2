"""Pure sending decisions: which failures are transient, and how long to back off."""

from __future__ import annotations

import enum
import random
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
)


class Failure(enum.Enum):
    """How a failed SendMessageBatch call is treated; every kind is retried, none is dropped."""

    THROTTLED = "throttled"  # SQS asked us to slow down
    UNREACHABLE = "unreachable"  # network, DNS, timeouts, 5xx
    CONFIGURATION = "configuration"  # credentials, permissions, missing queue: an operator fixes it


_THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "SlowDown",
        "RequestLimitExceeded",
    }
)


def classify(exc: BaseException) -> Failure:
    """The kind of a whole-call failure of SendMessageBatch."""
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in _THROTTLING_CODES or status == 429:
            return Failure.THROTTLED
        if status >= 500 or code in ("InternalError", "ServiceUnavailable", "InternalFailure"):
            return Failure.UNREACHABLE
        return Failure.CONFIGURATION
    if isinstance(exc, NoCredentialsError):
        return Failure.CONFIGURATION
    if isinstance(exc, EndpointConnectionError | ConnectionError | HTTPClientError | OSError):
        return Failure.UNREACHABLE
    if isinstance(exc, BotoCoreError):
        return Failure.UNREACHABLE
    return Failure.CONFIGURATION


def backoff_delay(attempt: int, *, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Exponential backoff with "equal jitter": uniform(c/2, c), c = min(cap, base * 2**attempt).

    The jitter spreads the retries of thousands of ranks after a shared outage
    (https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/); the floor of
    c/2 keeps a backoff a backoff (full jitter may retry at once after any number of failures),
    so a configured delay means at least half of it.
    """
    ceiling = min(cap_s, base_s * (2 ** min(attempt, 32)))
    return rng.uniform(ceiling / 2, ceiling)


def split_results(response: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """Ids of the successful entries and the ``Failed`` entries of a SendMessageBatch response."""
    ok = [str(entry["Id"]) for entry in response.get("Successful", [])]
    return ok, list(response.get("Failed", []))

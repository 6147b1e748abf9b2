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
    # Any other 4xx of the whole call: the request itself was refused, which may be one entry's
    # doing (moto and SQS validate every entry before sending any: one too-long body refuses all
    # ten). The sender splits the batch to find it instead of retrying all ten forever.
    REFUSED = "refused"


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


# Whole-call codes that say nothing about the entries: who calls, with what rights, into which
# queue (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/CommonErrors.html,
# .../API_SendMessageBatch.html#API_SendMessageBatch_Errors, and the KMS.* codes SQS passes on).
_CONFIGURATION_CODES = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "IncompleteSignature",
        "InvalidClientTokenId",
        "InvalidSecurity",
        "MissingAuthenticationToken",
        "NotAuthorized",
        "OptInRequired",
        "RequestExpired",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "UnrecognizedClientException",
        "QueueDoesNotExist",
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDeletedRecently",
        "AWS.SimpleQueueService.QueueDeletedRecently",
        "InvalidAddress",
        "UnsupportedOperation",
        "AWS.SimpleQueueService.UnsupportedOperation",
    }
)
# Whole-call codes that can only come from what an entry holds: an entry refused alone with one
# of these is that entry's fault even before SQS has accepted anything from this sender. Not
# InvalidParameterValue: a queue of the wrong type (a dedup id sent to a standard queue) refuses
# every entry with it, and that is the operator's to fix, not a reason to set reports aside.
ENTRY_CODES = frozenset(
    {
        "InvalidMessageContents",
        "MessageTooLong",
        "BatchRequestTooLong",
        "AWS.SimpleQueueService.BatchRequestTooLong",
    }
)


def error_code(exc: BaseException) -> str:
    """The AWS error code of a ClientError ("" for anything else)."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def classify_failure(exc: BaseException) -> Failure:
    """The kind of a whole-call failure of SendMessageBatch."""
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in _THROTTLING_CODES or status == 429:
            return Failure.THROTTLED
        if status >= 500 or code in ("InternalError", "ServiceUnavailable", "InternalFailure"):
            return Failure.UNREACHABLE
        if code in _CONFIGURATION_CODES or code.startswith("KMS.") or status in (401, 403):
            return Failure.CONFIGURATION
        return Failure.REFUSED
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

"""The Lambda context object the local event source hands to the handler."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from lambda_writer.shared import constants

LOCAL_FUNCTION_NAME = "ckpt-writer-local"
LOCAL_MEMORY_MB = 256


@dataclass(frozen=True)
class LocalLambdaContext:
    """The attributes of Lambda's Python context object that the handler and Powertools read.

    https://docs.aws.amazon.com/lambda/latest/dg/python-context.html
    """

    function_name: str = LOCAL_FUNCTION_NAME
    function_version: str = "$LATEST"
    invoked_function_arn: str = (
        f"arn:aws:lambda:us-east-1:000000000000:function:{LOCAL_FUNCTION_NAME}"
    )
    memory_limit_in_mb: int = LOCAL_MEMORY_MB
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    log_group_name: str = f"/aws/lambda/{LOCAL_FUNCTION_NAME}"
    log_stream_name: str = "local"
    timeout_s: float = constants.WRITER_TIMEOUT_S
    started_monotonic: float = field(default_factory=time.monotonic)

    @property
    def deadline_monotonic(self) -> float:
        return self.started_monotonic + self.timeout_s

    def get_remaining_time_in_millis(self) -> int:
        """Milliseconds left before the (local) function timeout, never negative."""
        return max(0, int((self.deadline_monotonic - time.monotonic()) * 1000))


def context_for(
    *, timeout_s: float, function_name: str = LOCAL_FUNCTION_NAME, region: str = "us-east-1"
) -> LocalLambdaContext:
    """A fresh context (new request id, clock started now) for one invocation."""
    return LocalLambdaContext(
        function_name=function_name,
        invoked_function_arn=f"arn:aws:lambda:{region}:000000000000:function:{function_name}",
        log_group_name=f"/aws/lambda/{function_name}",
        timeout_s=timeout_s,
    )

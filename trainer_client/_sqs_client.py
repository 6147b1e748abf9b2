"""The reporter's own SQS client: boto3's, with our timeouts and no retries of its own."""

from __future__ import annotations

from typing import Any

from trainer_client.config import ReporterConfig
from trainer_client.exceptions import ReporterConfigError


def build_sqs_client(config: ReporterConfig) -> Any:
    """An SQS client for ``config`` (region, endpoint, timeouts); the sender owns retries."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import NoRegionError

    t = config.tuning
    botocore_config = Config(
        connect_timeout=t.connect_timeout_s,
        read_timeout=t.read_timeout_s,
        # One attempt per call: our sender owns retries and backoff, so deadlines hold.
        retries={"total_max_attempts": 1, "mode": "standard"},
        # The sender builds every entry itself from validated reports; botocore's client-side
        # walk of the request shape was CPU the sender held the GIL for on every call (SQS
        # still validates the request server-side).
        parameter_validation=False,
    )
    try:
        return boto3.session.Session().client(
            "sqs",
            region_name=config.region,
            endpoint_url=config.endpoint_url,
            config=botocore_config,
        )
    except NoRegionError:
        raise ReporterConfigError(
            "region",
            "no AWS region: set AWS_DEFAULT_REGION (or AWS_REGION) or pass region= (or use an"
            " sqs.<region> queue URL)",
        ) from None

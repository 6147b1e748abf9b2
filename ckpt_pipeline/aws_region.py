"""The AWS Region the operator tools use: the one ``cdk deploy`` would deploy to.

boto3 (botocore) reads ``AWS_DEFAULT_REGION`` and the profile's ``region`` only; the CDK CLI (the
AWS SDK for JavaScript's order) reads ``AWS_REGION`` first, then ``AWS_DEFAULT_REGION``, then the
profile. Lambda, EKS pod identity and most shells set ``AWS_REGION``. So the tools take
``AWS_REGION`` when it is set and otherwise boto3's own resolution (a Session's ``region_name``:
``AWS_DEFAULT_REGION``, ``AWS_PROFILE``'s ``region``), which is the CDK CLI's order; two
variables that disagree are refused, since boto3 and the CDK would then each pick another one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ckpt_pipeline.exceptions import ConfigError

REGION_VAR = "AWS_REGION"
DEFAULT_REGION_VAR = "AWS_DEFAULT_REGION"


def resolve_region(env: Mapping[str, str] | None = None) -> str | None:
    """The Region from ``AWS_REGION``, else boto3's Session (env, profile); None when neither."""
    import boto3

    source = os.environ if env is None else env
    explicit = (source.get(REGION_VAR) or "").strip()
    default = (source.get(DEFAULT_REGION_VAR) or "").strip()
    if explicit and default and explicit != default:
        raise ConfigError(
            REGION_VAR,
            f"is {explicit!r} but {DEFAULT_REGION_VAR} is {default!r}: the CDK CLI would use the"
            f" first and boto3 the second; unset one or make them equal",
        )
    if explicit:
        return explicit
    region = boto3.session.Session().region_name
    return str(region) if region else None


def require_region(env: Mapping[str, str] | None = None, *, because: str) -> str:
    """:func:`resolve_region`, or a ConfigError naming where a Region is read from."""
    region = resolve_region(env)
    if region is None:
        raise ConfigError(
            REGION_VAR,
            f"is not set, nor {DEFAULT_REGION_VAR}, nor a region in the AWS profile ({because})",
        )
    return region

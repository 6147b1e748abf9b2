"""Argument rules the commands share: ranges, and the job id as the contract allows it."""

from __future__ import annotations

import argparse
import re

from ckpt_contract.message import JOB_ID_PATTERN
from ckpt_pipeline.exceptions import ConfigError


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a number of 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def check_job(job_id: str, *, option: str = "--job") -> str:
    """``job_id`` if a ckpt.v1 report can carry it, else a ConfigError naming the option."""
    if not re.match(JOB_ID_PATTERN, job_id):
        raise ConfigError(option, f"must be 1-128 chars of [A-Za-z0-9._:-] (got {job_id!r})")
    return job_id

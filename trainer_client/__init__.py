"""The training loop's client: ``CheckpointReporter`` spools reports durably, sends them to SQS."""

from __future__ import annotations

import logging

from ckpt_contract import InvalidMessage, MessageTooLarge
from trainer_client.exceptions import (
    ReporterClosed,
    ReporterConfigError,
    ReporterError,
    SpoolFull,
    SpoolLocked,
    SpoolUnwritable,
)
from trainer_client.reporter import CheckpointReporter, ReporterStats

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "CheckpointReporter",
    "InvalidMessage",
    "MessageTooLarge",
    "ReporterClosed",
    "ReporterConfigError",
    "ReporterError",
    "ReporterStats",
    "SpoolFull",
    "SpoolLocked",
    "SpoolUnwritable",
]

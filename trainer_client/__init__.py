"""The training loop's client: ``CheckpointReporter`` spools reports durably, sends them to SQS."""

from __future__ import annotations

import logging

from ckpt_contract import InvalidMessage, MessageTooLarge
from trainer_client.exceptions import (
    DropCheckpoint,
    FinishDeferred,
    ReporterClosed,
    ReporterConfigError,
    ReporterError,
    SpoolFull,
    SpoolLocked,
    SpoolUnwritable,
)
from trainer_client.finish.finish_job import PostStepCall
from trainer_client.finish.finisher import FinishOutcome
from trainer_client.finish.post_step import FinishingJob, PostStep
from trainer_client.report.reporter import CheckpointReporter, ReporterStats

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "CheckpointReporter",
    "DropCheckpoint",
    "FinishDeferred",
    "FinishOutcome",
    "FinishingJob",
    "InvalidMessage",
    "MessageTooLarge",
    "PostStep",
    "PostStepCall",
    "ReporterClosed",
    "ReporterConfigError",
    "ReporterError",
    "ReporterStats",
    "SpoolFull",
    "SpoolLocked",
    "SpoolUnwritable",
]

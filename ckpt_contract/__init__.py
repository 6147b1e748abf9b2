"""The ``ckpt.v1`` message contract: the only code shared by the trainer client and the writer."""

from __future__ import annotations

from ckpt_contract.exceptions import ContractError, FieldError, InvalidMessage, MessageTooLarge
from ckpt_contract.message import (
    MAX_BODY_BYTES,
    MAX_METRICS,
    SCHEMA,
    CheckpointReport,
    decode,
    dedup_id,
    encode,
    group_id,
)

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_METRICS",
    "SCHEMA",
    "CheckpointReport",
    "ContractError",
    "FieldError",
    "InvalidMessage",
    "MessageTooLarge",
    "decode",
    "dedup_id",
    "encode",
    "group_id",
]

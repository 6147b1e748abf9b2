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
from ckpt_contract.objects import MAX_OBJECTS, StoredObject

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_METRICS",
    "MAX_OBJECTS",
    "SCHEMA",
    "CheckpointReport",
    "ContractError",
    "FieldError",
    "InvalidMessage",
    "MessageTooLarge",
    "StoredObject",
    "decode",
    "dedup_id",
    "encode",
    "group_id",
]

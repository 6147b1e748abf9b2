"""The ``ckpt.pack.v1`` body: the reports of several ranks (one node's) in one SQS message.

``{"schema": "ckpt.pack.v1", "reports": [<ckpt.v1 report>, ...]}``: each member is a whole
``ckpt.v1`` report object, validated on its own by the writer (docs/DESIGN.md, "The intake at
100,000 ranks: reports packed per node"). A pack is built from already-encoded report bodies,
spliced as they are (each is a JSON object), so packing re-encodes nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Final

from ckpt_contract.exceptions import FieldError, InvalidMessage, MessageTooLarge

PACK_SCHEMA: Final = "ckpt.pack.v1"
# SQS's message size: 256 KiB in the older quota pages, 1 MiB today; packs keep to the older
# figure so that they fit every Region's queue
# (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html).
MAX_PACK_BYTES = 256 * 1024
MAX_PACK_REPORTS = 1000
_HEAD = '{"schema":"' + PACK_SCHEMA + '","reports":['
_TAIL = "]}"
OVERHEAD_BYTES = len(_HEAD) + len(_TAIL)
# A pack is told from a ckpt.v1 body by its schema near the start (both are JSON objects whose
# first key is "schema" when encoded here; anything else is parsed to be sure).
_SNIFF_CHARS = 64


def encode_pack(bodies: Sequence[str]) -> str:
    """One pack of ``bodies`` (encoded ckpt.v1 reports); raises :class:`MessageTooLarge`."""
    if not 1 <= len(bodies) <= MAX_PACK_REPORTS:
        raise InvalidMessage(
            [
                FieldError(
                    "reports", f"a pack holds 1..{MAX_PACK_REPORTS} reports, got {len(bodies)}"
                )
            ]
        )
    body = _HEAD + ",".join(bodies) + _TAIL
    size = len(body.encode())
    if size > MAX_PACK_BYTES:
        raise MessageTooLarge(
            [FieldError("<body>", f"pack size {size} B exceeds the limit of {MAX_PACK_BYTES} B")]
        )
    return body


def pack_size(body_bytes: int, reports: int) -> int:
    """Bytes of a pack of ``reports`` bodies totalling ``body_bytes`` (UTF-8)."""
    return OVERHEAD_BYTES + body_bytes + max(0, reports - 1)


def split_pack(body: str) -> list[str] | None:
    """The member bodies of a pack, None when ``body`` is not a pack (a ckpt.v1 report, or
    anything else the single-report decoder judges); raises :class:`InvalidMessage` for a body
    that names the pack schema but is not a well-formed pack (the whole message is poison)."""
    if PACK_SCHEMA not in body[:_SNIFF_CHARS]:
        return None
    if len(body.encode()) > MAX_PACK_BYTES:
        raise MessageTooLarge(
            [FieldError("<body>", f"pack size exceeds the limit of {MAX_PACK_BYTES} B")]
        )
    try:
        value = json.loads(body)
    except ValueError:
        raise InvalidMessage([FieldError("<body>", "not valid JSON")]) from None
    if not isinstance(value, dict) or value.get("schema") != PACK_SCHEMA:
        return None
    reports = value.get("reports")
    if not isinstance(reports, list) or not 1 <= len(reports) <= MAX_PACK_REPORTS:
        raise InvalidMessage(
            [FieldError("reports", f"must be a list of 1..{MAX_PACK_REPORTS} report objects")]
        )
    return [json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in reports]


def pack_dedup_id(member_dedup_ids: Sequence[str]) -> str:
    """The pack's SQS deduplication id: the same members give the same id (≤ 128 chars)."""
    digest = hashlib.sha256("\n".join(sorted(member_dedup_ids)).encode()).hexdigest()
    return f"pack-{digest}"

"""Pure record framing of the spool files: magic, length, sequence number, CRC32, payload.

Payloads are UTF-8 (JSON bodies or empty), and the magic starts with 0xFF, a byte that never
occurs in UTF-8: after a corrupt region, scanning for the magic cannot resynchronise inside a
payload, so recovery after a torn write yields exactly the records that were fully written.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

MAGIC = b"\xff\xa7"
_FIELDS = struct.Struct("<IQ")  # payload length, sequence number
_CRC = struct.Struct("<I")
HEADER_BYTES = len(MAGIC) + _FIELDS.size + _CRC.size
# Far above the contract's 64 KiB body cap; a larger length field is corruption, not a record.
MAX_PAYLOAD_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Record:
    """One framed record as found in a file: its sequence number, payload and position."""

    seq: int
    payload: bytes
    offset: int
    size: int


@dataclass(frozen=True)
class Scan:
    """The outcome of reading a spool file: valid records and how much was skipped."""

    records: list[Record]
    skipped_bytes: int
    corrupt_regions: int


def frame(seq: int, payload: bytes) -> bytes:
    """One record: ``MAGIC | len | seq | crc32(len|seq|payload) | payload``."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"payload of {len(payload)} B exceeds {MAX_PAYLOAD_BYTES} B")
    fields = _FIELDS.pack(len(payload), seq)
    crc = zlib.crc32(payload, zlib.crc32(fields))
    return MAGIC + fields + _CRC.pack(crc) + payload


def _record_at(buf: bytes, pos: int) -> Record | None:
    if buf[pos : pos + len(MAGIC)] != MAGIC or pos + HEADER_BYTES > len(buf):
        return None
    fields_at = pos + len(MAGIC)
    length, seq = _FIELDS.unpack_from(buf, fields_at)
    if length > MAX_PAYLOAD_BYTES or pos + HEADER_BYTES + length > len(buf):
        return None
    (crc,) = _CRC.unpack_from(buf, fields_at + _FIELDS.size)
    payload = buf[pos + HEADER_BYTES : pos + HEADER_BYTES + length]
    if zlib.crc32(payload, zlib.crc32(buf[fields_at : fields_at + _FIELDS.size])) != crc:
        return None
    return Record(seq, payload, pos, HEADER_BYTES + length)


def scan(buf: bytes) -> Scan:
    """Every intact record of ``buf`` in order; torn or corrupt bytes are skipped, never fatal."""
    records: list[Record] = []
    skipped = regions = 0
    pos = 0
    while pos < len(buf):
        record = _record_at(buf, pos)
        if record is not None:
            records.append(record)
            pos += record.size
            continue
        nxt = buf.find(MAGIC, pos + 1)
        end = len(buf) if nxt < 0 else nxt
        skipped += end - pos
        regions += 1
        pos = end
    return Scan(records, skipped, regions)

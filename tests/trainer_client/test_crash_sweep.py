"""Crash consistency of the spool file: cut it at every byte offset of its last records, and flip
each of their bytes; a reopen recovers exactly the records wholly written, and never garbage.

After LevelDB/RocksDB's log format (a CRC per record, recovery that skips a torn tail).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from trainer_client.report.spool import Spool

RECORDS = 8
SWEPT = 3  # the last records, whose every byte is cut and flipped


def _open(directory: Path) -> Spool:
    return Spool(directory, 0, max_bytes=1 << 20, max_records=1000, compact_threshold_bytes=1 << 20)


def _written(tmp_path: Path) -> tuple[bytes, list[tuple[int, int, str]]]:
    spool = _open(tmp_path / "orig")
    bodies = [json.dumps({"n": n, "uri": f"s3://b/{n}" + "é" * n}) for n in range(RECORDS)]
    for body in bodies:
        spool.append(body)
    ends = [offset + size for offset, size in spool._pending.values()]
    spool.close()
    data = spool.path.read_bytes()
    return data, [(seq, ends[seq], bodies[seq]) for seq in range(RECORDS)]


def _recovered(tmp_path: Path, data: bytes) -> list[tuple[int, str]]:
    case = tmp_path / "case"
    shutil.rmtree(case, ignore_errors=True)
    case.mkdir()
    (case / "rank-0.spool").write_bytes(data)
    spool = _open(case)
    try:
        return [(r.seq, r.body) for r in spool.peek(1000)]
    finally:
        spool.close()


def test_cut_at_every_offset_recovers_exactly_the_complete_records(tmp_path: Path) -> None:
    data, records = _written(tmp_path)
    first_swept_start = records[RECORDS - SWEPT - 1][1]
    for cut in range(first_swept_start, len(data) + 1):
        expected = [(seq, body) for seq, end, body in records if end <= cut]
        assert _recovered(tmp_path, data[:cut]) == expected, f"cut at byte {cut}"


def test_a_flipped_byte_loses_only_its_own_record(tmp_path: Path) -> None:
    data, records = _written(tmp_path)
    starts = [0] + [end for _, end, _ in records[:-1]]
    for pos in range(starts[RECORDS - SWEPT], len(data)):
        hit = next(seq for seq, end, _ in records if pos < end)
        damaged = bytearray(data)
        damaged[pos] ^= 0x5A
        expected = [(seq, body) for seq, _, body in records if seq != hit]
        assert _recovered(tmp_path, bytes(damaged)) == expected, f"flip at byte {pos}"

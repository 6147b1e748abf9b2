"""The spool on a real filesystem: torn tails, compaction, bounds, one owner per job/rank."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.trainer_client.helpers import read_line, start_child
from trainer_client.exceptions import SpoolFull, SpoolLocked
from trainer_client.report.spool import Spool


def _spool(
    path: Path,
    *,
    max_bytes: int = 1 << 20,
    max_records: int = 1000,
    compact_threshold_bytes: int = 1 << 20,
) -> Spool:
    return Spool(
        path,
        0,
        max_bytes=max_bytes,
        max_records=max_records,
        compact_threshold_bytes=compact_threshold_bytes,
    )


def test_torn_tail_is_skipped_and_valid_records_kept(tmp_path: Path) -> None:
    # GIVEN three durable records, then a crash that left garbage / half a record at the end
    spool = _spool(tmp_path)
    for i in range(3):
        spool.append(f'{{"n": {i}}}')
    spool.close()
    with spool.path.open("ab") as f:
        f.write(b"\xff\xa7\x10\x00\x00garbage-from-a-torn-write")
    # WHEN the spool is reopened
    reopened = _spool(tmp_path)
    # THEN the valid records are pending, in order, and the file is clean for new appends
    assert [r.body for r in reopened.peek(10)] == ['{"n": 0}', '{"n": 1}', '{"n": 2}']
    seq = reopened.append('{"n": 3}')
    assert seq == 3
    reopened.close()
    again = _spool(tmp_path)
    assert [r.seq for r in again.peek(10)] == [0, 1, 2, 3]
    again.close()


def test_acks_survive_reopen_and_compaction_shrinks_the_file(tmp_path: Path) -> None:
    spool = _spool(tmp_path, compact_threshold_bytes=200)
    for i in range(10):
        spool.append(f'{{"n": {i}, "pad": "{"x" * 40}"}}')
    size_before = spool.path.stat().st_size
    spool.ack([0, 1, 2, 3, 4, 5])
    assert spool.path.stat().st_size < size_before  # compacted past the threshold
    spool.ack([6])
    spool.close()
    reopened = _spool(tmp_path)
    assert [r.seq for r in reopened.peek(10)] == [7, 8, 9]
    assert reopened.ack_path.stat().st_size == 0  # compacted at open
    assert reopened.append("{}") == 10  # sequence numbers never go backwards
    reopened.close()


def test_bounds_raise_spool_full_and_leave_the_spool_unchanged(tmp_path: Path) -> None:
    spool = _spool(tmp_path, max_records=2)
    spool.append("{}")
    spool.append("{}")
    size = spool.path.stat().st_size
    with pytest.raises(SpoolFull, match="max_pending_records"):
        spool.append("{}")
    assert spool.path.stat().st_size == size
    spool.ack([0])
    spool.append("{}")  # room again once SQS acknowledged
    spool.close()
    small = _spool(tmp_path / "b", max_bytes=100)
    with pytest.raises(SpoolFull, match="max_spool_bytes"):
        small.append("x" * 200)
    small.close()


def test_second_owner_in_another_live_process_is_refused_then_takes_over_after_sigkill(
    tmp_path: Path,
) -> None:
    child = start_child(
        "import sys, time; from pathlib import Path\n"
        "from trainer_client.report.spool import Spool\n"
        f"s = Spool(Path({str(tmp_path)!r}), 0, max_bytes=1 << 20, max_records=10,"
        " compact_threshold_bytes=1 << 20)\n"
        "s.append('{\"from\": \"child\"}'); print('ready', flush=True); time.sleep(60)\n"
    )
    try:
        assert read_line(child) == "ready"
        with pytest.raises(SpoolLocked, match=f"pid {child.pid}"):
            _spool(tmp_path)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    # The kernel released the flock with the process: a new owner takes the spool over.
    spool = _spool(tmp_path)
    assert [r.body for r in spool.peek(10)] == ['{"from": "child"}']
    spool.close()


def test_memory_holds_an_index_not_the_bodies(tmp_path: Path) -> None:
    spool = _spool(tmp_path)
    for _ in range(50):
        spool.append("{" + '"pad": "' + "y" * 1000 + '"}')
    # Bodies are re-read from disk on demand; only (offset, size) pairs stay in memory.
    assert all(isinstance(v, tuple) and len(v) == 2 for v in spool._pending.values())
    assert len(spool.peek(10)) == 10
    spool.close()


def test_the_step_given_at_append_comes_back_with_peek_not_after_reopen(tmp_path: Path) -> None:
    # GIVEN one record appended with its step, one without
    spool = _spool(tmp_path)
    first = spool.append('{"n": 0}', step=7)
    second = spool.append('{"n": 1}')
    # THEN peek returns the step the appender gave, and None where it gave none
    assert [(r.seq, r.step) for r in spool.peek(10)] == [(first, 7), (second, None)]
    spool.close()
    # AND after a restart (steps live in memory only) both are pending without, to be decoded
    reopened = _spool(tmp_path)
    assert [(r.body, r.step) for r in reopened.peek(10)] == [
        ('{"n": 0}', None),
        ('{"n": 1}', None),
    ]
    reopened.close()

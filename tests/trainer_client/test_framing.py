"""Spool framing: any truncation or appended garbage recovers exactly a prefix of the records."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_client.report._framing import HEADER_BYTES, frame, scan

bodies = st.lists(st.text(max_size=200), max_size=12)


def _written(texts: list[str]) -> tuple[bytes, list[tuple[int, bytes]]]:
    records = [(seq, t.encode()) for seq, t in enumerate(texts)]
    return b"".join(frame(seq, payload) for seq, payload in records), records


@settings(max_examples=300, deadline=None)
@given(texts=bodies, data=st.data())
def test_any_truncation_recovers_a_prefix(texts: list[str], data: st.DataObject) -> None:
    # GIVEN records written back to back, WHEN the file is cut anywhere (a crash mid-write)
    blob, records = _written(texts)
    cut = data.draw(st.integers(min_value=0, max_value=len(blob)))
    result = scan(blob[:cut])
    # THEN what is read back is exactly the records that fit entirely before the cut
    recovered = [(r.seq, r.payload) for r in result.records]
    assert recovered == records[: len(recovered)]
    whole = sum(1 for end in _ends(blob, records) if end <= cut)
    assert len(recovered) == whole


def _ends(blob: bytes, records: list[tuple[int, bytes]]) -> list[int]:
    ends, pos = [], 0
    for _seq, payload in records:
        pos += HEADER_BYTES + len(payload)
        ends.append(pos)
    return ends


@settings(max_examples=200, deadline=None)
@given(texts=bodies, garbage=st.binary(min_size=1, max_size=300))
def test_garbage_after_valid_records_is_skipped(texts: list[str], garbage: bytes) -> None:
    blob, records = _written(texts)
    result = scan(blob + garbage)
    assert [(r.seq, r.payload) for r in result.records][: len(records)] == records


def test_corrupt_record_in_the_middle_is_skipped_and_later_ones_kept() -> None:
    blob, _ = _written(["one", "two", "three"])
    second = HEADER_BYTES + 3
    damaged = bytearray(blob)
    damaged[second + HEADER_BYTES] ^= 0x01  # flip a payload bit of "two"
    result = scan(bytes(damaged))
    assert [r.payload for r in result.records] == [b"one", b"three"]
    assert result.corrupt_regions == 1
    assert result.skipped_bytes == HEADER_BYTES + 3


def test_backoff_keeps_at_least_half_its_ceiling_and_never_exceeds_the_cap() -> None:
    import random

    from trainer_client.report._retry import backoff_delay

    rng = random.Random(0)
    for attempt in range(40):
        ceiling = min(600.0, 0.2 * 2**attempt)
        delays = [backoff_delay(attempt, base_s=0.2, cap_s=600.0, rng=rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
    assert backoff_delay(0, base_s=600, cap_s=600, rng=rng) >= 300

"""The intake model's arithmetic: the quotas bound each design where the AWS pages say."""

from __future__ import annotations

import pytest

from bench import intake_model
from bench._intake_model import (
    DESIGNS,
    FIFO_MAX_BATCH,
    INVOKE_PAYLOAD_BYTES,
    Assumptions,
    drain,
)

PER_RANK_HT, PACKED_FIFO, PER_RANK_STD, PACKED_STD = DESIGNS[1], DESIGNS[2], DESIGNS[3], DESIGNS[4]


def test_fifo_invocations_carry_ten_messages_and_a_pack_carries_a_node() -> None:
    a = Assumptions()
    per_rank, packed = drain(PER_RANK_HT, 100_000, a), drain(PACKED_FIFO, 100_000, a)
    assert (per_rank.messages, per_rank.invocations) == (100_000, 100_000 // FIFO_MAX_BATCH)
    assert packed.messages == 100_000 // a.ranks_per_pack
    assert packed.per_invocation == FIFO_MAX_BATCH and packed.fits
    assert packed.seconds < per_rank.seconds / 5


def test_a_standard_batch_is_capped_by_the_invocation_payload() -> None:
    a = Assumptions()
    d = drain(PER_RANK_STD, 100_000, a)
    assert d.per_invocation * (a.body_bytes + a.envelope_bytes) <= INVOKE_PAYLOAD_BYTES
    assert d.limit == "SQS receive/delete" and d.seconds > d.parts["writers"]
    assert drain(PACKED_STD, 100_000, a).seconds < d.seconds


def test_a_pack_beyond_the_message_size_does_not_fit() -> None:
    assert not drain(PACKED_FIFO, 1000, Assumptions(ranks_per_pack=1000)).fits


def test_the_bench_prints_the_table_and_meets_the_goal(capsys: pytest.CaptureFixture[str]) -> None:
    assert intake_model.main(["--ranks", "1000", "100000", "--ranks-per-pack", "16"]) == 0
    out = capsys.readouterr().out
    assert "assumptions" in out and "packed per node, FIFO" in out
    assert intake_model.main(["--ranks", "100000", "--invoke-ms", "200", "--pollers", "1"]) == 1

"""The intake model's arithmetic: the quotas bound each design where the AWS pages say."""

from __future__ import annotations

import pytest

from bench import intake_model
from bench.intake_model import (
    FIFO_MAX_BATCH,
    INVOKE_PAYLOAD_BYTES,
    NODE_RANKS,
    Assumptions,
    designs,
    drain,
    sample_bodies,
)
from ckpt_contract.pack import MAX_PACK_BYTES, pack_size
from trainer_client.report.pack_relay import DEFAULT_MAX_REPORTS

_, PER_RANK_HT, PACKED_NODE, PACKED_FIFO, PER_RANK_STD, PACKED_STD = designs(Assumptions())


def test_fifo_invocations_carry_ten_messages_and_a_pack_carries_its_ranks() -> None:
    a = Assumptions()
    per_rank, packed = drain(PER_RANK_HT, 100_000, a), drain(PACKED_FIFO, 100_000, a)
    assert (per_rank.messages, per_rank.invocations) == (100_000, 100_000 // FIFO_MAX_BATCH)
    assert packed.messages == 100_000 // a.ranks_per_pack
    assert packed.per_invocation == FIFO_MAX_BATCH and packed.fits
    assert packed.seconds < per_rank.seconds / 5
    assert drain(PACKED_NODE, 100_000, a).messages == 100_000 // NODE_RANKS


def test_the_model_packs_what_the_relay_packs_and_meets_the_goal_with_it() -> None:
    # GIVEN the model's default pack WHEN it drains 100,000 ranks THEN it is the relay's own cap,
    # within 15 s; one node's 8 alone would not be
    a = Assumptions()
    assert a.ranks_per_pack == DEFAULT_MAX_REPORTS == 16
    assert drain(PACKED_FIFO, 100_000, a).seconds <= 15 < drain(PACKED_NODE, 100_000, a).seconds


def test_realistic_reports_fit_a_pack_of_sixteen_and_the_largest_do_not() -> None:
    sizes = list(sample_bodies().values())
    fits = [
        pack_size(b * DEFAULT_MAX_REPORTS, DEFAULT_MAX_REPORTS) <= MAX_PACK_BYTES for b in sizes
    ]
    assert fits == [True, True, True, False]  # the relay splits packs of the largest by size


def test_a_standard_batch_is_capped_by_the_invocation_payload() -> None:
    a = Assumptions()
    d = drain(PER_RANK_STD, 100_000, a)
    assert d.per_invocation * (a.body_bytes + a.envelope_bytes) <= INVOKE_PAYLOAD_BYTES
    assert d.limit == "SQS receive/delete" and d.seconds > d.parts["writers"]
    assert drain(PACKED_STD, 100_000, a).seconds < d.seconds


def test_a_pack_beyond_the_message_size_does_not_fit() -> None:
    a = Assumptions(ranks_per_pack=1000)
    assert not drain(designs(a)[3], 1000, a).fits


def test_the_bench_prints_the_table_and_meets_the_goal(capsys: pytest.CaptureFixture[str]) -> None:
    assert intake_model.main(["--ranks", "1000", "100000", "--ranks-per-pack", "16"]) == 0
    out = capsys.readouterr().out
    assert "assumptions" in out and "packed per 16, FIFO" in out and "packed per 8, FIFO" in out
    assert "standard queue (not built)" in out and "pack size at 16 reports" in out
    assert intake_model.main(["--ranks", "100000", "--invoke-ms", "200", "--pollers", "1"]) == 1

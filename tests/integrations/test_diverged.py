"""The mark of a checkpoint trained on a non-finite loss, as the resume walk reads it (issue 40).

Pure: shard rows built as the walk builds them (aggregated texts, or one row each), no database.
The restart with real processes is tests/integrations/test_restart_diverged.py.
"""

from __future__ import annotations

import logging

import pytest

from trainer_client.restart.diverged import STEPS_NAMED, non_finite_loss, say_skipped
from trainer_client.restart.shard_rows import ShardRows


def _aggregated(extras: dict[int, str]) -> ShardRows:
    """Two ranks' rows as SHARD_AGGREGATES returns them (extras only for the ranks given)."""
    ranks = sorted(extras)
    return ShardRows(
        (
            2,
            0,
            1,
            "0,1",
            "file:///c/step-4\nfile:///c/step-4",
            "10,10",
            ",",
            "null,null",
            ",".join(map(str, ranks)) or None,
            ",".join(extras[r] for r in ranks) or None,
        )
    )


def test_a_checkpoint_without_the_mark_is_not_decoded() -> None:
    rows = _aggregated({0: '{"files": ["non_finite.txt"]}'})
    assert non_finite_loss(rows) is None
    plain = _aggregated({})
    assert non_finite_loss(plain) is None
    assert "records" not in plain.__dict__  # nothing decoded for a checkpoint with no extras


def test_any_rank_with_a_non_finite_loss_marks_the_checkpoint() -> None:
    rows = _aggregated({0: '{"framework": "x"}', 1: '{"non_finite": {"loss": "nan"}}'})
    assert non_finite_loss(rows) == "rank 1: loss=nan"
    one_per_row = ShardRows.from_rows(
        [
            (0, "file:///c/4", 1, None, None, '{"non_finite": {"loss": "inf"}}'),
            (1, "file:///c/4", 1, None, None, "{}"),
        ]
    )
    assert non_finite_loss(one_per_row) == "rank 0: loss=inf"


def test_a_non_finite_metric_alone_is_not_a_diverged_checkpoint() -> None:
    rows = _aggregated({0: '{"non_finite": {"metrics.acc": "nan"}}'})
    assert non_finite_loss(rows) is None


def test_the_skipped_checkpoints_are_one_line_naming_the_newest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trainer_client.restart.diverged")
    skipped = [(step, "rank 0: loss=nan") for step in range(100, 10, -10)]
    say_skipped("run3", skipped)
    say_skipped("run3", [])
    (record,) = caplog.records
    assert record.getMessage() == (
        "job run3: steps 100, 90, 80, 70, 60 and 4 older skipped, trained on a non-finite loss"
        " (extra.non_finite; step 100 rank 0: loss=nan); resuming from an older checkpoint"
        " (resume_diverged=True resumes from them)"
    )
    assert STEPS_NAMED == 5

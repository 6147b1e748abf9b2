"""bench.intake end to end on a tiny N (a smoke run on moto, not a measurement): each barrier's
reports are in the queue before its drain starts, one message per rank or one per node, and
every row lands once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import intake
from bench._intake_senders import chunks


@pytest.mark.slow
def test_both_intakes_send_then_drain_every_row(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # GIVEN 16 ranks x 2 barriers, per-rank and then packed per 8, on moto
    results = tmp_path / "intake.jsonl"
    intake.main(
        ["--ranks", "16", "--checkpoints", "2", "--pack", "8", "--sqs", "moto",
         "--processes", "2", "--threads", "4", "--results", str(results)]
    )  # fmt: skip
    out = capsys.readouterr().out
    # THEN per-rank: 16 messages in the queue at each drain's start, packed: 2 (one per node);
    # both: all 32 rows, 0 failures, DLQ 0, at most 2 writer connections, a drain per barrier
    for name, messages in (("per-rank FIFO", "16/16"), ("packed per 8", "2/2")):
        row = re.search(rf"^\s+16 {name}\s+{messages}\s+32/32\s+0\s+0\s+[12]\s.*$", out, re.M)
        assert row is not None, out
        assert "GOAL MISSED" not in row.group(0), out
        assert re.search(r"\d+\.\d/\d+\.\d", row.group(0)), row.group(0)
    # AND the row is in the results file, as a later run's plot reads it
    (row_read,) = intake.read_results(results)
    assert row_read.per_rank.rows == 32 and [r.messages for r in row_read.packed] == [[2, 2]]


def test_a_node_never_spans_two_sender_processes() -> None:
    # GIVEN 100 ranks in nodes of 8 over 3 processes WHEN dealt
    parts = chunks(100, 3, 8)
    # THEN consecutive, every rank once, and each process's first rank starts a node
    assert [r for part in parts for r in part] == list(range(100))
    assert all(part[0] % 8 == 0 for part in parts)
    assert chunks(10, 4, 0) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def test_a_bad_setting_is_refused_naming_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        intake.main(["--threads", "0"])
    assert exited.value.code == 2
    assert "--processes and --threads must be at least 1" in capsys.readouterr().err

"""bench.restart_collectives, tiny: two gloo ranks restart from a checkpoint in moto's S3 and
every collective byte they move is counted; the fixed part is the same at 2 and 3 ranks."""

from __future__ import annotations

import pytest

from bench import restart_collectives


@pytest.mark.slow
def test_the_bench_counts_the_same_fixed_bytes_at_two_and_three_ranks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert restart_collectives.main(["--ranks", "2", "3"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ")]
    body = [[c.strip() for c in row] for row in rows if row[0].strip().isdigit()]
    assert [row[0] for row in body] == ["2", "3"]
    # THEN the fixed-size collectives moved the same bytes per rank at both sizes, nothing was
    # gathered, and no rank but a node's first received table rows apart from the header
    assert body[0][2:4] == body[1][2:4] and body[0][8] == body[1][8] == "0"
    assert body[0][7] == body[1][7] == "0"
    assert "model at 100,000 ranks" in out

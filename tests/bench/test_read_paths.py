"""bench.read_paths runs end to end on small sizes: listing beats HEAD on requests, reconcile
finds the checkpoint it filled intact, the lookup table is printed."""

from __future__ import annotations

import pytest

from bench import read_paths


@pytest.mark.slow
def test_read_paths_runs_small(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--shards", "30", "1100", "--head-max", "100", "--head-sample", "20"]
    argv += ["--ranks", "200", "--checkpoints", "3", "--wide-ranks", "10", "--rounds", "1"]
    assert read_paths.main(argv) == 0
    out = capsys.readouterr().out
    assert "| 30 | listing | 1 |" in out and "| 1,100 | listing | 2 |" in out
    assert "| 1,100 | HEAD, 20 sampled, scaled | 1,101 |" in out
    assert "1 checkpoints in the store, 1 with rows; 0 unreported, 0 partial, 0 differing" in out
    assert "| 10 ranks x 1,000 | 10,000 |" in out

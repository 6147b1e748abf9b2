"""bench.read_paths runs end to end on small sizes: listing beats HEAD on requests, reconcile
finds the checkpoint it filled intact, the lookup table is printed; --pages lists every page and
verifies every object."""

from __future__ import annotations

import os
import time

import pytest

from bench import read_paths
from bench._cpu import tree_cpu_s


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


def test_read_paths_pages_runs_small(capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN moto's server filled with 2,500 shards (3 ranges of 1,000 keys) WHEN listed one page
    # at a time and concurrently at two numbers of listings
    argv = ["--pages", "--shards", "2500", "--list-workers", "1", "8", "--text-timestamps"]
    assert read_paths.main(argv) == 0
    out = capsys.readouterr().out
    # THEN each way finds all 2,501 objects in 3 pages
    assert "| serial, each range's prefix | 3 | 2,501 |" in out
    assert "| serial, the checkpoint's prefix | 3 | 2,501 |" in out
    assert "| verify_objects by listing, 1 workers | 3 | 2,501 |" in out
    assert "| verify_objects by listing, 8 workers | 3 | 2,501 |" in out


def test_the_server_cpu_counts_this_process() -> None:
    before = tree_cpu_s(os.getpid())
    deadline = time.process_time() + 0.1
    while time.process_time() < deadline:
        pass
    assert tree_cpu_s(os.getpid()) > before

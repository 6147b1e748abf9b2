"""bench.list_pages runs end to end on small sizes: every page listed and every object verified."""

from __future__ import annotations

import pytest

from bench import list_pages
from bench._cpu import tree_cpu_s


def test_list_pages_runs_small(capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN moto's server filled with 2,500 shards (3 ranges of 1,000 keys) WHEN listed one page
    # at a time and concurrently at two numbers of listings
    assert list_pages.main(["--shards", "2500", "--workers", "1", "8", "--text-timestamps"]) == 0
    out = capsys.readouterr().out
    # THEN each way finds all 2,501 objects in 3 pages
    assert "| serial, each range's prefix | 3 | 2,501 |" in out
    assert "| serial, the checkpoint's prefix | 3 | 2,501 |" in out
    assert "| verify_objects by listing, 1 workers | 3 | 2,501 |" in out
    assert "| verify_objects by listing, 8 workers | 3 | 2,501 |" in out


def test_list_pages_server_cpu_counts_this_process() -> None:
    import os
    import time

    before = tree_cpu_s(os.getpid())
    deadline = time.process_time() + 0.1
    while time.process_time() < deadline:
        pass
    assert tree_cpu_s(os.getpid()) > before

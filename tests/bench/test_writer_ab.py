"""bench writer_ab: both trees' writers run on their own databases and every figure is printed."""

from __future__ import annotations

import re

import pytest

from bench import writer_ab


def test_the_tree_against_itself_prints_both_sides_and_the_ratios(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN this tree as both sides WHEN one pair of 100 rows runs
    assert writer_ab.main(["--rows", "100", "--pairs", "1", "--batch", "10"]) == 0
    out = capsys.readouterr().out
    # THEN each side's rows/s and CPU, and the pairs' ratios, are there
    assert re.search(r"before +[\d,]+ rows/s +CPU per batch: writer [\d.]+ ms", out)
    assert re.search(r"after +[\d,]+ rows/s +CPU per batch: writer [\d.]+ ms", out)
    assert re.search(r"rows/s [\d.]+ \([\d.]+–[\d.]+\), CPU per batch [\d.]+", out)

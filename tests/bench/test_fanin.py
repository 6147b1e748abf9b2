"""bench.fanin end to end on a tiny N: every row lands, and the CPU row accounts for each part
(a smoke run on moto, not a measurement)."""

from __future__ import annotations

import re

import pytest

from bench import fanin


@pytest.mark.slow
def test_fanin_writes_every_row_and_splits_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN 8 ranks x 2 checkpoints through the whole local pipeline on moto, no direct write
    # WHEN the bench runs with its default rank processes (one per core) and switch interval
    status = fanin.main(["--ranks", "8", "--checkpoints", "2", "--no-direct"])
    out = capsys.readouterr().out
    # THEN the goal is met: all 16 rows, 0 failures, at most 2 writer connections
    assert status == 0, out
    assert re.search(r"^\s+8 pipeline\s+16/16\s+0\s+[12] writer", out, re.M), out
    assert "their GIL switch interval 50 ms" in out
    # AND the CPU row names every part with a number (the emulator's and PostgreSQL's processes
    # were found: no NaN), and so does the floor's emulator CPU
    cpu = re.search(r"^\s+8 pipeline CPU .*$", out, re.M)
    assert cpu is not None, out
    for part in ("ranks", "event source", "writer", "postgres", "emulator"):
        assert re.search(rf"{part} \d+\.\d s \(\d+\.\d\d\)", cpu.group(0)), cpu.group(0)
    assert re.search(r"emulator CPU \d+\.\d s \(\d+\.\d\d ms per message\)", out), out


@pytest.mark.parametrize(
    ("argv", "rule"),
    [
        (["--ranks-per-process", "0"], "--ranks-per-process must be at least 1, got 0"),
        (["--switch-interval-ms", "-5"], "--switch-interval-ms must be above 0, got -5"),
    ],
)
def test_bad_simulation_settings_are_refused_naming_the_option(
    argv: list[str], rule: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a setting the rank processes could not run with WHEN the bench starts
    with pytest.raises(SystemExit) as exited:
        fanin.main(argv)
    # THEN it stops before starting anything, with the option and the rule
    assert exited.value.code == 2
    assert rule in capsys.readouterr().err

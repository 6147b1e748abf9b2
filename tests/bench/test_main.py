"""python -m bench: the whole run holds every bench, and its quick arguments are the bench's own."""

from __future__ import annotations

import importlib
import re

import pytest

from bench import __main__ as whole


def test_the_whole_run_holds_every_bench_once() -> None:
    names = [name for name, _ in whole.SECTIONS]
    assert sorted(names) == whole.NAMES


def test_the_help_gives_every_bench_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        whole.main(["--help"])
    listed = capsys.readouterr().out.split("in the order of the whole run:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listed] == [name for name, _ in whole.SECTIONS]


def test_every_quick_option_is_the_bench_s_own(
    capsys: pytest.CaptureFixture[str],
) -> None:
    wrong = []
    for name, quick in whole.SECTIONS:
        with pytest.raises(SystemExit):
            importlib.import_module(f"bench.{name}").main(["--help"])
        options = set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", capsys.readouterr().out))
        words = [*quick, *(["--sqs"] if name in whole._SQS else [])]
        wrong += [f"{name} {w}" for w in words if w.startswith("-") and w not in options]
    assert not wrong

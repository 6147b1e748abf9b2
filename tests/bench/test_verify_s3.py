"""bench.verify_s3 runs end to end on a small checkpoint and finds its own damage."""

from __future__ import annotations

import pytest

from bench import verify_s3


@pytest.mark.slow
def test_a_small_run_verifies_and_finds_the_truncated_object(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert verify_s3.main(["--shards", "16", "--workers", "1", "4", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "16 objects of 4096 B" in out
    assert "__15_0.distcp: size 4095 B, reported 4096 B" in out


def test_bad_options_are_refused_naming_the_option() -> None:
    with pytest.raises(SystemExit):
        verify_s3.main(["--shards", "0"])
    with pytest.raises(SystemExit):
        verify_s3.main(["--workers", "0"])

"""Every plot is drawn from a real small run of its bench (``--plot DIR``) and is a real PNG with
something drawn on it (not a measurement: the sizes are tiny)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import fanin, lag, restore, writer_throughput
from tests.conftest import ADMIN_URL

matplotlib_image = pytest.importorskip("matplotlib.image")


def assert_drawn(png: Path) -> None:
    """A PNG of the figure's size with more than a few colours (lines, text, not a blank)."""
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    pixels = matplotlib_image.imread(png)
    assert pixels.shape[:2] == (540, 900), pixels.shape  # 7.5 x 4.5 in at 120 dpi
    colours = {tuple(p) for p in pixels.reshape(-1, pixels.shape[2])[::7].tolist()}
    assert len(colours) > 50, len(colours)


@pytest.mark.slow
def test_fanin_plot_from_a_small_run(tmp_path: Path) -> None:
    # GIVEN 4 and 8 ranks x 2 checkpoints, both designs WHEN fanin runs with --plot
    fanin.main(["--ranks", "4", "8", "--checkpoints", "2", "--plot", str(tmp_path)])
    # THEN it drew the time to all rows against ranks
    assert_drawn(tmp_path / "fanin.png")


@pytest.mark.slow
def test_lag_plot_from_a_small_run(tmp_path: Path) -> None:
    argv = ["--rates", "10", "20", "--seconds", "2", "--ranks", "4", "--warmup-s", "0"]
    lag.main([*argv, "--plot", str(tmp_path)])
    assert_drawn(tmp_path / "lag.png")


@pytest.mark.slow
def test_writer_plot_from_a_small_run(tmp_path: Path) -> None:
    argv = ["--rows", "200", "--rounds", "1", "--admin-url", ADMIN_URL, "--plot", str(tmp_path)]
    writer_throughput.main(argv)
    assert_drawn(tmp_path / "writer_throughput.png")


@pytest.mark.slow
def test_restore_plot_from_a_small_run(tmp_path: Path) -> None:
    # GIVEN two tiny checkpoints on moto's S3 and 2 ranks for the decision WHEN restore runs
    # with --plot
    argv = ["--sizes-gb", "0.004", "0.008", "--rounds", "1", "--ranks", "2", "--s3", "moto"]
    restore.main([*argv, "--plot", str(tmp_path)])
    # THEN it drew both methods' throughput per size
    assert_drawn(tmp_path / "restore.png")

"""bench.save_overhead end to end on a tiny plain-loop run: every report checked, the plot drawn
(not a measurement: the sizes are tiny)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import save_overhead
from bench._save_runs import gpt2_shape

matplotlib_image = pytest.importorskip("matplotlib.image")


@pytest.mark.slow
def test_a_tiny_plain_run_checks_its_reports_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN two sizes of atomic_torch_save_async with checksums, two saves each
    argv = ["--frameworks", "plain", "--modes", "finish+sha", "--sizes-gb", "0.001", "0.002"]
    argv += ["--saves", "2", "--workers", "0", "--work-dir", str(tmp_path / "work")]
    # WHEN the bench runs with --plot
    status = save_overhead.main([*argv, "--plot", str(tmp_path)])
    out = capsys.readouterr().out
    # THEN every report arrived once with its bytes and digest, the speeds are printed, and the
    # figure is drawn; the checkpoints are deleted
    assert status == 0, out
    assert out.count("| finish+sha |") == 2 and "| ok |" in out
    assert "sha256sum" in out and "GB/s" in out
    assert (tmp_path / "save_overhead-plain.png").read_bytes()[:4] == b"\x89PNG"
    assert not any((tmp_path / "work").iterdir())


def test_gpt2_shapes_hit_the_requested_checkpoint_sizes() -> None:
    # 12 bytes per parameter (fp32 weights and AdamW's two moments), within 15 %
    for target in (0.1e9, 1e9, 1.3e9, 4e9):
        embd, layers = gpt2_shape(int(target))
        params = (50257 + 1024) * embd + 12 * embd * embd * layers
        assert abs(12 * params / target - 1) < 0.15, (target, embd, layers)

"""bench.save_overhead end to end on a tiny plain-loop run: every report checked, the step plot
drawn (not a measurement: the sizes are tiny)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import save_overhead
from bench._save_runs import gpt2_shape
from bench._work_dir import remove_orphan_roots
from tests.bench.test_plot import assert_drawn
from tests.trainer_client.helpers import REPO_ROOT

matplotlib_image = pytest.importorskip("matplotlib.image")


def run_bench(argv: list[str]) -> int:
    """``save_overhead.main(argv)`` in this process, with the environment put back after it (the
    bench points boto3 at its own moto for good)."""
    saved = dict(os.environ)
    try:
        return save_overhead.main(argv)
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.slow
def test_a_tiny_plain_run_checks_its_reports_and_plots_its_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN atomic_torch_save_async with checksums, two saves at the bench's cadence, the
    # finisher run SCHED_IDLE (a --tuning knob)
    argv = ["--frameworks", "plain", "--modes", "finish+sha", "--sizes-gb", "0.002"]
    argv += ["--saves", "2", "--min-idle", "5", "--workers", "0", "--work-dir", str(tmp_path / "w")]
    argv += ["--tuning", "finisher_priority=idle", "--tuning", "hash_threads=2"]
    # WHEN the bench runs with --plot (it points boto3 at its own moto for good: the tests after
    # this one in the same process keep the suite's)
    status = run_bench([*argv, "--plot", str(tmp_path)])
    out = capsys.readouterr().out
    # THEN every report arrived once with its bytes and digest, the step ratio has its interval
    # over two cycles, the disk's own time is measured, the step plot is drawn and every step
    # is written beside it
    assert status == 0, out
    row = next(line for line in out.splitlines() if "| finish+sha |" in line)
    assert "| ok |" in row and " in 2)" in row and "x [" in row, row
    assert "'finisher_priority': 'idle'" in out
    assert_drawn(tmp_path / "save_overhead-steps.png")
    runs = json.loads((tmp_path / "save_overhead-steps.json").read_text())
    assert [(r["framework"], r["mode"]) for r in runs] == [("plain", "finish+sha")]
    assert any(busy for _, busy in runs[0]["steps"]) and runs[0]["tuning"]["hash_threads"] == 2
    assert not any((tmp_path / "w").iterdir())


def test_gpt2_shapes_hit_the_requested_checkpoint_sizes() -> None:
    # 12 bytes per parameter (fp32 weights and AdamW's two moments), within 15 %
    for target in (0.1e9, 1e9, 1.3e9, 4e9):
        embd, layers = gpt2_shape(int(target))
        params = (50257 + 1024) * embd + 12 * embd * embd * layers
        assert abs(12 * params / target - 1) < 0.15, (target, embd, layers)


def _bench_with_a_checkpoint_saved(tmp: Path) -> subprocess.Popen[str]:
    """A real plain-loop run (many saves, so still running) with TMPDIR at ``tmp``, once its
    first checkpoint is in its work dir."""
    argv = ["--frameworks", "plain", "--modes", "finish", "--sizes-gb", "0.002"]
    argv += ["--saves", "10000", "--min-idle", "5", "--workers", "0"]
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench", "save_overhead", *argv],
        cwd=REPO_ROOT,
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group: a SIGKILL reaches its moto server too
    )
    deadline = time.monotonic() + 120
    while not any(tmp.glob("save-overhead-*/*/plain/step-*.pt")):
        if bench.poll() is not None or time.monotonic() > deadline:
            os.killpg(bench.pid, signal.SIGKILL)
            pytest.fail(f"no checkpoint saved: {bench.communicate()[0][-3000:]}")
        time.sleep(0.1)
    return bench


@pytest.mark.slow
def test_a_bench_stopped_by_sigterm_removes_its_checkpoints(tmp_path: Path) -> None:
    # GIVEN a bench run that has saved a checkpoint into its work dir under TMPDIR
    bench = _bench_with_a_checkpoint_saved(tmp_path)
    # WHEN a timeout's SIGTERM stops it
    bench.send_signal(signal.SIGTERM)
    out, _ = bench.communicate(timeout=120)
    # THEN it exits with 128 + SIGTERM and its work dir is gone
    assert bench.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert not list(tmp_path.glob("save-overhead-*")), out[-3000:]


@pytest.mark.slow
def test_the_work_dir_of_a_bench_killed_by_sigkill_is_removed_by_the_next(tmp_path: Path) -> None:
    # GIVEN a bench killed by SIGKILL, which no handler sees (with its moto server, as a timeout
    # kills a process group): its work dir stays
    bench = _bench_with_a_checkpoint_saved(tmp_path)
    os.killpg(bench.pid, signal.SIGKILL)
    bench.communicate(timeout=120)
    left = list(tmp_path.glob("save-overhead-*"))
    assert len(left) == 1
    # and the dir of a live process (this one's)
    live = tmp_path / f"save-overhead-{os.getpid()}-x"
    live.mkdir()
    # WHEN the next bench looks for orphans before it starts
    removed = remove_orphan_roots(tmp_path)
    # THEN the dead process's dir is removed, the live one's is not
    assert removed == left and not left[0].exists() and live.is_dir()


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the control reads the page cache: Linux")
def test_the_control_saves_without_reporting_and_times_the_kernels_write_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the plain loop's save with no finisher, the kernel asked to write it back at once
    argv = ["--frameworks", "plain", "--modes", "control-now", "--sizes-gb", "0.002"]
    argv += ["--saves", "2", "--min-idle", "5", "--workers", "0", "--work-dir", str(tmp_path)]
    status = run_bench(argv)
    out = capsys.readouterr().out
    # THEN nothing was reported, and the row's trace says how much the save left dirty
    assert status == 0, out
    row = next(line for line in out.splitlines() if "| control-now |" in line)
    assert row.split("|")[-2].strip() == "-", row
    assert "trace" in out and "left dirty by the save (median MB)" in out, out


def test_the_control_refuses_lightnings_async_io() -> None:
    # GIVEN the control asked of Lightning's AsyncCheckpointIO, whose save returns before its
    # file exists (nothing for the kernel to write back yet)
    argv = ["--frameworks", "lightning-async", "--modes", "control-now", "--sizes-gb", "0.002"]
    # WHEN the bench parses it THEN it stops with a usage error naming both flags
    with pytest.raises(SystemExit) as stopped:
        save_overhead.main(argv)
    assert stopped.value.code == 2


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the control reads the page cache: Linux")
def test_a_long_run_keeps_only_its_newest_checkpoints_and_still_checks_every_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN four saves per run, two checkpoints kept on disk (the others rotated away before a
    # save, as save_total_limit does), every framework, with sha256 and with the control
    argv = ["--frameworks", "plain", "hf", "lightning", "--modes", "finish+sha", "control-now"]
    argv += ["--sizes-gb", "0.002", "--saves", "4", "--keep", "2", "--min-idle", "5"]
    argv += ["--workers", "0", "--work-dir", str(tmp_path)]
    # WHEN the bench runs
    status = run_bench(argv)
    out = capsys.readouterr().out
    # THEN each run removed its two oldest only once they were finished: every report arrived
    # (the rotated ones with their bytes), none was dropped as rotated mid-finish
    assert status == 0, out
    assert out.count("2 of 4 checkpoints rotated away") == 6, out
    for framework in ("plain", "hf", "lightning"):
        row = next(r for r in out.splitlines() if r.startswith(f"| {framework} |") and "sha |" in r)
        assert "| ok |" in row, row
    # AND a negative --keep is a usage error naming the flag
    with pytest.raises(SystemExit):
        run_bench([*argv, "--keep", "-1"])
    assert "--keep: -1 is negative" in capsys.readouterr().err

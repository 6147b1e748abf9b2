"""bench/gpu_save_overhead.sh, the prepared run for a lent one-GPU machine, end to end on the CPU
in its dry mode (tiny sizes): every step runs and writes its results under $OUT."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.trainer_client.helpers import REPO_ROOT


@pytest.mark.slow
# The script trains and saves for real (the HF Trainer, checksums off and on): minutes on a
# loaded 2-core machine, beyond the suite's 300 s hang guard; its own subprocess limit is 600 s.
@pytest.mark.timeout(900)
def test_the_gpu_script_runs_end_to_end_in_its_dry_mode(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "DRY": "1", "OUT": str(out), "WORK": str(tmp_path / "work")}
    done = subprocess.run(
        ["bash", "bench/gpu_save_overhead.sh"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # THEN the machine and the HF rows (checksums off and on, reports checked) are under $OUT
    assert "cpus" in (out / "machine.txt").read_text()
    table = (out / "save_overhead.txt").read_text()
    assert table.count("| ok |") == 2, table
    assert not (tmp_path / "work").exists()

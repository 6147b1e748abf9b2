"""bench/beside_dd.sh, the busy disk of BENCHMARKS.md §8's `--done-check`: it runs the command
while a dd loop rewrites its file with conv=fsync, returns the command's status, and leaves
neither the loop nor the file behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.trainer_client.helpers import REPO_ROOT


def test_the_command_runs_beside_a_dd_loop_that_is_gone_afterwards(tmp_path: Path) -> None:
    target = tmp_path / "dd-file"
    env = {**os.environ, "DD_FILE": str(target), "DD_MB": "4"}
    # WHEN a command that waits for the dd loop's file to appear, then fails with status 3, runs
    done = subprocess.run(
        [
            "bash",
            "bench/beside_dd.sh",
            "bash",
            "-c",
            f"for i in $(seq 100); do [ -e {target} ] && exit 3; sleep 0.1; done; exit 1",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # THEN the loop was writing while it ran, its status comes back, and nothing is left
    assert done.returncode == 3, done.stdout + done.stderr
    assert "[beside_dd] dd loop into" in done.stdout
    assert not target.exists()
    left = subprocess.run(["pgrep", "-f", f"of={target}"], capture_output=True, text=True)
    assert left.stdout == ""

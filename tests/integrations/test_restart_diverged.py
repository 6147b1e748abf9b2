"""Issue 40: no resume from a diverged checkpoint by default.

A Lightning job (one process, a user's script: logging not configured) whose loss turns NaN at
step 10 saves every 4 steps: 4 and 8 are finite, 12, 16 and 20 recorded as trained on a
non-finite loss. The restart's collective call (``reporting.resume()``) resumes from step 8 with
one line on stderr naming the skipped ones; with ``resume_diverged=True`` from step 20.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import PipelineFactory
from tests.integrations.test_lightning_nan_loss import _EPOCH_SCRIPT
from tests.trainer_client.helpers import rows_until, run_child

pytestmark = pytest.mark.slow

_RESTART = """
import sys
from trainer_client.integrations.lightning import CheckpointReporting

reporting = CheckpointReporting(spool_dir=sys.argv[1], loss_metric="train_loss")
told = {"resume_diverged": True} if sys.argv[2] == "resume-diverged" else {}
print("resume", reporting.resume(**told))
"""


def test_the_restart_skips_checkpoints_trained_on_a_nan_loss_unless_told(
    pipeline_factory: PipelineFactory, tmp_path: Path
) -> None:
    spool = str(tmp_path / "spool")
    with pipeline_factory() as pipeline:
        env = {
            **pipeline.client_env(),
            "CKPT_JOB_ID": "diverged",
            "WORLD_SIZE": "1",
            "RANK": "0",
            "CKPT_RESUME_DATABASE_URL": pipeline.database_url,
        }
        # GIVEN a job whose loss turned NaN at step 10
        out = str(tmp_path / "out")
        done = run_child(_EPOCH_SCRIPT, out, spool, timeout=600, **env)
        assert done.returncode == 0, done.stderr[-4000:]
        rows_until(
            pipeline.database_url,
            "SELECT step FROM complete_checkpoints WHERE job_id = 'diverged'",
            lambda rows: len(rows) == 5,
        )
        # WHEN it restarts: step 8, the newest finite one, and one line names the skipped ones
        done = run_child(_RESTART, spool, "default", timeout=300, **env)
        assert done.returncode == 0, done.stderr[-4000:]
        assert done.stdout.strip().endswith("step=8.ckpt"), done.stdout + done.stderr[-3000:]
        lines = done.stderr.splitlines()
        skipped = [line for line in lines if "non-finite loss" in line and "restart of" not in line]
        assert len(skipped) == 1, done.stderr[-3000:]
        assert "job diverged: steps 20, 16, 12 skipped" in skipped[0], skipped
        assert "step 20 rank 0: loss=nan" in skipped[0], skipped
        # AND the restart's own line names them among what it passed over
        (decision,) = [line for line in lines if "restart of job diverged" in line]
        assert "resuming from step 8" in decision and "step 20: diverged" in decision
        # WHEN told to resume from a diverged one: the newest, step 20, without that line
        done = run_child(_RESTART, spool, "resume-diverged", timeout=300, **env)
        assert done.returncode == 0, done.stderr[-4000:]
        assert done.stdout.strip().endswith("step=20.ckpt"), done.stdout + done.stderr[-3000:]
        assert "non-finite loss" not in done.stderr, done.stderr[-3000:]

"""A Spot relaunch as users launch it: a new launch of the same job (same CKPT_JOB_ID and spool
directory, a new process tree whose launcher counts from 0 again), every rank calling
``resume(reporter)`` and passing no attempt. Real gloo ranks, moto's SQS, the real writer.

Launch 1 saves steps 10 and 20 on both ranks; at step 30 rank 0 reports and rank 1 dies with its
report spooled and unsent; its spool is on a node that is gone (moved aside). Launch 2 resumes
from step 20 under a higher attempt on every rank and saves step 30 again: step 30 is complete
from launch 2's shards only. Then launch 1's lost spool is recovered and sent
(``ckpt-pipeline spool send``): its report lands as launch 1's and completes nothing of launch 2.
(Before launches were numbered, both launches reported attempt 0 and step 30 was "complete" with
rank 0's row from launch 1 beside rank 1's from launch 2.)"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle, take_dlq
from tests.integrations.sharded_helpers import ROOT, checkpoints, job_env, run_job

pytestmark = pytest.mark.slow

JOB = "tests.integrations.relaunch_job"
CONSOLE_SCRIPT = Path(sys.executable).parent / "ckpt-pipeline"


def _launch(run_dir: Path, rank: int) -> dict[str, Any]:
    return dict(json.loads((run_dir / f"launch-{rank}.json").read_text()))


def _launch_ids(url: str, job: str, step: int) -> dict[int, str | None]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT rank, extra->>'launch_id' FROM training_checkpoint_shards"
            " WHERE job_id = %s AND step = %s",
            (job, step),
        ).fetchall()
    return {int(rank): launch for rank, launch in rows}


def test_a_relaunch_is_a_new_attempt_and_never_merges_with_the_dead_launch(
    pipeline_factory: PipelineFactory, tmp_path: Path
) -> None:
    job = f"relaunch-{uuid.uuid4().hex[:8]}"
    with pipeline_factory() as pipeline:
        db = pipeline.database_url
        # GIVEN launch 1: steps 10 and 20 complete; at 30 rank 0 reported and rank 1 died with
        # its report in its spool
        run1 = tmp_path / "launch-1"
        code = run_job(
            JOB, pipeline, job, tmp_path, run1, steps=[10, 20, 30], die_rank=1, die_at_step=30
        )
        log1 = (run1 / "job.log").read_text()
        assert code == 1 and "rank 1 exited -9" in log1, log1[-3000:]
        settle(pipeline)
        first = [_launch(run1, r) for r in (0, 1)]
        assert first[0] == first[1] and first[0]["run_attempt"] == 0, first
        before = checkpoints(db, job)
        assert before[20].complete and not before[30].complete
        assert set(before[30].shards) == {0}
        # AND rank 1's node is gone: its spool (with step 30's report) is elsewhere
        lost = tmp_path / "lost-node-spool" / job
        lost.mkdir(parents=True)
        (tmp_path / "spool" / job / "rank-1.spool").rename(lost / "rank-1.spool")

        # WHEN the job is launched again (a new launcher, no attempt passed) and saves step 30
        run2 = tmp_path / "launch-2"
        code = run_job(JOB, pipeline, job, tmp_path, run2, steps=[30, 40])
        assert code == 0, (run2 / "job.log").read_text()[-3000:]
        settle(pipeline)

        # THEN every rank of launch 2 resumed from step 20 as one new, higher attempt
        second = [_launch(run2, r) for r in (0, 1)]
        assert second[0] == second[1], second
        assert second[0]["resumed"] == 20
        assert second[0]["run_attempt"] == 1 and second[0]["launch_id"] != first[0]["launch_id"]
        # AND step 30 is complete from launch 2's shards only
        after = checkpoints(db, job)
        assert after[30].complete and after[30].run_attempt == 1
        assert {r: s.run_attempt for r, s in after[30].shards.items()} == {0: 1, 1: 1}
        assert _launch_ids(db, job, 30) == {0: second[0]["launch_id"], 1: second[0]["launch_id"]}

        # WHEN launch 1's lost spool is recovered and sent after launch 2 ran
        sent = subprocess.run(
            [CONSOLE_SCRIPT, "spool", "send", "--dir", str(lost.parent)],
            env=job_env(pipeline, job, tmp_path),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert sent.returncode == 0, sent.stdout + sent.stderr
        settle(pipeline)
        # THEN it landed as launch 1's report and changed nothing of launch 2's checkpoint
        late = checkpoints(db, job)
        assert late[30] == after[30]
        assert _launch_ids(db, job, 30) == {0: second[0]["launch_id"], 1: second[0]["launch_id"]}
        assert take_dlq(pipeline) == []

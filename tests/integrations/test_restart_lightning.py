"""A fresh-node restart of a 2-rank Lightning DDP job that uploads to S3 (moto), with a killed rank.

Attempt 0 checkpoints every 4 steps with ``upload_to=``; rank 1 is SIGKILLed right after step 8's
save returned, with its report of step 8 durable in its spool and never sent (its SQS relay
frozen: tests/integrations/sqs_gate.py); the launcher kills rank 0. The spool survives (the EFS
stand-in); the checkpoint directory does not (a new instance). The restart (torchrun's restart
count 1) initialises the process group, and every rank's ``reporting.resume()`` sends its spool,
rank 0 waits for the writer to store what was sent, decides step 8 (not 4) for every rank,
restores ``step=8.ckpt`` from S3 once on this node, verified, and ``fit(ckpt_path=…)`` resumes
there."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_pipeline.local.pipeline import LocalPipeline
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from tests.integrations.test_lightning import EVERY_N_STEPS, checkpoints, launch
from trainer_client.restart.lookup import latest_complete_checkpoint

KILL_AT = 2 * EVERY_N_STEPS
LAST = 3 * EVERY_N_STEPS


@pytest.fixture
def pipeline(pipeline_factory: PipelineFactory) -> Iterator[LocalPipeline]:
    with pipeline_factory() as running:
        yield running


@pytest.mark.slow
def test_fresh_node_lightning_restart_resumes_from_the_step_whose_report_was_in_a_spool(
    pipeline: LocalPipeline, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    job = f"pl-restart-{uuid.uuid4().hex[:8]}"
    prefix = f"s3://{s3_bucket}/{job}"
    db = pipeline.database_url

    # GIVEN attempt 0, whose rank 1 dies with step 8's report durable in its spool
    run0 = tmp_path / "run0"
    proc = launch(
        pipeline, job, tmp_path, run0, max_steps=LAST, upload_to=prefix,
        freeze_sqs_kill_rank=1, freeze_sqs_kill_at_step=KILL_AT,
    )  # fmt: skip
    assert proc.wait(timeout=300) == 1, (run0 / "job.log").read_text()[-3000:]
    log0 = (run0 / "job.log").read_text()
    assert "rank 1 exited -9" in log0, log0[-3000:]
    settle(pipeline)
    before = checkpoints(db, job)
    assert before[EVERY_N_STEPS][:3] == (0, 2, True)
    assert before[KILL_AT][:3] == (0, 2, False) and set(before[KILL_AT][3]) == {0}
    # AND the instance is gone with its disk: the checkpoint directory and every file in it
    shutil.rmtree(tmp_path / "ckpt")
    # (asked now, the database names the previous checkpoint: what the one call fixes)
    point = latest_complete_checkpoint(job, database_url=db, s3_client=s3)
    assert point is not None and point.step == EVERY_N_STEPS

    # WHEN torchrun restarts the job and every rank makes the restart's call before fit()
    run1 = tmp_path / "run1"
    proc = launch(
        pipeline, job, tmp_path, run1, max_steps=LAST, upload_to=prefix, restart=True,
        restart_count=1,
    )  # fmt: skip
    assert proc.wait(timeout=300) == 0, (run1 / "job.log").read_text()[-3000:]
    settle(pipeline)

    # THEN every rank resumed from step 8, restored from S3 once on this node, verified
    local = tmp_path / "ckpt" / f"step={KILL_AT}.ckpt"
    decided = [json.loads((run1 / f"restart-{r}.json").read_text()) for r in (0, 1)]
    print(f"restart per rank: {decided}")
    assert [d["path"] for d in decided] == [str(local)] * 2
    assert [d["restart"]["step"] for d in decided] == [KILL_AT, KILL_AT]
    assert sorted(d["restart"]["source"] for d in decided) == ["manifest", "store"]
    for rank in (0, 1):
        progress = json.loads((run1 / f"progress-{rank}.json").read_text())
        assert progress["start_step"] == KILL_AT and progress["step"] == LAST
    # AND the database: step 8 complete with the killed rank's report of attempt 0
    after = checkpoints(db, job)
    print(f"killed rank's report: step {KILL_AT} rank 1 {after[KILL_AT][3][1]}")
    print(f"checkpoints (step: run_attempt, world_size, complete, shards): {after}")
    assert after[KILL_AT][:3] == (0, 2, True)
    assert after[KILL_AT][3][1] == (0, f"{prefix}/ckpt/step={KILL_AT}.ckpt")
    assert after[LAST][:3] == (1, 2, True)
    assert pipeline.dlq_depth() == 0

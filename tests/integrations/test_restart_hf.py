"""A fresh-node restart of a 2-rank Hugging Face ``Trainer`` job that uploads to S3 (moto).

Attempt 0 checkpoints every 3 steps with ``upload_to=``; rank 1 is SIGKILLed right after
checkpoint-6 was saved on both ranks, uploaded and its report spooled, before the report was
sent (its SQS relay frozen: tests/integrations/sqs_gate.py). The spool survives (the EFS
stand-in); the output directory does not (a new instance). The restart's one call sends the
spooled report, waits for the writer to store it, agrees on step 6 (not 3) on every rank,
restores checkpoint-6 from S3 verified, and the ``Trainer`` resumes from it.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_pipeline.local.pipeline import LocalPipeline
from tests.e2e.conftest import PipelineFactory
from tests.integrations.hf_job import (
    KILL_AT_SAVE,
    MAX_STEPS,
    SAVE_STEPS,
    WORLD,
    HfJob,
    checkpoint_rows,
    shard_rows,
)
from trainer_client.restart.lookup import latest_complete_checkpoint


@pytest.fixture
def pipeline(pipeline_factory: PipelineFactory) -> Iterator[LocalPipeline]:
    with pipeline_factory() as running:
        yield running


@pytest.mark.slow
def test_fresh_node_restart_resumes_from_the_step_whose_report_was_still_in_a_spool(
    pipeline: LocalPipeline, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    job = HfJob(pipeline, f"restart-{uuid.uuid4().hex[:8]}", tmp_path)
    job_id, out, db = job.job_id, job.out, job.db
    prefix = f"s3://{s3_bucket}/{job_id}"
    common: dict[str, Any] = {"checksums": True, "upload_to": prefix}

    # GIVEN attempt 0, whose rank 1 dies with checkpoint-6's report durable in its spool
    job.kill_rank_1(freeze_sqs_kill_rank=1, freeze_sqs_kill_at_save=KILL_AT_SAVE, **common)
    before = checkpoint_rows(db, job_id)
    assert before[SAVE_STEPS] == (0, WORLD, WORLD, True)
    assert before[KILL_AT_SAVE] == (0, WORLD, 1, False)  # rank 1's report is in its spool only
    # AND the instance is gone with its disks: the output directory and everything in it
    shutil.rmtree(out)
    # (asked now, the database names the previous checkpoint: the bug the one call fixes)
    point = latest_complete_checkpoint(job_id, database_url=db, s3_client=s3)
    assert point is not None and point.step == SAVE_STEPS

    # WHEN torchrun restarts the job and every rank makes the one call before train()
    job.run_to_end(attempt=1, restart=True, **common)

    # THEN every rank resumed from step 6, restored from S3 once on this node, into
    # output_dir/checkpoint-6, and trained steps 7..9 only
    ckpt = out / f"checkpoint-{KILL_AT_SAVE}"
    outcomes = job.rank_results()
    for result in outcomes:
        print(f"rank {result['rank']}: restart {result['restart']}, steps {result['steps']}")
        assert result["restart"]["step"] == KILL_AT_SAVE
        assert result["resumed_from"] == str(ckpt)
        assert result["steps"] == list(range(KILL_AT_SAVE + 1, MAX_STEPS + 1))
    assert sorted(r["restart"]["source"] for r in outcomes) == ["manifest", "store"]
    losses = job.losses(0, 1)
    assert sorted(int(s) for s in losses) == list(range(KILL_AT_SAVE + 1, MAX_STEPS + 1))
    # AND the database: step 6 complete with the killed rank's report of attempt 0
    killed = shard_rows(db, job_id)[(KILL_AT_SAVE, 1)]
    print(f"killed rank's report: step {KILL_AT_SAVE} rank 1 {killed}")
    assert killed["run_attempt"] == 0 and killed["uri"] == f"{prefix}/checkpoint-{KILL_AT_SAVE}"
    after = checkpoint_rows(db, job_id)
    print(f"checkpoints (step: run_attempt, world_size, shards, complete): {after}")
    assert after[KILL_AT_SAVE] == (0, WORLD, WORLD, True)
    assert after[MAX_STEPS] == (1, WORLD, WORLD, True)
    assert pipeline.dlq_depth() == 0


@pytest.mark.slow
def test_a_relaunch_counting_from_zero_resaves_a_step_from_its_own_launch_only(
    pipeline: LocalPipeline, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    job = HfJob(pipeline, f"relaunch-{uuid.uuid4().hex[:8]}", tmp_path)
    job_id, db = job.job_id, job.db
    prefix = f"s3://{s3_bucket}/{job_id}"
    common: dict[str, Any] = {"checksums": True, "upload_to": prefix}

    # GIVEN launch 1, whose rank 1 is killed in its save of checkpoint-6, before its upload:
    # rank 0 uploaded and reported checkpoint-6, so it is half there
    job.kill_rank_1(kill_rank=1, kill_at_save=KILL_AT_SAVE, **common)
    # (rank 1's checkpoint-3 may still be unfinished in its spool: the restart finishes it)
    assert checkpoint_rows(db, job_id)[KILL_AT_SAVE] == (0, WORLD, 1, False)

    # WHEN a scheduler relaunches the job: a new torchrun, its restart count 0 again, every rank
    # calling callback.resume(args) and passing no attempt
    job.run_to_end(attempt=0, restart=True, **common)

    # THEN every rank resumed from checkpoint-3 and saved checkpoint-6 again, and checkpoint-6 is
    # complete from the new launch's shards only: attempt 1 on both ranks, one launch id
    for result in job.rank_results():
        assert result["restart"]["step"] == SAVE_STEPS
    after = checkpoint_rows(db, job_id)
    print(f"checkpoints (step: run_attempt, world_size, shards, complete): {after}")
    assert after[KILL_AT_SAVE] == (1, WORLD, WORLD, True)
    rows = shard_rows(db, job_id)
    relaunched = [rows[(KILL_AT_SAVE, rank)] for rank in range(WORLD)]
    assert [r["run_attempt"] for r in relaunched] == [1] * WORLD
    launch_ids = {r["extra"]["launch_id"] for r in relaunched}
    assert len(launch_ids) == 1 and None not in launch_ids
    assert pipeline.dlq_depth() == 0

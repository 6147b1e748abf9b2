"""Plain torch, for real: two FSDP2 ranks over gloo save DCP checkpoints, one rank is SIGKILLed
inside a save with the other's reports still in its spool, and the restart's call sends them and
resumes from the newest complete checkpoint; asserted on the rows the real writer stored through
moto's SQS and on the files DCP wrote."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from tests.integrations.sharded_helpers import (
    Checkpoint,
    assert_resumed_from,
    checkpoints,
    run_job,
)
from trainer_client.restart.lookup import latest_complete_checkpoint

pytestmark = pytest.mark.slow

JOB = "tests.integrations.dcp_job"
EVERY = 2
KILL_AT = 6
MAX_STEPS = 8


def check_rank_parts(step: int, checkpoint: Checkpoint, ckpt_dir: Path) -> None:
    """Both ranks reported the step's directory, each its own shard; rank 0 also .metadata."""
    directory = ckpt_dir / f"step-{step}"
    assert checkpoint.complete and checkpoint.world_size == 2, (step, checkpoint)
    assert {s.uri for s in checkpoint.shards.values()} == {directory.as_uri()}
    assert checkpoint.shards[0].files == [".metadata", "__0_0.distcp"]
    assert checkpoint.shards[1].files == ["__1_0.distcp"]
    for rank, shard in checkpoint.shards.items():
        assert shard.bytes == sum((directory / f).stat().st_size for f in shard.files), rank


@pytest.mark.parametrize("async_save", [False, True], ids=["save", "async_save"])
def test_fsdp2_rank_killed_inside_a_save_resumes_from_the_previous_complete_checkpoint(
    pipeline_factory: PipelineFactory, tmp_path: Path, async_save: bool
) -> None:
    job = f"dcp-{uuid.uuid4().hex[:8]}"
    ckpt = tmp_path / "ckpt"
    with pipeline_factory() as pipeline:
        url = pipeline.database_url
        # GIVEN a two-rank FSDP2 job saving through DCP every 2 steps, whose rank 1 is SIGKILLed
        # inside the save of step 6, after writing its shard, and whose rank 0's reports never
        # left its spool (its SQS frozen: what a kill leaves on a busy machine, where the
        # finisher and the sender are behind)
        code = run_job(
            JOB,
            pipeline,
            job,
            tmp_path,
            tmp_path / "run-0",
            max_steps=MAX_STEPS,
            every_n_steps=EVERY,
            kill_rank=1,
            kill_at_step=KILL_AT,
            freeze_sqs_rank=0,
            async_save=async_save,
        )
        assert code != 0, (tmp_path / "run-0" / "job.log").read_text()
        settle(pipeline)

        # THEN no checkpoint is complete in the database yet, and step 6's shard of rank 1 is on
        # disk while DCP's .metadata (the commit) is not
        before = checkpoints(url, job)
        assert not any(checkpoint.complete for checkpoint in before.values()), before
        assert all(0 not in checkpoint.shards for checkpoint in before.values()), before
        assert (ckpt / f"step-{KILL_AT}" / "__1_0.distcp").exists()
        assert not (ckpt / f"step-{KILL_AT}" / ".metadata").exists()

        # WHEN the job is launched again and makes the restart's call (resume(reporter))
        code = run_job(
            JOB,
            pipeline,
            job,
            tmp_path,
            tmp_path / "run-1",
            max_steps=MAX_STEPS,
            every_n_steps=EVERY,
            restart=True,
            restart_count=1,
            async_save=async_save,
        )
        assert code == 0, (tmp_path / "run-1" / "job.log").read_text()
        settle(pipeline)

        # THEN both ranks started from step 4 and the loss continues exactly where it was: the
        # steps the killed run trained after step 4 give the same losses again
        assert_resumed_from(4, tmp_path / "run-0", tmp_path / "run-1", later=("5", "6"))
        # ... the new attempt's checkpoints are complete, each rank reporting its own files
        after = checkpoints(url, job)
        for step in (2, 4):
            assert after[step].run_attempt == 0
            check_rank_parts(step, after[step], ckpt)
        for step in (KILL_AT, MAX_STEPS):
            assert after[step].run_attempt == 1
            check_rank_parts(step, after[step], ckpt)
        final = latest_complete_checkpoint(job, database_url=url)
        assert final is not None and (final.step, final.run_attempt) == (MAX_STEPS, 1)
        assert pipeline.dlq_depth() == 0

        # AND a complete checkpoint that lost its commit marker is passed over: the resume
        # checks every file each rank reported
        (ckpt / f"step-{MAX_STEPS}" / ".metadata").unlink()
        older = latest_complete_checkpoint(job, database_url=url)
        assert older is not None and older.step == KILL_AT

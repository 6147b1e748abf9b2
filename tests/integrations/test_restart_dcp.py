"""A fresh-node restart of a 2-rank FSDP2 job (gloo, CPU) whose DCP checkpoints go straight to S3
(``s3torchconnector``'s writer on moto), with a killed rank.

Attempt 0 saves every 2 steps; rank 1 is SIGKILLed right after step 6's save returned, with its
report of step 6 durable in its spool and never sent (its SQS relay frozen:
tests/integrations/sqs_gate.py); the launcher kills rank 0. The spool survives (the EFS
stand-in); the node's disk is new. The restart (torchrun's restart count 1): every rank's
``resume(reporter)`` sends its spool, rank 0 waits for the writer to store what was sent,
decides step 6 (not 4) for every rank, the checkpoint is restored once on this node, verified,
and ``dcp.load`` reads every rank's part from there."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from tests.integrations.sharded_helpers import checkpoints, progress, run_job
from trainer_client.restart.lookup import latest_complete_checkpoint

pytest.importorskip("s3torchconnector")
pytestmark = pytest.mark.slow

JOB = "tests.integrations.dcp_job"
EVERY = 2
KILL_AT = 6
MAX_STEPS = 8


def test_fsdp2_restart_resumes_from_the_step_whose_report_was_in_a_spool(
    pipeline_factory: PipelineFactory, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    job = f"dcp-restart-{uuid.uuid4().hex[:8]}"
    prefix = f"s3://{s3_bucket}/{job}"
    with pipeline_factory() as pipeline:
        db = pipeline.database_url
        # GIVEN attempt 0, whose rank 1 dies with step 6's report durable in its spool
        run0 = tmp_path / "run-0"
        code = run_job(
            JOB, pipeline, job, tmp_path, run0, max_steps=MAX_STEPS, every_n_steps=EVERY,
            upload_to=prefix, freeze_sqs_kill_rank=1, freeze_sqs_kill_at_step=KILL_AT,
        )  # fmt: skip
        log0 = (run0 / "job.log").read_text()
        assert code == 1 and "rank 1 exited -9" in log0, log0[-3000:]
        settle(pipeline)
        before = checkpoints(db, job)
        assert before[EVERY * 2].complete
        assert not before[KILL_AT].complete and set(before[KILL_AT].shards) == {0}
        # (asked now, the database names the previous checkpoint: what the one call fixes)
        point = latest_complete_checkpoint(job, database_url=db, s3_client=s3)
        assert point is not None and point.step == EVERY * 2

        # WHEN torchrun restarts the job on a fresh node and every rank makes the one call
        run1, node = tmp_path / "run-1", tmp_path / "node"
        code = run_job(
            JOB, pipeline, job, tmp_path, run1, max_steps=MAX_STEPS, every_n_steps=EVERY,
            upload_to=prefix, restart=True, restart_count=1, restore_to=str(node),
        )  # fmt: skip
        assert code == 0, (run1 / "job.log").read_text()[-3000:]
        settle(pipeline)

        # THEN every rank resumed from step 6, restored from S3 once on this node, and trained
        # steps 7..8 from there
        decided = [json.loads((run1 / f"restart-{r}.json").read_text()) for r in (0, 1)]
        print(f"restart per rank: {decided}")
        log1 = (run1 / "job.log").read_text()
        assert [d["step"] for d in decided] == [KILL_AT, KILL_AT], log1[-6000:]
        assert [d["path"] for d in decided] == [str(node / f"step-{KILL_AT}")] * 2
        assert sorted(d["source"] for d in decided) == ["manifest", "store"]
        assert sorted(p.name for p in (node / f"step-{KILL_AT}").iterdir()) == [
            ".ckpt-restore.json",
            ".metadata",
            "__0_0.distcp",
            "__1_0.distcp",
        ]
        # AND every file was checked against the SHA-256 of what DCP wrote (hash_uploads)
        manifest = json.loads((node / f"step-{KILL_AT}" / ".ckpt-restore.json").read_text())
        assert [len(sha or "") for _name, _size, sha in manifest] == [64, 64, 64]
        for rank in (0, 1):
            resumed = progress(run1, rank)
            assert resumed["start_step"] == KILL_AT
            assert sorted(resumed["losses"], key=int) == [str(s) for s in (7, 8)]
        # AND the database: step 6 complete with the killed rank's report of attempt 0
        after = checkpoints(db, job)
        print(f"killed rank's report: step {KILL_AT} rank 1 {after[KILL_AT].shards[1]}")
        assert after[KILL_AT].complete and after[KILL_AT].run_attempt == 0
        assert after[KILL_AT].shards[1].run_attempt == 0
        assert after[MAX_STEPS].complete and after[MAX_STEPS].run_attempt == 1
        assert pipeline.dlq_depth() == 0

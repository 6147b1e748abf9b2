"""A restart on fewer or more ranks than the checkpoint was saved by: DCP (FSDP2) reshards and
resumes with the saved state, the HF ``Trainer`` (DDP) resumes and says whose RNG state has no
rank, DeepSpeed ZeRO refuses on every rank before training, Lightning's DDP (one file holding
the whole state) resumes 2 → 1 through the restart and says so. Real gloo ranks, the real
writer."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt_pipeline.local.pipeline import LocalPipeline
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from tests.integrations.hf_job import HfJob, kill_all
from tests.integrations.sharded_helpers import progress, run_job
from tests.integrations.test_lightning import EVERY_N_STEPS
from tests.integrations.test_lightning import launch as lightning_launch
from trainer_client.restart.world import note, refusal

LINE = "was saved by"


def test_what_follows_the_ranks_is_read_from_the_checkpoint_names() -> None:
    hf = ["model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"]
    # GIVEN an HF DDP checkpoint of 2 ranks resumed by 1: both files lose their rank
    line = note(hf, step=3, saved=2, now=1)
    assert line is not None and "rank(s) 0, 1 (rng_state_0.pth, rng_state_1.pth)" in line
    assert "rank(s) 0 start from a fresh RNG state" in line
    # AND by 4: ranks 2 and 3 have no file
    line = note(hf, step=3, saved=2, now=4)
    assert line is not None and "rank(s) 2, 3 start from a fresh RNG state" in line
    assert note(hf, step=3, saved=2, now=2) is None
    # DCP reshards; Lightning's DDP checkpoint is one file
    assert "DCP reshards" in (note([".metadata", "__0_0.distcp"], step=1, saved=4, now=2) or "")
    assert "one file" in (note([""], step=1, saved=2, now=1) or "")
    # DeepSpeed ZeRO partitions refuse, naming both sizes and what to do
    zero = ["global_step3/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "rng_state_0.pth"]
    why = refusal(zero, step=3, saved=1, now=2)
    assert why is not None and "saved by 1 ranks" in why and "has 2 ranks" in why
    assert "Relaunch with 1 ranks" in why and "load_universal" in why
    assert refusal(zero, step=3, saved=1, now=1) is None
    assert refusal(hf, step=3, saved=2, now=1) is None


@pytest.mark.slow
@pytest.mark.parametrize(("saved", "now"), [(4, 2), (2, 4)], ids=["4to2", "2to4"])
def test_fsdp2_resumes_at_another_world_size_with_the_saved_state(
    pipeline_factory: PipelineFactory, tmp_path: Path, saved: int, now: int
) -> None:
    job = f"dcp-world-{uuid.uuid4().hex[:8]}"
    with pipeline_factory() as pipeline:
        # GIVEN step 2 saved by `saved` ranks (and the whole state's digest then)
        run0 = tmp_path / "run-0"
        code = run_job(
            "tests.integrations.dcp_job", pipeline, job, tmp_path, run0,
            world=saved, max_steps=2, every_n_steps=2, digests=True,
        )  # fmt: skip
        assert code == 0, (run0 / "job.log").read_text()[-3000:]
        settle(pipeline)
        # WHEN the job restarts with `now` ranks
        run1 = tmp_path / "run-1"
        code = run_job(
            "tests.integrations.dcp_job", pipeline, job, tmp_path, run1,
            world=now, max_steps=3, every_n_steps=2, digests=True, restart=True,
            restart_count=1,
        )  # fmt: skip
        log = (run1 / "job.log").read_text()
        assert code == 0, log[-3000:]
        # THEN every rank loaded exactly the saved state, and trained step 3
        saved_digest = (run0 / "saved-2.txt").read_text()
        for rank in range(now):
            assert (run1 / f"loaded-{rank}.txt").read_text() == saved_digest
            assert progress(run1, rank)["start_step"] == 2
            assert list(progress(run1, rank)["losses"]) == ["3"]
        # AND one line said what the world size change does
        lines = [x for x in log.splitlines() if LINE in x]
        assert len(lines) == 1, log[-3000:]
        assert f"saved by {saved} ranks and this launch has {now}: DCP reshards" in lines[0]


@pytest.fixture
def pipeline(pipeline_factory: PipelineFactory) -> Iterator[LocalPipeline]:
    with pipeline_factory() as running:
        yield running


@pytest.mark.slow
def test_hf_ddp_two_ranks_to_one_resumes_and_says_whose_rng_state_has_no_rank(
    pipeline: LocalPipeline, tmp_path: Path
) -> None:
    job = HfJob(pipeline, f"hf-world-{uuid.uuid4().hex[:8]}", tmp_path)
    # GIVEN checkpoint-3 saved by 2 DDP ranks
    job.run_to_end(attempt=0, world=2, max_steps=3, save_steps=3)
    # WHEN the job restarts with 1 rank
    job.run_to_end(attempt=1, world=1, max_steps=4, save_steps=3, restart=True)
    # THEN it resumed from step 3 and trained step 4
    result = json.loads((job.results / "rank-0.json").read_text())
    assert result["restart"]["step"] == 3 and result["steps"] == [4]
    # AND one line named the RNG files that have no rank now
    lines = [x for x in job.log.read_text().splitlines() if LINE in x]
    assert len(lines) == 1, job.tail()
    assert "saved by 2 ranks and this launch has 1" in lines[0]
    assert "(rng_state_0.pth, rng_state_1.pth) has no rank" in lines[0]


@pytest.mark.slow
def test_deepspeed_zero_refuses_another_world_size_on_every_rank_before_training(
    deepspeed_ops: None, pipeline: LocalPipeline, tmp_path: Path
) -> None:
    job = HfJob(pipeline, f"ds-world-{uuid.uuid4().hex[:8]}", tmp_path)
    # GIVEN checkpoint-2 saved by 1 rank as ZeRO-2 partitions
    job.run_to_end(attempt=0, world=1, max_steps=2, save_steps=2, deepspeed_stage=2)
    # WHEN the job restarts with 2 ranks
    procs = job.launch(
        attempt=1, world=2, max_steps=3, save_steps=2, deepspeed_stage=2, restart=True
    )
    try:
        codes = [proc.wait(timeout=150) for proc in procs]
    finally:
        kill_all(procs)
    # THEN both ranks refused before training, each in one line naming both sizes
    assert all(code != 0 for code in codes), job.tail()
    log = job.log.read_text()
    refusals = [x for x in log.splitlines() if "DeepSpeed ZeRO partitions" in x]
    assert len(refusals) == 2, job.tail()
    assert all("saved by 1 ranks" in x and "this launch has 2 ranks" in x for x in refusals)
    assert not (job.results / "losses-0-attempt-1.json").exists()


@pytest.mark.slow
def test_lightning_ddp_two_ranks_to_one_resumes_from_its_one_file_and_says_so(
    pipeline: LocalPipeline, s3_bucket: str, tmp_path: Path
) -> None:
    job = f"pl-world-{uuid.uuid4().hex[:8]}"
    prefix = f"s3://{s3_bucket}/{job}"
    # GIVEN step=4.ckpt saved by 2 Lightning DDP ranks and uploaded
    run0 = tmp_path / "run0"
    proc = lightning_launch(
        pipeline, job, tmp_path, run0, max_steps=EVERY_N_STEPS, upload_to=prefix
    )
    assert proc.wait(timeout=300) == 0, (run0 / "job.log").read_text()[-3000:]
    settle(pipeline)
    # WHEN the job restarts with 1 rank through the restart
    run1 = tmp_path / "run1"
    proc = lightning_launch(
        pipeline, job, tmp_path, run1, max_steps=EVERY_N_STEPS + 2, upload_to=prefix,
        restart=True, restart_count=1, world=1,
    )  # fmt: skip
    log = (run1 / "job.log").read_text() if proc.wait(timeout=300) == 0 else ""
    assert log, (run1 / "job.log").read_text()[-3000:]
    # THEN it resumed from step 4 (DDP's checkpoint holds the whole state)
    decided = json.loads((run1 / "restart-0.json").read_text())
    assert decided["restart"]["step"] == EVERY_N_STEPS
    # AND one line says what follows the ranks
    lines = [x for x in log.splitlines() if LINE in x]
    assert len(lines) == 1, log[-3000:]
    assert "saved by 2 ranks and this launch has 1: one file holds the whole state" in lines[0]

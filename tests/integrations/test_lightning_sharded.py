"""Lightning's sharded strategies, for real on CPU: two ranks save ModelParallel (FSDP2 + DCP) or
DeepSpeed ZeRO 1 checkpoints, one rank is SIGKILLed inside a save with the other's reports still in
its spool, and the restart's call (``reporting.resume()``) sends them and resumes from the newest
complete checkpoint; asserted on the rows the real writer stored and on the files the framework
wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from tests.integrations.sharded_helpers import (
    JOB_TIMEOUT_S,
    ROOT,
    Checkpoint,
    assert_resumed_from,
    checkpoints,
    needs_cuda,
    run_job,
)
from trainer_client.restart.lookup import latest_complete_checkpoint

pytestmark = pytest.mark.slow

JOB = "tests.integrations.lightning_sharded_job"
EVERY = 2
KILL_AT = 6
MAX_STEPS = 8

# ZeRO 2 and 3 run through the Hugging Face Trainer (tests/integrations/test_huggingface.py);
# every stage's file names are in tests/integrations/test_layouts.py. Each case here is ~1 min
# on a shared 2-core machine.
CASES: dict[str, dict[str, Any]] = {
    "model_parallel": {"strategy": "model_parallel"},
    "deepspeed_zero1": {"strategy": "deepspeed", "stage": 1},
    # CUDA only (bench/sharded_gpu.sh): Lightning refuses FSDP and DeepSpeed on a CPU accelerator.
    "fsdp_sharded_cuda": {"strategy": "fsdp", "state_dict_type": "sharded", "accelerator": "cuda"},
    "fsdp_full_cuda": {
        "strategy": "fsdp",
        "state_dict_type": "full",
        "accelerator": "cuda",
        "kill_rank": 0,  # the rank that writes the one file
    },
    "deepspeed_zero2_cuda": {"strategy": "deepspeed", "stage": 2, "accelerator": "cuda"},
}
PARAMS = [
    pytest.param(case, marks=needs_cuda() if case.endswith("_cuda") else ()) for case in CASES
]


def rank_files(case: str, rank: int) -> list[str]:
    """What each rank must have reported for each strategy (the frameworks' own layouts)."""
    if case in ("model_parallel", "fsdp_sharded_cuda"):
        return [".metadata", "__0_0.distcp", "meta.pt"] if rank == 0 else ["__1_0.distcp"]
    if case == "fsdp_full_cuda":
        return []  # one file, the URI itself (no extra.files)
    zero = [f"checkpoint/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"]
    if rank == 0:
        zero += ["checkpoint/mp_rank_00_model_states.pt", "latest"]
        zero += ["zero_to_fp32.py", "zero_to_torch.py"]
    return sorted(zero)


def check_rank_parts(
    case: str, step: int, checkpoint: Checkpoint, directory: Path, *, whole: bool = True
) -> None:
    """Each stored rank's row holds its own files; ``whole``: every rank's row, complete."""
    assert checkpoint.world_size == 2, (step, checkpoint)
    if whole:
        assert checkpoint.complete and set(checkpoint.shards) == {0, 1}, (step, checkpoint)
    assert {s.uri for s in checkpoint.shards.values()} == {directory.as_uri()}
    for rank, shard in checkpoint.shards.items():
        assert shard.files == rank_files(case, rank), (step, rank)
        if shard.files:
            assert shard.bytes == sum((directory / f).stat().st_size for f in shard.files)
        else:
            assert shard.bytes == directory.stat().st_size


@pytest.mark.parametrize("case", PARAMS)
def test_rank_killed_inside_a_sharded_save_resumes_from_the_previous_complete_checkpoint(
    pipeline_factory: PipelineFactory, tmp_path: Path, case: str, request: pytest.FixtureRequest
) -> None:
    if CASES[case].get("strategy") == "deepspeed":
        request.getfixturevalue("deepspeed_ops")
    job = f"pl-{case.replace('_', '-')}-{uuid.uuid4().hex[:6]}"
    ckpt = tmp_path / "ckpt"
    options = {**CASES[case], "max_steps": MAX_STEPS, "every_n_steps": EVERY}
    kill_rank = options.pop("kill_rank", 1)
    with pipeline_factory() as pipeline:
        url = pipeline.database_url
        # GIVEN a two-rank fit() checkpointing every 2 steps whose rank 1 (rank 0 for a one-file
        # save) is SIGKILLed inside the save of step 6, right after writing its own shard, and
        # whose other rank's reports never left its spool (its SQS frozen: the state a kill
        # leaves on a busy machine, where the finisher and the sender are behind)
        code = run_job(
            JOB,
            pipeline,
            job,
            tmp_path,
            tmp_path / "run-0",
            kill_rank=kill_rank,
            kill_at_step=KILL_AT,
            freeze_sqs_rank=1 - kill_rank,
            **options,
        )
        assert code != 0, (tmp_path / "run-0" / "job.log").read_text()
        settle(pipeline)

        # THEN no checkpoint is complete in the database yet, and what reached it has each
        # rank's own files
        before = checkpoints(url, job)
        assert not any(checkpoint.complete for checkpoint in before.values()), before
        for step, checkpoint in before.items():
            assert 1 - kill_rank not in checkpoint.shards, (step, checkpoint)
            if step < KILL_AT:
                check_rank_parts(case, step, checkpoint, ckpt / f"step={step}.ckpt", whole=False)

        # WHEN the job is launched again and makes the restart's call (reporting.resume())
        code = run_job(JOB, pipeline, job, tmp_path, tmp_path / "run-1", resume=True, **options)
        assert code == 0, (tmp_path / "run-1" / "job.log").read_text()
        settle(pipeline)

        # THEN both ranks started at step 4 and the loss continues where it was: steps 5 and 6
        # give the killed run's losses again
        assert_resumed_from(4, tmp_path / "run-0", tmp_path / "run-1", later=("5", "6"))
        after = checkpoints(url, job)
        for step in (2, 4):
            assert after[step].run_attempt == 0
            check_rank_parts(case, step, after[step], ckpt / f"step={step}.ckpt")
        # (the killed save's directory is still there: ModelCheckpoint saves step 6 beside it)
        for step, name in ((KILL_AT, f"step={KILL_AT}-v1.ckpt"), (MAX_STEPS, "step=8.ckpt")):
            assert after[step].run_attempt == 1
            check_rank_parts(case, step, after[step], ckpt / name)
        final = latest_complete_checkpoint(job, database_url=url)
        assert final is not None and (final.step, final.run_attempt) == (MAX_STEPS, 1)
        assert pipeline.dlq_depth() == 0


def test_fsdp_strategy_save_code_writes_the_layout_each_rank_reports(tmp_path: Path) -> None:
    # GIVEN Lightning's FSDPStrategy saving on two gloo ranks (its save code only: it cannot
    # train on CPU), once with a sharded and once with a full state dict
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.integrations.lightning_fsdp_save", str(tmp_path)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = [json.loads((tmp_path / f"result-{r}.json").read_text()) for r in (0, 1)]
    # THEN sharded: DCP's layout plus meta.pt, each rank owning its shard, rank 0 the commit
    sharded = tmp_path / "sharded" / "step=4.ckpt"
    assert sorted(p.name for p in sharded.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "meta.pt",
    ]
    assert [r["sharded"]["layout"] for r in results] == ["dcp", "dcp"]
    assert results[0]["sharded"]["files"] == [".metadata", "__0_0.distcp", "meta.pt"]
    assert results[1]["sharded"]["files"] == ["__1_0.distcp"]
    assert results[0]["sharded"]["io_wrote"] == results[1]["sharded"]["io_wrote"] == []
    # ... full: one file, written by rank 0 through CheckpointIO (reported as DDP's file)
    full = str(tmp_path / "full" / "step=4.ckpt")
    assert [r["full"]["layout"] for r in results] == ["file", "file"]
    assert results[0]["full"]["io_wrote"] == [full] and results[1]["full"]["io_wrote"] == []

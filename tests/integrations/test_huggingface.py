"""The Hugging Face Trainer callback with real training: two gloo ranks on CPU, a SIGKILL, a resume.

Every report goes through the real path: the callback's CheckpointReporter spools it, sends it to
moto's SQS, the local event source hands it to the real writer, which stores it in PostgreSQL;
the assertions read the rows it stored.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_pipeline.local.pipeline import LocalPipeline
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from tests.integrations.hf_job import (
    KILL_AT_SAVE,
    MAX_STEPS,
    RUN_TIMEOUT_S,
    SAVE_STEPS,
    WORLD,
    HfJob,
    checkpoint_rows,
    shard_rows,
)
from tests.integrations.sharded_helpers import needs_cuda
from tests.trainer_client.helpers import REPO_ROOT, child_env
from trainer_client.restart.lookup import latest_complete_checkpoint


@pytest.fixture
def pipeline(pipeline_factory: PipelineFactory) -> Iterator[LocalPipeline]:
    with pipeline_factory() as running:
        yield running


@pytest.mark.slow
def test_two_gloo_ranks_sigkill_and_resume_from_the_database(
    pipeline: LocalPipeline, tmp_path: Path
) -> None:
    job = HfJob(pipeline, f"hf-{uuid.uuid4().hex[:10]}", tmp_path)
    job_id, out, db = job.job_id, job.out, job.db

    # GIVEN a 2-rank DDP job whose rank 1 is SIGKILLed after writing checkpoint-6, before
    # reporting it; the job is killed and its spools sent
    job.kill_rank_1(kill_rank=1, kill_at_save=KILL_AT_SAVE)
    job.send_spools(attempt=0)

    # THEN checkpoint-3 is complete, checkpoint-6 has rank 0's shard only, though rank 1's file of
    # it is on disk: written but never reported does not count
    rows = checkpoint_rows(db, job_id)
    assert rows[SAVE_STEPS] == (0, WORLD, WORLD, True)
    assert rows[KILL_AT_SAVE] == (0, WORLD, 1, False)
    assert (out / f"checkpoint-{KILL_AT_SAVE}" / "rng_state_1.pth").exists()
    shards = shard_rows(db, job_id)
    ckpt3 = out / f"checkpoint-{SAVE_STEPS}"
    # Every rank reports the checkpoint directory; each lists only the files it wrote, all there.
    assert {shards[(SAVE_STEPS, r)]["uri"] for r in range(WORLD)} == {ckpt3.resolve().as_uri()}
    files0 = shards[(SAVE_STEPS, 0)]["extra"]["files"]
    assert {"model.safetensors", "optimizer.pt", "trainer_state.json", "rng_state_0.pth"} <= set(
        files0
    )
    assert "rng_state_1.pth" not in files0
    assert shards[(SAVE_STEPS, 1)]["extra"]["files"] == ["rng_state_1.pth"]
    for rank in range(WORLD):
        listed = shards[(SAVE_STEPS, rank)]["extra"]["files"]
        assert shards[(SAVE_STEPS, rank)]["bytes"] == sum(
            (ckpt3 / name).stat().st_size for name in listed
        )
        assert shards[(SAVE_STEPS, rank)]["loss"] is not None
    assert pipeline.dlq_depth() == 0

    # AND the resume helper names checkpoint-3
    point = latest_complete_checkpoint(job_id, database_url=db)
    assert point is not None and point.step == SAVE_STEPS and point.path == str(ckpt3.resolve())

    # WHEN the job restarts (attempt 1) and resumes from the database's answer
    job.run_to_end(attempt=1, resume=True)

    # THEN both ranks resumed from checkpoint-3 and trained steps 4..9 only
    for result in job.rank_results():
        assert result["resumed_from"] == str(ckpt3.resolve())
        assert result["steps"] == list(range(SAVE_STEPS + 1, MAX_STEPS + 1))
        assert result["reported_steps"] == [6, 9] and result["failures"] == 0
    # AND the rows: checkpoint-3 of attempt 0; checkpoint-6 re-saved by attempt 1 replaced the
    # partial attempt 0 and is complete; checkpoint-9 complete; one row per checkpoint
    assert checkpoint_rows(db, job_id) == {
        3: (0, WORLD, WORLD, True),
        6: (1, WORLD, WORLD, True),
        9: (1, WORLD, WORLD, True),
    }
    shards = shard_rows(db, job_id)
    assert {shards[(6, r)]["run_attempt"] for r in range(WORLD)} == {1}
    final = latest_complete_checkpoint(job_id, database_url=db)
    assert final is not None and final.step == MAX_STEPS and final.run_attempt == 1
    assert pipeline.dlq_depth() == 0


@pytest.mark.slow
def test_train_that_raises_still_flushes_its_reports(
    pipeline: LocalPipeline, tmp_path: Path
) -> None:
    # GIVEN one process whose train() raises at step 5, after checkpoints 2 and 4, and which
    # calls close() in a finally (on_train_end never runs)
    job = HfJob(pipeline, f"hf-{uuid.uuid4().hex[:10]}", tmp_path)
    job_id, out = job.job_id, job.out
    (proc,) = job.launch(attempt=0, world=1, save_steps=2, raise_at_step=5, checksums=True)
    assert proc.wait(timeout=RUN_TIMEOUT_S) == 1, job.tail()
    assert "training failed at step 5" in job.log.read_text()
    # WHEN the pipeline settles, with no restart draining the spool
    settle(pipeline)
    # THEN both checkpoints are complete (world size 1): close() sent them before the exit
    assert checkpoint_rows(pipeline.database_url, job_id) == {
        2: (0, 1, 1, True),
        4: (0, 1, 1, True),
    }
    shard = shard_rows(pipeline.database_url, job_id)[(4, 0)]
    files = shard["extra"]["files"]
    assert {"rng_state.pth", "model.safetensors", "trainer_state.json"} <= set(files)
    # AND with checksums=True each file's SHA-256 is stored, matching the file on disk
    assert shard["extra"]["file_sha256"] == {
        name: hashlib.sha256((out / "checkpoint-4" / name).read_bytes()).hexdigest()
        for name in files
    }


def test_the_client_imports_no_transformers_and_the_callback_names_its_extra() -> None:
    # GIVEN an interpreter where transformers cannot be imported (as in the base install)
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import trainer_client, trainer_client.integrations\n"
        "from trainer_client.exceptions import ExtraMissing\n"
        "try:\n"
        "    import trainer_client.integrations.huggingface\n"
        "except ExtraMissing as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=child_env(),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    # THEN the client imports, and the callback's import says which extra it needs
    assert "pip install 'ckpt-pipeline[huggingface]'" in done.stdout, done.stderr


# -- the ownership rule, on the file names transformers 5.24 / accelerate 1.16 write -----------

DDP_CHECKPOINT = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "optimizer.pt",
    "scheduler.pt",
    "trainer_state.json",
    "training_args.bin",
    "rng_state_0.pth",
    "rng_state_1.pth",
]
FSDP_SHARDED_CHECKPOINT = [
    "pytorch_model_fsdp_0/.metadata",
    "pytorch_model_fsdp_0/__0_0.distcp",
    "pytorch_model_fsdp_0/__1_0.distcp",
    "optimizer_0/.metadata",
    "optimizer_0/__0_0.distcp",
    "optimizer_0/__1_0.distcp",
    "scheduler.pt",
    "trainer_state.json",
    "rng_state_0.pth",
    "rng_state_1.pth",
]


def _owned(files: list[str], process_index: int, should_save: bool) -> set[str]:
    # Imported here: collecting this module must not cost a transformers import (seconds).
    from trainer_client.integrations.huggingface import owner_of

    return {f for f in files if owner_of(f, process_index=process_index, should_save=should_save)}


def test_ddp_rank_0_owns_the_shared_files_and_others_their_rng_state() -> None:
    assert _owned(DDP_CHECKPOINT, 0, True) == set(DDP_CHECKPOINT) - {"rng_state_1.pth"}
    assert _owned(DDP_CHECKPOINT, 1, False) == {"rng_state_1.pth"}


def test_fsdp_sharded_each_rank_owns_its_dcpshard_rows() -> None:
    assert _owned(FSDP_SHARDED_CHECKPOINT, 1, False) == {
        "pytorch_model_fsdp_0/__1_0.distcp",
        "optimizer_0/__1_0.distcp",
        "rng_state_1.pth",
    }
    assert "pytorch_model_fsdp_0/.metadata" in _owned(FSDP_SHARDED_CHECKPOINT, 0, True)
    assert "pytorch_model_fsdp_0/__1_0.distcp" not in _owned(FSDP_SHARDED_CHECKPOINT, 0, True)
    # Every file has exactly one owner.
    owners = [_owned(FSDP_SHARDED_CHECKPOINT, 0, True), _owned(FSDP_SHARDED_CHECKPOINT, 1, False)]
    assert sorted(owners[0] | owners[1]) == sorted(FSDP_SHARDED_CHECKPOINT)
    assert not owners[0] & owners[1]


def test_required_files_per_process() -> None:
    from trainer_client.integrations.huggingface import required_files

    assert required_files(
        process_index=0, world_size=2, should_save=True, save_only_model=False
    ) == ["rng_state_0.pth", "trainer_state.json"]
    assert required_files(
        process_index=1, world_size=2, should_save=False, save_only_model=False
    ) == ["rng_state_1.pth"]
    assert required_files(
        process_index=0, world_size=1, should_save=True, save_only_model=True
    ) == ["trainer_state.json"]


def _zero_files(stage: int, rank: int, step: int) -> set[str]:
    """The DeepSpeed files of ``rank`` in ``checkpoint-<step>`` (the engine's own layout)."""
    tag = f"global_step{step}"
    files = {f"{tag}/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"}
    if stage == 3:
        files.add(f"{tag}/zero_pp_rank_{rank}_mp_rank_00_model_states.pt")
    elif rank == 0:
        files.add(f"{tag}/mp_rank_00_model_states.pt")
    if rank == 0:
        files |= {"latest", "zero_to_fp32.py"}
    return files


def _sharded_kill_and_resume(
    pipeline: LocalPipeline,
    tmp_path: Path,
    job_id: str,
    expected: list[set[str]],
    **options: Any,
) -> None:
    """A 2-rank sharded job: rank 1 SIGKILLed at checkpoint-6 after its save, then resumed.

    ``expected[r]``: files rank ``r`` must have reported of checkpoint-3 (rank 1 exactly, rank 0
    at least); every file of the checkpoint must have exactly one owner.
    """
    job = HfJob(pipeline, job_id, tmp_path)
    out, db = job.out, job.db

    # GIVEN a 2-rank job whose rank 1 is SIGKILLed once checkpoint-6 is written (the saver's
    # own collectives: every rank's files are there), before it hands them to its finisher
    job.kill_rank_1(kill_rank=1, kill_at_save=KILL_AT_SAVE, **options)
    job.send_spools(attempt=0)

    # THEN checkpoint-3 is complete: each rank reported its own files, rank 0 also the commit
    # markers and the Trainer's shared files; checkpoint-6 has rank 0's part only
    rows = checkpoint_rows(db, job_id)
    assert rows[SAVE_STEPS] == (0, WORLD, WORLD, True)
    assert rows[KILL_AT_SAVE] == (0, WORLD, 1, False)
    shards = shard_rows(db, job_id)
    ckpt3 = out / f"checkpoint-{SAVE_STEPS}"
    assert {shards[(SAVE_STEPS, r)]["uri"] for r in range(WORLD)} == {ckpt3.resolve().as_uri()}
    files = [set(shards[(SAVE_STEPS, r)]["extra"]["files"]) for r in range(WORLD)]
    assert files[1] == expected[1]
    assert expected[0] | {"trainer_state.json"} <= files[0]
    assert not files[0] & files[1]
    on_disk = {p.relative_to(ckpt3).as_posix() for p in ckpt3.rglob("*") if p.is_file()}
    assert files[0] | files[1] == on_disk  # every file of the checkpoint has one owner
    for rank in range(WORLD):
        assert shards[(SAVE_STEPS, rank)]["bytes"] == sum(
            (ckpt3 / name).stat().st_size for name in files[rank]
        )
    point = latest_complete_checkpoint(job_id, database_url=db)
    assert point is not None and point.step == SAVE_STEPS and point.path == str(ckpt3.resolve())

    # WHEN the job restarts (attempt 1) and resumes from the database's answer
    job.run_to_end(attempt=1, resume=True, **options)

    # THEN both ranks resumed from checkpoint-3, trained steps 4..9, and the loss continued:
    # the steps the killed run trained after checkpoint-3 give its losses again
    for rank, result in enumerate(job.rank_results()):
        assert result["resumed_from"] == str(ckpt3.resolve())
        assert result["steps"] == list(range(SAVE_STEPS + 1, MAX_STEPS + 1))
        first, second = job.losses(rank, 0), job.losses(rank, 1)
        for step in range(SAVE_STEPS + 1, KILL_AT_SAVE + 1):
            assert second[str(step)] == pytest.approx(first[str(step)], abs=1e-6), step
    assert checkpoint_rows(db, job_id) == {
        3: (0, WORLD, WORLD, True),
        6: (1, WORLD, WORLD, True),
        9: (1, WORLD, WORLD, True),
    }
    assert pipeline.dlq_depth() == 0


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3], ids=["zero2", "zero3"])
def test_deepspeed_zero_ranks_report_their_own_files_sigkill_and_resume(
    deepspeed_ops: None, pipeline: LocalPipeline, tmp_path: Path, stage: int
) -> None:
    # DeepSpeed's CPU accelerator, gloo: the engine's own save and load
    expected = [_zero_files(stage, 0, SAVE_STEPS), _zero_files(stage, 1, SAVE_STEPS)]
    expected[1].add("rng_state_1.pth")
    _sharded_kill_and_resume(
        pipeline,
        tmp_path,
        f"hf-ds{stage}-{uuid.uuid4().hex[:8]}",
        expected,
        deepspeed_stage=stage,
    )


FSDP_CASES = [
    pytest.param(
        version, kind, marks=needs_cuda(), id=f"fsdp{version}-{kind.split('_')[0].lower()}"
    )
    for version in (1, 2)
    for kind in ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
]


@pytest.mark.slow
@pytest.mark.parametrize(("version", "kind"), FSDP_CASES)
def test_fsdp_ranks_report_their_own_files_sigkill_and_resume(
    pipeline: LocalPipeline, tmp_path: Path, version: int, kind: str
) -> None:
    # accelerate enables FSDP only on an accelerator: on CPU the Trainer silently trains DDP
    expected: list[set[str]] = [set(), {"rng_state_1.pth"}]
    if kind == "SHARDED_STATE_DICT":
        for directory in ("pytorch_model_fsdp_0", "optimizer_0"):
            expected[0] |= {f"{directory}/.metadata", f"{directory}/__0_0.distcp"}
            expected[1].add(f"{directory}/__1_0.distcp")
    _sharded_kill_and_resume(
        pipeline,
        tmp_path,
        f"hf-fsdp{version}-{uuid.uuid4().hex[:8]}",
        expected,
        cuda=True,
        fsdp={"version": version, "state_dict_type": kind},
    )

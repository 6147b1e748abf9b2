"""What the job-running integration tests share: a job's environment, launching a job module,
reading its progress and the database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_pipeline.local.pipeline import LocalPipeline

ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 240.0


def _cuda_devices() -> int:
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def needs_cuda() -> Any:
    """Marks of a case that needs two CUDA GPUs: skipped without them, except under
    ``CKPT_REQUIRE_CUDA=1`` (the GPU script), where a missing GPU fails instead of skipping."""
    required = os.environ.get("CKPT_REQUIRE_CUDA") == "1"
    missing = _cuda_devices() < 2 and not required
    return [
        pytest.mark.cuda,
        pytest.mark.skipif(missing, reason="needs two CUDA GPUs (bench/sharded_gpu.sh)"),
    ]


@dataclass(frozen=True)
class Shard:
    """One stored shard row."""

    run_attempt: int
    uri: str
    files: list[str]
    bytes: int | None


@dataclass(frozen=True)
class Checkpoint:
    """One stored checkpoint row with its shards by rank."""

    run_attempt: int
    world_size: int
    complete: bool
    shards: dict[int, Shard]


def job_env(pipeline: LocalPipeline, job: str, tmp: Path) -> dict[str, str]:
    """The environment of a job's launcher: the pipeline's client settings, the job id, a spool
    and an inductor cache under ``tmp``, one thread per rank, gloo on loopback."""
    return {
        **os.environ,
        **pipeline.client_env(),
        "CKPT_JOB_ID": job,
        "CKPT_SPOOL_DIR": str(tmp / "spool"),
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
    }


def run_job(
    module: str, pipeline: LocalPipeline, job: str, tmp: Path, run_dir: Path, **options: Any
) -> int:
    """Run ``python -m module '<options>'`` (a launcher of two ranks) to its end; its exit code."""
    run_dir.mkdir(parents=True)
    env = job_env(pipeline, job, tmp)
    args = {
        "ckpt_dir": str(tmp / "ckpt"),
        "progress_dir": str(run_dir),
        "database_url": pipeline.database_url,
        **options,
    }
    with (run_dir / "job.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, json.dumps(args)],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            return proc.wait(JOB_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()


def progress(run_dir: Path, rank: int) -> dict[str, Any]:
    """What a rank recorded: pid, start_step, losses by step (as strings)."""
    return dict(json.loads((run_dir / f"progress-{rank}.json").read_text()))


def assert_resumed_from(
    step: int, first_run: Path, second_run: Path, later: tuple[str, ...]
) -> None:
    """Every rank of the second run started at ``step`` and trained the ``later`` steps to the
    first run's losses again (the loss continues exactly where it was)."""
    for rank in (0, 1):
        first, second = progress(first_run, rank), progress(second_run, rank)
        assert second["start_step"] == step
        for name in later:
            assert second["losses"][name] == pytest.approx(first["losses"][name], abs=1e-6)


def checkpoints(url: str, job: str) -> dict[int, Checkpoint]:
    """step -> the stored checkpoint and its shards."""
    with psycopg.connect(url) as conn:
        heads = conn.execute(
            "SELECT step, run_attempt, world_size, is_complete FROM training_checkpoints"
            " WHERE job_id = %s",
            (job,),
        ).fetchall()
        shards = conn.execute(
            "SELECT step, rank, run_attempt, uri, extra, size_bytes FROM training_checkpoint_shards"
            " WHERE job_id = %s",
            (job,),
        ).fetchall()
    result = {int(s): Checkpoint(int(a), int(w), bool(c), {}) for s, a, w, c in heads}
    for step, rank, attempt, uri, extra, size in shards:
        files = list((extra or {}).get("files", []))
        result[int(step)].shards[int(rank)] = Shard(int(attempt), str(uri), files, size)
    return result

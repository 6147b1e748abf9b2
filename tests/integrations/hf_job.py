"""The Hugging Face ``Trainer`` job of the HF tests, from the test's side: launch its two gloo
ranks (tests/integrations/hf_rank.py) as torchrun would, kill rank 1 at checkpoint-6, run an
attempt to its end, and read what the writer stored.

Shared by test_huggingface (the kill-at-save resume, DeepSpeed, FSDP), test_huggingface_s3 and
test_restart_hf (the fresh-node restart): one setup of the Trainer job, one kill scenario.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

from ckpt_pipeline.local.pipeline import LocalPipeline
from tests.e2e.helpers import settle
from tests.torchrun import free_port, torchrun_env
from tests.trainer_client.helpers import REPO_ROOT, child_env, wait_for
from trainer_client import CheckpointReporter

WORLD = 2
SAVE_STEPS = 3
MAX_STEPS = 9
KILL_AT_SAVE = 6  # rank 1 dies at checkpoint-6 (how: the kill options of hf_rank)
# A rank process imports torch + transformers (seconds on 2 cores) and trains 9 tiny steps.
RUN_TIMEOUT_S = 150.0


class HfJob:
    """One job's directories and pipeline: ``spool`` (survives, the EFS stand-in), ``out`` (the
    Trainer's output_dir), ``results`` (what each rank wrote), ``log`` (every rank's output)."""

    def __init__(self, pipeline: LocalPipeline, job_id: str, tmp_path: Path) -> None:
        self.pipeline, self.job_id = pipeline, job_id
        self.spool, self.out = tmp_path / "spool", tmp_path / "out"
        self.results, self.log = tmp_path / "results", tmp_path / "ranks.log"
        self.results.mkdir()

    @property
    def db(self) -> str:
        return self.pipeline.database_url

    def launch(
        self, *, attempt: int, world: int = WORLD, **options: Any
    ) -> list[subprocess.Popen[bytes]]:
        """``world`` rank processes with torchrun's environment (attempt = its restart count)."""
        port = free_port()
        procs = []
        for rank in range(world):
            env = child_env(
                **self.pipeline.client_env(),
                **torchrun_env(rank, world, port),
                TORCHELASTIC_RESTART_COUNT=str(attempt),
                CKPT_JOB_ID=self.job_id,
                CKPT_SPOOL_DIR=str(self.spool),
                CKPT_RESUME_DATABASE_URL=self.db,
                HF_HUB_OFFLINE="1",
                TOKENIZERS_PARALLELISM="false",
                OMP_NUM_THREADS="1",
            )
            args = {
                "output_dir": str(self.out),
                "result_dir": str(self.results),
                "max_steps": MAX_STEPS,
                "save_steps": SAVE_STEPS,
                **options,
            }
            with self.log.open("ab") as stderr:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "tests.integrations.hf_rank", json.dumps(args)],
                        env=env,
                        cwd=REPO_ROOT,
                        stdout=stderr,
                        stderr=stderr,
                    )
                )
        return procs

    def tail(self) -> str:
        return self.log.read_text()[-3000:]

    def run_to_end(self, *, attempt: int, **options: Any) -> None:
        """One attempt whose every rank must exit 0; then the pipeline settles."""
        procs = self.launch(attempt=attempt, **options)
        try:
            codes = [proc.wait(timeout=RUN_TIMEOUT_S) for proc in procs]
        finally:
            kill_all(procs)
        assert codes == [0] * len(procs), self.tail()
        settle(self.pipeline)

    def kill_rank_1(self, **options: Any) -> None:
        """Attempt 0 until rank 1 SIGKILLed itself at checkpoint-KILL_AT_SAVE (``options`` say
        how: ``kill_rank``/``kill_at_save`` or ``freeze_sqs_kill_rank``/``…_at_save``), then the
        job is killed once rank 0 reported that checkpoint (or exited), and the pipeline settles.
        What rank 1's spool holds stays there."""
        procs = self.launch(attempt=0, **options)
        try:
            assert procs[1].wait(timeout=RUN_TIMEOUT_S) == -signal.SIGKILL, self.tail()
            # Rank 0 saved and reported checkpoint-6 on its own (no barrier), then blocks or
            # fails in the next step's all-reduce with its dead peer: wait for its report.
            wait_for(
                lambda: (
                    (KILL_AT_SAVE, 0) in shard_rows(self.db, self.job_id)
                    or procs[0].poll() is not None
                ),
                timeout=RUN_TIMEOUT_S,
                interval=0.5,
            )
        finally:
            kill_all(procs)
        settle(self.pipeline)

    def send_spools(self, attempt: int) -> None:
        """What the next start of each rank does first: send what its spool still holds."""
        for rank in range(WORLD):
            reporter = CheckpointReporter(
                self.pipeline.queues.queue_url,
                job_id=self.job_id,
                spool_dir=self.spool,
                rank=rank,
                world_size=WORLD,
                run_attempt=attempt,
                endpoint_url=self.pipeline.endpoint_url,
                install_signal_handler=False,
                spot_poll=False,
            )
            assert reporter.close(timeout=30.0)
        settle(self.pipeline)

    def rank_results(self) -> list[dict[str, Any]]:
        """What each rank wrote at its end (hf_rank's ``rank-<r>.json``)."""
        return [json.loads((self.results / f"rank-{r}.json").read_text()) for r in range(WORLD)]

    def losses(self, rank: int, attempt: int) -> dict[str, float]:
        path = self.results / f"losses-{rank}-attempt-{attempt}.json"
        return dict(json.loads(path.read_text()))


def kill_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def checkpoint_rows(db: str, job_id: str) -> dict[int, tuple[int, int, int, bool]]:
    """step -> (run_attempt, world_size, shards_present, is_complete)."""
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT step, run_attempt, world_size, shards_present, is_complete"
            " FROM training_checkpoint_progress WHERE job_id = %s",
            (job_id,),
        ).fetchall()
    return {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}


def shard_rows(db: str, job_id: str) -> dict[tuple[int, int], dict[str, Any]]:
    """(step, rank) -> the stored shard row."""
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT step, rank, run_attempt, uri, size_bytes, extra, loss, epoch"
            " FROM training_checkpoint_shards WHERE job_id = %s",
            (job_id,),
        ).fetchall()
    return {
        (r[0], r[1]): {
            "run_attempt": r[2],
            "uri": r[3],
            "bytes": r[4],
            "extra": r[5],
            "loss": r[6],
            "epoch": r[7],
        }
        for r in rows
    }

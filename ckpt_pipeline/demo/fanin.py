"""Many simulated ranks checkpointing at once through the pipeline: the fix's side of the
comparison with :mod:`ckpt_pipeline.demo.direct_write` (demo ``--compare`` and ``bench.fanin``).

Each rank is a thread with its own :class:`CheckpointReporter` (own spool, sender and SQS client),
released together at every checkpoint barrier, as ranks are at a real checkpoint.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from ckpt_pipeline.local.pipeline import LocalPipeline
from trainer_client import CheckpointReporter


@dataclass
class FanInResult:
    """What the ranks reported and when the database had all of it."""

    ranks: int
    checkpoints: int
    reported: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    unflushed_ranks: int = 0
    report_seconds: float = 0.0
    all_rows_seconds: float | None = None
    shards_found: int = 0
    complete_checkpoints: int = 0

    @property
    def expected(self) -> int:
        return self.ranks * self.checkpoints


def fanin_step(checkpoint: int) -> int:
    """The training step of the fan-in's ``checkpoint``-th checkpoint (0-based)."""
    return (checkpoint + 1) * 100


def fanin_uri(step: int, rank: int) -> str:
    """The shard URI a fan-in rank reports (the one URI scheme of the demo, bench and tests)."""
    return f"file:///fanin/{step}/{rank}"


def fanin_rank(
    reporter: Any,
    *,
    rank: int,
    checkpoints: int,
    barrier_wait: Callable[[], object],
    on_report: Callable[[], None],
) -> None:
    """One rank's fan-in: at every checkpoint wait at the barrier, then report its shard."""
    for ckpt in range(checkpoints):
        barrier_wait()
        step = fanin_step(ckpt)
        reporter.report(step=step, epoch=ckpt, uri=fanin_uri(step, rank), loss=0.5)
        on_report()


def count_rows(database_url: str, job_id: str) -> tuple[int, int]:
    """(shard rows, complete checkpoints) of ``job_id``."""
    with psycopg.connect(database_url, application_name="ckpt-monitor") as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM training_checkpoint_shards WHERE job_id = %(j)s),"
            " (SELECT count(*) FROM training_checkpoints WHERE job_id = %(j)s AND is_complete)",
            {"j": job_id},
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _count(lock: threading.Lock, result: Any) -> None:
    with lock:
        result.reported += 1


def run_pipeline_fanin(
    pipeline: LocalPipeline,
    *,
    job_id: str,
    ranks: int,
    checkpoints: int,
    spool_dir: Path,
    timeout_s: float = 600.0,
) -> FanInResult:
    """Report ``checkpoints`` barrier checkpoints from ``ranks`` threads; wait for every row."""
    result = FanInResult(ranks=ranks, checkpoints=checkpoints)
    lock = threading.Lock()
    barrier = threading.Barrier(ranks)

    def rank_main(rank: int) -> None:
        try:
            with CheckpointReporter(
                queue_url=pipeline.queues.queue_url,
                job_id=job_id,
                spool_dir=spool_dir,
                rank=rank,
                world_size=ranks,
                run_attempt=0,
                install_signal_handler=False,
                spot_poll=False,
            ) as reporter:
                fanin_rank(
                    reporter,
                    rank=rank,
                    checkpoints=checkpoints,
                    barrier_wait=barrier.wait,
                    on_report=lambda: _count(lock, result),
                )
                flushed = reporter.flush(timeout=timeout_s)
            if not flushed:
                with lock:
                    result.unflushed_ranks += 1
        except Exception as exc:  # counted: a rank that fails is what the comparison measures
            barrier.abort()
            with lock:
                result.errors[f"{type(exc).__name__}: {exc}"[:160]] += 1

    started = time.monotonic()
    threads = [
        threading.Thread(target=rank_main, args=(r,), name=f"fanin-rank-{r}") for r in range(ranks)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.report_seconds = time.monotonic() - started
    deadline = started + timeout_s
    while True:
        result.shards_found, result.complete_checkpoints = count_rows(pipeline.database_url, job_id)
        if result.shards_found >= result.expected and result.complete_checkpoints >= checkpoints:
            result.all_rows_seconds = time.monotonic() - started
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return result

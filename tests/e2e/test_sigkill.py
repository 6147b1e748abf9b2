"""Scenario 1: real rank processes SIGKILLed at random points of report() and flush(), restarted."""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckpt_pipeline.local.pipeline import LocalPipeline
from tests.e2e.children import next_line, start_rank
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import e2e_seed, settle, shard_uri
from tests.e2e.matrix import FaultMatrix, FaultRow
from tests.e2e.oracle import SentReport, check_database, expected_state
from tests.torchrun import free_port

pytestmark = pytest.mark.slow

RANKS = 4
FLUSH_EVERY = 5
PAUSE_S = 0.02
KILLS_PER_RANK = 6
MIN_KILLS = 20
# While kills are planned a rank has far more steps than it can reach, so a driver thread that
# lags behind its child (2 busy cores) can never miss a kill: every rank is killed exactly
# KILLS_PER_RANK times. The final, unkilled runs all stop at one common step count.
UNREACHABLE_STEPS = 100_000
FINAL_EXTRA_STEPS = 3


@dataclass
class RankRun:
    """What the driver saw of one rank across its restarts."""

    rank: int
    kills: int = 0
    kills_in_flush: int = 0
    starts: int = 0
    reported: int = 0


def _progress(spool: Path, rank: int) -> int:
    path = spool / f"progress-{rank}"
    return int(path.read_text()) if path.exists() else 0


def _drive_rank(
    pipeline: LocalPipeline,
    job: str,
    run: RankRun,
    rng: random.Random,
    spool: Path,
    final_steps: Callable[[], int],
    env: dict[str, str],
) -> None:
    """Start the rank, SIGKILL it at a random point KILLS_PER_RANK times, then let it finish."""
    args: dict[str, Any] = {
        "mode": "train",
        "queue_url": pipeline.queues.queue_url,
        "endpoint_url": pipeline.endpoint_url,
        "job_id": job,
        "rank": run.rank,
        "world_size": RANKS,
        "spool_dir": str(spool),
        "steps": UNREACHABLE_STEPS,
        "flush_every": FLUSH_EVERY,
        "pause_s": PAUSE_S,
        "progress_file": str(spool / f"progress-{run.rank}"),
        "tuning": {"connect_timeout_s": 0.5, "backoff_cap_s": 0.5},
    }
    log = spool / f"rank-{run.rank}.log"
    while run.kills < KILLS_PER_RANK:
        proc = start_rank(args, env=env, log=log)
        run.starts += 1
        ready = next_line(proc)
        assert ready is not None and ready.startswith("ready"), f"rank {run.rank}: {ready}"
        # Aim: after a few more reports (inside report(), between two, or in the training
        # pause), or just after a flush began (inside flush(), sends in flight).
        in_flush = rng.random() < 0.3
        reports_before_kill = rng.randint(0, 3)
        seen = 0
        while (line := next_line(proc)) is not None:
            if line.startswith("reported"):
                run.reported += 1
                seen += 1
                if not in_flush and seen > reports_before_kill:
                    break
            elif line == "flushing" and in_flush:
                break
        time.sleep(rng.uniform(0, 0.03 if in_flush else PAUSE_S * 1.5))  # the random moment
        proc.kill()
        rc = proc.wait(timeout=30)
        _count_remaining_lines(proc, run)
        if rc != -signal.SIGKILL:
            raise AssertionError(f"rank {run.rank} exited with {rc} before its kill; see {log}")
        run.kills += 1
        run.kills_in_flush += int(in_flush)
    proc = start_rank({**args, "steps": final_steps()}, env=env, log=log)
    run.starts += 1
    _finish(proc, run)


def _count_remaining_lines(proc: subprocess.Popen[str], run: RankRun) -> None:
    assert proc.stdout is not None
    run.reported += sum(1 for line in proc.stdout if line.startswith("reported"))


def _finish(proc: subprocess.Popen[str], run: RankRun) -> None:
    while (line := next_line(proc)) is not None:
        run.reported += int(line.startswith("reported"))
        if line.startswith("flushed"):
            assert line == "flushed True", f"rank {run.rank}: {line}"
    assert proc.wait(timeout=30) == 0


@pytest.mark.parametrize("intake", ["per-rank", "packed"])
def test_ranks_sigkilled_at_random_points(
    pipeline_factory: PipelineFactory, fault_matrix: FaultMatrix, tmp_path: Path, intake: str
) -> None:
    # packed: the ranks share a pack relay (CKPT_PACK_RELAY); whichever rank process binds it
    # first is the node leader, so a kill of that rank is a dead leader, and a restarted rank
    # may become the next one (trainer_client/report/pack_relay.py).
    relay = {"CKPT_PACK_RELAY": f"127.0.0.1:{free_port()}"} if intake == "packed" else {}
    seed = e2e_seed()
    print(f"kill seed: {seed} (set CKPT_E2E_SEED={seed} to replay the same kill points)")
    job = "e2e-sigkill"
    runs = [RankRun(rank) for rank in range(RANKS)]
    errors: list[BaseException] = []
    common: list[int] = []
    # Once every rank used up its kills: all of them report up to one step count, so every
    # checkpoint has all its shards.
    barrier = threading.Barrier(
        RANKS,
        action=lambda: common.append(
            max(_progress(tmp_path, r) for r in range(RANKS)) + FINAL_EXTRA_STEPS
        ),
        timeout=120,
    )

    def final_steps() -> int:
        barrier.wait()
        return common[0]

    with pipeline_factory() as pipeline:
        # GIVEN four rank processes reporting checkpoints, SIGKILLed at random moments and
        # restarted on the same spool (job, rank) each time
        def drive(run: RankRun) -> None:
            rng = random.Random(f"{seed}:{run.rank}")
            try:
                env = pipeline.client_env() | relay
                _drive_rank(pipeline, job, run, rng, tmp_path, final_steps, env)
            except BaseException as exc:
                barrier.abort()
                errors.append(exc)

        threads = [threading.Thread(target=drive, args=(run,)) for run in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        stats = settle(pipeline)
        dlq = pipeline.dlq_depth()

    steps = common[0]
    # THEN every (step, rank) is in the database exactly once, and every checkpoint is complete
    sent = [
        SentReport(job, step, rank, 0, RANKS, shard_uri(job, step, rank))
        for step in range(steps)
        for rank in range(RANKS)
    ]
    check = check_database(pipeline.database_url, expected_state(sent))
    kills = sum(r.kills for r in runs)
    # Distinct reports the ranks persisted as done; the lines seen undercount (a kill can land
    # between a report and its line) and re-reports after a kill overcount.
    done = sum(_progress(tmp_path, r.rank) for r in runs)
    fault_matrix.record(
        FaultRow.of(
            "1 SIGKILL ranks at random points"
            + (" (packed per node, the leader among them)" if relay else ""),
            reports_sent=done,
            check=check,
            in_dlq=dlq,
            seed=seed,
            steps_per_rank=steps,
            report_lines_seen=sum(r.reported for r in runs),
            kills=kills,
            kills_in_flush=sum(r.kills_in_flush for r in runs),
            process_starts=sum(r.starts for r in runs),
            deliveries=stats.records,
        )
    )
    assert kills >= MIN_KILLS
    assert done == RANKS * steps
    assert check.problems == []
    assert check.complete_found == steps
    assert dlq == 0

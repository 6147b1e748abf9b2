"""Scenarios 1 and 2: real rank processes SIGKILLed mid-report/flush, SIGTERMed, Spot-noticed."""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from ckpt_pipeline.local_pipeline import LocalPipeline
from tests.e2e.children import next_line, start_rank, wait_line
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import TcpRelay, e2e_seed, settle, shard_uri
from tests.e2e.matrix import FaultMatrix, FaultRow
from tests.e2e.oracle import SentReport, check_database, expected_state
from tests.trainer_client.test_spot import NOTICE, FakeImds, _handler

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
        proc = start_rank(args, env=pipeline.client_env(), log=log)
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
    proc = start_rank({**args, "steps": final_steps()}, env=pipeline.client_env(), log=log)
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


def test_ranks_sigkilled_at_random_points(
    pipeline_factory: PipelineFactory, fault_matrix: FaultMatrix, tmp_path: Path
) -> None:
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
                _drive_rank(pipeline, job, run, rng, tmp_path, final_steps)
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
            "1 SIGKILL ranks at random points",
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


@contextmanager
def _fake_imds() -> Iterator[tuple[FakeImds, str]]:
    state = FakeImds()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _sqs_relay(pipeline: LocalPipeline) -> TcpRelay:
    """A cut-able path from the rank processes to SQS (the writer's own path stays up)."""
    parts = urlsplit(pipeline.endpoint_url)
    assert parts.hostname is not None and parts.port is not None
    return TcpRelay((parts.hostname, parts.port))


def _hold_args(pipeline: LocalPipeline, relay: TcpRelay, job: str, rank: int, spool: Path) -> Any:
    return {
        "mode": "hold",
        "queue_url": pipeline.queues.queue_url,
        "endpoint_url": relay.url_for(),
        "job_id": job,
        "rank": rank,
        "world_size": 2,
        "spool_dir": str(spool),
        "steps": 4,
    }


def test_sigterm_with_pending_reports_flushes_then_dies_of_sigterm(
    pipeline_factory: PipelineFactory, fault_matrix: FaultMatrix, tmp_path: Path
) -> None:
    job = "e2e-sigterm"
    with pipeline_factory() as pipeline:
        relay = _sqs_relay(pipeline)  # not started: SQS unreachable for the ranks
        tuning = {"connect_timeout_s": 0.3, "backoff_base_s": 0.05, "backoff_cap_s": 0.3}
        procs = [
            start_rank(
                {**_hold_args(pipeline, relay, job, rank, tmp_path), "tuning": tuning},
                env=pipeline.client_env(),
                log=tmp_path / f"rank-{rank}.log",
            )
            for rank in range(2)
        ]
        # GIVEN two ranks holding 4 unsent reports each (their sends fail)
        for proc in procs:
            assert wait_line(proc, "pending") == "pending 4"
        # WHEN torchrun sends SIGTERM while SQS is still unreachable, and SQS returns later
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        time.sleep(1.5)  # hold the outage open: the ranks must keep flushing, not exit
        still_flushing = [proc.poll() is None for proc in procs]
        relay.start()
        try:
            codes = [proc.wait(timeout=30) for proc in procs]
            stats = settle(pipeline)
        finally:
            relay.stop()
        dlq = pipeline.dlq_depth()

    sent = [SentReport(job, s, r, 0, 2, shard_uri(job, s, r)) for s in range(4) for r in range(2)]
    check = check_database(pipeline.database_url, expected_state(sent))
    fault_matrix.record(
        FaultRow.of(
            "2a SIGTERM with pending reports",
            reports_sent=len(sent),
            check=check,
            in_dlq=dlq,
            exit_codes=codes,
            deliveries=stats.records,
        )
    )
    # THEN they flushed during the grace period, then died of the chained SIGTERM (SIG_DFL)
    assert still_flushing == [True, True]
    assert codes == [-signal.SIGTERM, -signal.SIGTERM]
    assert check.problems == []
    assert check.complete_found == 4
    assert dlq == 0


def test_spot_notice_flushes_pending_reports(
    pipeline_factory: PipelineFactory, fault_matrix: FaultMatrix, tmp_path: Path
) -> None:
    job = "e2e-spot"
    with pipeline_factory() as pipeline, _fake_imds() as (imds, imds_url):
        relay = _sqs_relay(pipeline)
        # A 600 s backoff: without the notice the reports would wait that long after SQS is back.
        tuning = {
            "connect_timeout_s": 0.3,
            "backoff_base_s": 600,
            "backoff_cap_s": 600,
            "spot_poll_interval_s": 0.05,
        }
        procs = [
            start_rank(
                {
                    **_hold_args(pipeline, relay, job, rank, tmp_path),
                    "tuning": tuning,
                    "spot_poll": True,
                },
                env={**pipeline.client_env(), "CKPT_IMDS_ENDPOINT": imds_url},
                log=tmp_path / f"rank-{rank}.log",
            )
            for rank in range(2)
        ]
        # GIVEN two ranks whose reports are pending after failed sends, SQS back meanwhile
        for proc in procs:
            assert wait_line(proc, "pending") == "pending 4"
        relay.start()
        try:
            # WHEN the 2-minute interruption notice appears on IMDS
            imds.notice = NOTICE
            flushed = [wait_line(proc, "spot-flushed", timeout=30) for proc in procs]
            # ... and the instance shuts down (SIGTERM)
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            codes = [proc.wait(timeout=30) for proc in procs]
            stats = settle(pipeline)
        finally:
            relay.stop()
        dlq = pipeline.dlq_depth()

    sent = [SentReport(job, s, r, 0, 2, shard_uri(job, s, r)) for s in range(4) for r in range(2)]
    check = check_database(pipeline.database_url, expected_state(sent))
    fault_matrix.record(
        FaultRow.of(
            "2b Spot notice (fake IMDS) with pending reports",
            reports_sent=len(sent),
            check=check,
            in_dlq=dlq,
            exit_codes=codes,
            imds_unauthorised=imds.unauthorised,
            deliveries=stats.records,
        )
    )
    # THEN the notice flushed everything at once, and SIGTERM still ends the process as SIGTERM
    assert flushed == ["spot-flushed 0", "spot-flushed 0"]
    assert codes == [-signal.SIGTERM, -signal.SIGTERM]
    assert imds.unauthorised == 0
    assert check.problems == []
    assert check.complete_found == 4
    assert dlq == 0

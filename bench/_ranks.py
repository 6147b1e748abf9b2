"""Simulated ranks in worker processes: many rank threads per process, one reporter per rank.

A reporter that builds its own boto3 session and SQS client costs ~0.12 s of CPU and ~8 MB, all
under one GIL: 4,096 of them would take minutes to start on 2 cores. So the simulated ranks of
one process share one SQS client (boto3 clients are thread-safe; built with the reporter's own
timeouts and single attempt, a connection pool as large as the process's ranks), while each rank
keeps what a real rank has of its own: its spool (file, lock, fsync) and its sender thread. The
ranks are spread over a few spawned processes. Ranks meet at a two-level
barrier: the ranks of a process at a ``threading.Barrier`` whose action (run by one thread)
waits at a ``multiprocessing`` barrier shared with the other processes and the parent, so every
rank of every process is released together and the parent knows when.

The functions here are process entry points: top level, picklable arguments only.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import queue
import resource
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from ckpt_pipeline.demo.fanin import fanin_rank

# How long any barrier waits before the run is declared broken (a rank crashed).
BARRIER_TIMEOUT_S = 600.0


@dataclass
class WorkerResult:
    """What one worker process's ranks did."""

    ranks: int
    reported: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    unflushed_ranks: int = 0
    ready_s: float = 0.0
    # time.monotonic() (system-wide on Linux, so comparable with the parent's) when the last
    # rank of this process had every report acknowledged by SQS.
    flushed_at: float = 0.0
    # Per phase (lag benchmark): reports made, wall seconds, worst lateness against the schedule.
    phase_reported: list[int] = field(default_factory=list)
    phase_wall_s: list[float] = field(default_factory=list)
    phase_max_slip_s: list[float] = field(default_factory=list)
    # CPU seconds of this process from each phase's release to the next one's (the last phase's
    # runs to the end, the final flush included).
    phase_cpu_s: list[float] = field(default_factory=list)
    # Building this process's reporters: CPU seconds and resident-memory growth (max RSS).
    build_cpu_s: float = 0.0
    build_rss_mb: float = 0.0
    cpu_s: float = 0.0


READ_TIMEOUT_VAR = "CKPT_BENCH_CLIENT_READ_TIMEOUT_S"
# The fan-in's rank processes' sys.setswitchinterval (seconds), when set. A real rank has one
# trainer thread and one sender under its GIL; here hundreds of ranks share one, and with
# CPython's default 5 ms every thread waiting for it wakes every 5 ms to ask for a switch: at a
# barrier, with 512 runnable ranks per process and more processes than cores, those wake-ups
# cost more CPU than the reports (BENCHMARKS §1).
SWITCH_INTERVAL_VAR = "CKPT_BENCH_SWITCH_INTERVAL_S"


def shared_client(ranks: int) -> Any:
    """One SQS client for the simulated ranks of a process, configured as a reporter's own."""
    import boto3
    from botocore.config import Config

    timeout = float(os.environ.get(READ_TIMEOUT_VAR, "5"))
    return boto3.session.Session().client(
        "sqs",
        config=Config(
            connect_timeout=5,
            read_timeout=timeout,
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=max(10, ranks),
        ),
    )


def _reporter(
    queue_url: str, job_id: str, spool_dir: str, rank: int, world_size: int, client: Any
) -> Any:
    from trainer_client import CheckpointReporter

    return CheckpointReporter(
        queue_url=queue_url,
        sqs_client=client,
        job_id=job_id,
        spool_dir=Path(spool_dir),
        rank=rank,
        world_size=world_size,
        run_attempt=0,
        install_signal_handler=False,
        spot_poll=False,
        # The local SQS stand-in slows with queue depth; a longer read timeout keeps a slow
        # answer from turning into a resend (bench.fanin --client-read-timeout-s).
        read_timeout_s=float(os.environ.get(READ_TIMEOUT_VAR, "5")),
    )


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:160]


def fanin_worker(
    env: dict[str, str],
    queue_url: str,
    job_id: str,
    ranks: list[int],
    world_size: int,
    checkpoints: int,
    spool_dir: str,
    barrier: Any,
    results: Any,
    flush_timeout_s: float,
) -> None:
    """Ranks ``ranks``: build reporters, then ``checkpoints`` barrier reports, flush, close."""
    os.environ.update(env)
    if SWITCH_INTERVAL_VAR in os.environ:
        sys.setswitchinterval(float(os.environ[SWITCH_INTERVAL_VAR]))
    started = time.monotonic()
    result = WorkerResult(ranks=len(ranks))
    lock = threading.Lock()
    ready: list[float] = []

    cpu0, rss0 = time.process_time(), _max_rss_mb()
    client = shared_client(len(ranks))

    def across_processes() -> None:
        if not ready:
            ready.append(time.monotonic() - started)
            result.build_cpu_s = time.process_time() - cpu0
            result.build_rss_mb = _max_rss_mb() - rss0
        barrier.wait(BARRIER_TIMEOUT_S)

    local = threading.Barrier(len(ranks), action=across_processes)

    def counted() -> None:
        with lock:
            result.reported += 1

    def rank_main(rank: int) -> None:
        try:
            with _reporter(queue_url, job_id, spool_dir, rank, world_size, client) as reporter:
                fanin_rank(
                    reporter,
                    rank=rank,
                    checkpoints=checkpoints,
                    barrier_wait=lambda: local.wait(BARRIER_TIMEOUT_S),
                    on_report=counted,
                )
                flushed = reporter.flush(timeout=flush_timeout_s)
            with lock:
                result.flushed_at = max(result.flushed_at, time.monotonic())
                result.unflushed_ranks += 0 if flushed else 1
        except Exception as exc:  # counted: a failing rank is what the benchmark measures
            local.abort()
            barrier.abort()  # the other processes and the parent stop waiting for this one
            with lock:
                result.errors[_error(exc)] += 1

    threads = [threading.Thread(target=rank_main, args=(r,), name=f"rank-{r}") for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.ready_s = ready[0] if ready else time.monotonic() - started
    result.cpu_s = time.process_time() - cpu0
    results.put(result)


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def paced_worker(
    env: dict[str, str],
    queue_url: str,
    job_id: str,
    ranks: list[int],
    world_size: int,
    phases: list[tuple[float, float, int]],
    spool_dir: str,
    barrier: Any,
    results: Any,
    flush_timeout_s: float,
) -> None:
    """Open-loop paced reports: per phase ``(total_rate, seconds, first_step)``, all ranks.

    Each rank reports at its own fixed schedule (``world_size / total_rate`` apart, ranks evenly
    phase-shifted), whether or not earlier reports have been sent: the arrival rate does not
    adapt to the pipeline, so a slow pipeline shows up as lag and backlog, not as a lower rate.
    """
    os.environ.update(env)
    started = time.monotonic()
    result = WorkerResult(ranks=len(ranks))
    lock = threading.Lock()
    ready: list[float] = []
    # The parent hands out each phase's start time (wall clock, same machine) at the barrier.
    starts: list[float] = []
    phase_cpu_marks: list[float] = []

    def across_processes() -> None:
        phase_cpu_marks.append(time.process_time())
        if not ready:
            ready.append(time.monotonic() - started)
        barrier.wait(BARRIER_TIMEOUT_S)
        # Half a second after the release: every rank thread is waiting for its first slot.
        starts.append(time.time() + 0.5)

    local = threading.Barrier(len(ranks), action=across_processes)
    cpu0 = time.process_time()
    client = shared_client(len(ranks))
    counts = [[0] * len(phases) for _ in ranks]
    slips = [[0.0] * len(phases) for _ in ranks]

    def rank_main(index: int, rank: int) -> None:
        try:
            with _reporter(queue_url, job_id, spool_dir, rank, world_size, client) as reporter:
                for p, (rate, seconds, first_step) in enumerate(phases):
                    local.wait(BARRIER_TIMEOUT_S)
                    interval = world_size / rate
                    t0 = starts[p] + interval * rank / world_size
                    k = 0
                    while (due := t0 + k * interval) < starts[p] + seconds:
                        delay = due - time.time()
                        if delay > 0:
                            time.sleep(delay)
                        slips[index][p] = max(slips[index][p], -delay)
                        reporter.report(
                            step=first_step + k, epoch=p, uri=f"file:///lag/{k}/{rank}", loss=0.5
                        )
                        counts[index][p] += 1
                        k += 1
                    with lock:
                        result.reported += k
                flushed = reporter.flush(timeout=flush_timeout_s)
            if not flushed:
                with lock:
                    result.unflushed_ranks += 1
        except Exception as exc:  # counted and reported, not hidden
            local.abort()
            barrier.abort()
            with lock:
                result.errors[_error(exc)] += 1

    threads = [
        threading.Thread(target=rank_main, args=(i, r), name=f"rank-{r}")
        for i, r in enumerate(ranks)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.ready_s = ready[0] if ready else time.monotonic() - started
    for p, (_, seconds, _) in enumerate(phases):
        result.phase_reported.append(sum(c[p] for c in counts))
        result.phase_wall_s.append(seconds)
        result.phase_max_slip_s.append(max(s[p] for s in slips))
    result.cpu_s = time.process_time() - cpu0
    marks = [*phase_cpu_marks, time.process_time()]
    result.phase_cpu_s = [b - a for a, b in itertools.pairwise(marks)]
    results.put(result)


def split(ranks: int, per_process: int) -> list[list[int]]:
    """Ranks ``0..ranks-1`` dealt round-robin into near-equal chunks of at most ``per_process``."""
    processes = max(1, -(-ranks // max(1, per_process)))
    return [list(range(ranks))[i::processes] for i in range(processes)]


class RankProcesses:
    """Worker processes (spawned: the parent runs threads) around one cross-process barrier.

    ``target(*args, barrier, results, flush_timeout_s)`` is called in each process with the
    chunk's own ``args``; the parent is the barrier's last party and calls :meth:`release` once
    per barrier of the workers.
    """

    def __init__(
        self,
        target: Callable[..., None],
        chunk_args: list[tuple[Any, ...]],
        *,
        flush_timeout_s: float,
    ) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._barrier = ctx.Barrier(len(chunk_args) + 1)
        self._results: Any = ctx.Queue()
        self._processes = [
            ctx.Process(
                target=target,
                args=(*args, self._barrier, self._results, flush_timeout_s),
                name=f"ranks-{i}",
            )
            for i, args in enumerate(chunk_args)
        ]

    def __enter__(self) -> RankProcesses:
        for proc in self._processes:
            proc.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._barrier.abort()
        for proc in self._processes:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()

    @property
    def processes(self) -> int:
        return len(self._processes)

    def release(self) -> float:
        """Wait until every rank is at the barrier and release them all; the release time."""
        self._barrier.wait(BARRIER_TIMEOUT_S)
        return time.monotonic()

    def results(self, timeout_s: float) -> list[WorkerResult]:
        """Each worker's result (fewer if a worker died or ``timeout_s`` passed)."""
        out: list[WorkerResult] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < len(self._processes):
            try:
                out.append(self._results.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline or not any(p.is_alive() for p in self._processes):
                    break
        return out

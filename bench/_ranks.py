"""Simulated ranks in worker processes: many rank threads per process, one reporter per rank.

A reporter's own boto3 client costs ~0.12 s of CPU and ~8 MB under one GIL, so the ranks of a
process share one SQS client (configured as a reporter's), while each keeps its spool and sender
thread. Ranks meet at a two-level barrier (a ``threading.Barrier`` per process whose action waits
at the ``multiprocessing`` barrier of ``BarrierProcesses``): released together, the parent knows
when. Process entry points: top level, picklable arguments only.
"""

from __future__ import annotations

import itertools
import os
import resource
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._harness import BarrierProcesses, ranks_sqs
from ckpt_pipeline.demo.fanin import fanin_rank

# How long any barrier waits before the run is declared broken (a rank crashed).
BARRIER_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RankSetup:
    """What every rank process needs: the queue, the job, and how the ranks are simulated."""

    env: dict[str, str]  # boto3's local endpoint settings (LocalPipeline.client_env())
    queue_url: str
    job_id: str
    world_size: int
    spool_dir: str
    # The local SQS stand-in slows with queue depth; a longer read timeout keeps a slow answer
    # from turning into a resend (bench.fanin --client-read-timeout-s).
    read_timeout_s: float = 5.0
    # sys.setswitchinterval of the process, when set. A real rank has one trainer thread and one
    # sender under its GIL; here hundreds of ranks share one, and with CPython's default 5 ms
    # every thread waiting for it wakes every 5 ms to ask for a switch: at a barrier, with 512
    # runnable ranks per process, those wake-ups cost more CPU than the reports.
    switch_interval_s: float | None = None


@dataclass
class WorkerResult:
    """What one worker process's ranks did."""

    ranks: int
    reported: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    unflushed_ranks: int = 0
    ready_s: float = 0.0
    # time.monotonic() (system-wide on Linux, comparable with the parent's) when the last rank
    # of this process had every report acknowledged by SQS.
    flushed_at: float = 0.0
    # Per phase (lag): reports made and the worst lateness against the schedule.
    phase_reported: list[int] = field(default_factory=list)
    phase_max_slip_s: list[float] = field(default_factory=list)
    # CPU seconds of this process from each barrier's release to the next one's (the last to
    # the end, the final flush included).
    phase_cpu_s: list[float] = field(default_factory=list)
    # Building this process's reporters: CPU seconds and resident-memory growth (max RSS).
    build_cpu_s: float = 0.0
    build_rss_mb: float = 0.0
    cpu_s: float = 0.0


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# One rank's work between its reporter's build and its flush: (reporter, rank, index among this
# process's ranks, wait at the barrier, each barrier's start time) -> reports made.
RankBody = Callable[[Any, int, int, Callable[[], object], list[float]], int]


def _run_ranks(
    setup: RankSetup, ranks: list[int], body: RankBody, barrier: Any, flush_timeout_s: float
) -> WorkerResult:  # fmt: skip
    """Build one reporter per rank thread, run ``body`` in each, flush, close; this process's
    result (every rank's exception is counted in it, not raised)."""
    from trainer_client import CheckpointReporter

    os.environ.update(setup.env)
    if setup.switch_interval_s is not None:
        sys.setswitchinterval(setup.switch_interval_s)
    started, cpu0, rss0 = time.monotonic(), time.process_time(), _max_rss_mb()
    result = WorkerResult(ranks=len(ranks))
    lock = threading.Lock()
    # Per barrier: when it released (CPU marks), and the wall-clock start the paced ranks use.
    marks: list[float] = []
    starts: list[float] = []
    client = ranks_sqs(setup.read_timeout_s, max(10, len(ranks)))

    def across_processes() -> None:
        if not marks:
            result.ready_s = time.monotonic() - started
            result.build_cpu_s = time.process_time() - cpu0
            result.build_rss_mb = _max_rss_mb() - rss0
        marks.append(time.process_time())
        barrier.wait(BARRIER_TIMEOUT_S)
        # Half a second after the release: every paced rank is waiting for its first slot.
        starts.append(time.time() + 0.5)

    local = threading.Barrier(len(ranks), action=across_processes)

    def rank_main(index: int, rank: int) -> None:
        try:
            with CheckpointReporter(
                queue_url=setup.queue_url, sqs_client=client, job_id=setup.job_id,
                spool_dir=Path(setup.spool_dir), rank=rank, world_size=setup.world_size,
                run_attempt=0, install_signal_handler=False, spot_poll=False,
                read_timeout_s=setup.read_timeout_s,
            ) as reporter:  # fmt: skip
                made = body(reporter, rank, index, lambda: local.wait(BARRIER_TIMEOUT_S), starts)
                flushed = reporter.flush(timeout=flush_timeout_s)
            with lock:
                result.reported += made
                result.flushed_at = max(result.flushed_at, time.monotonic())
                result.unflushed_ranks += 0 if flushed else 1
        except Exception as exc:  # counted: a failing rank is what the benchmark measures
            local.abort()
            barrier.abort()  # the other processes and the parent stop waiting for this one
            with lock:
                result.errors[f"{type(exc).__name__}: {exc}"[:160]] += 1

    threads = [
        threading.Thread(target=rank_main, args=(i, r), name=f"rank-{r}")
        for i, r in enumerate(ranks)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not marks:
        result.ready_s = time.monotonic() - started
    result.cpu_s = time.process_time() - cpu0
    result.phase_cpu_s = [b - a for a, b in itertools.pairwise([*marks, time.process_time()])]
    return result


def fanin_worker(
    setup: RankSetup, ranks: list[int], checkpoints: int, barrier: Any, results: Any,
    flush_timeout_s: float,
) -> None:  # fmt: skip
    """Ranks ``ranks``: ``checkpoints`` reports, each at a barrier of every rank."""

    def body(reporter: Any, rank: int, _index: int, wait: Any, _starts: Any) -> int:
        fanin_rank(reporter, rank=rank, checkpoints=checkpoints, barrier_wait=wait,
                   on_report=lambda: None)  # fmt: skip
        return checkpoints

    results.put(_run_ranks(setup, ranks, body, barrier, flush_timeout_s))


def paced_worker(
    setup: RankSetup, ranks: list[int], phases: list[tuple[float, float, int]], barrier: Any,
    results: Any, flush_timeout_s: float,
) -> None:  # fmt: skip
    """Open-loop paced reports: per phase ``(total_rate, seconds, first_step)``, all ranks.

    Each rank reports at its own fixed schedule (``world_size / total_rate`` apart, ranks evenly
    phase-shifted), whether or not earlier reports have been sent: the arrival rate does not
    adapt to the pipeline, so a slow pipeline shows up as lag and backlog, not as a lower rate.
    """
    counts = [[0] * len(phases) for _ in ranks]
    slips = [[0.0] * len(phases) for _ in ranks]

    def body(reporter: Any, rank: int, i: int, wait: Any, starts: list[float]) -> int:
        for p, (rate, seconds, first_step) in enumerate(phases):
            wait()
            interval = setup.world_size / rate
            t0 = starts[p] + interval * rank / setup.world_size
            for k in itertools.count():
                due = t0 + k * interval
                if due >= starts[p] + seconds:
                    break
                delay = due - time.time()
                if delay > 0:
                    time.sleep(delay)
                slips[i][p] = max(slips[i][p], -delay)
                reporter.report(
                    step=first_step + k, epoch=p, uri=f"file:///lag/{k}/{rank}", loss=0.5
                )
                counts[i][p] += 1
        return sum(counts[i])

    result = _run_ranks(setup, ranks, body, barrier, flush_timeout_s)
    result.phase_reported = [sum(c[p] for c in counts) for p in range(len(phases))]
    result.phase_max_slip_s = [max(s[p] for s in slips) for p in range(len(phases))]
    results.put(result)


def split(ranks: int, per_process: int) -> list[list[int]]:
    """Ranks ``0..ranks-1`` dealt round-robin into near-equal chunks of at most ``per_process``."""
    processes = max(1, -(-ranks // max(1, per_process)))
    return [list(range(ranks))[i::processes] for i in range(processes)]


class RankProcesses(BarrierProcesses):
    """Worker processes around one cross-process barrier.

    ``target(setup, chunk, plan, barrier, results, flush_timeout_s)`` runs in each process with
    its own chunk of ranks; the parent is the barrier's last party and calls :meth:`release`
    once per barrier of the workers.
    """

    def __init__(
        self, target: Callable[..., None], setup: RankSetup, chunks: list[list[int]], plan: Any,
        *, flush_timeout_s: float,
    ) -> None:  # fmt: skip
        super().__init__(
            "ranks",
            len(chunks),
            target,
            lambda barrier, results, i: (setup, chunks[i], plan, barrier, results, flush_timeout_s),
            barrier_timeout_s=BARRIER_TIMEOUT_S,
            join_s=30,
        )

    def results(self, timeout_s: float) -> list[WorkerResult]:
        """Each worker's result (fewer if a worker died or ``timeout_s`` passed)."""
        return list(self._collect(timeout_s))

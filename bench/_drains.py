"""Drains: how the benches time the writer emptying what the ranks sent, and whose CPU it took.

``wait_for_rows`` (fanin, intake), ``DrainSwitch`` (intake: the event source held while a
barrier sends), and ``measure_drain`` (capacity): one checkpoint's batches written by real
handler processes in the layouts ``one``, ``shared`` (2 writers, one checkpoint: the design) and
``disjoint`` (the same 2 into their own databases: the machine's own two-writer ceiling), each
writer's CPU and its backend's (``/proc``) beside the machine's.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection as Pipe
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any, Literal

import psycopg

from bench._cpu import machine_cpu_s, process_cpu_s
from bench._reports import invoke, writer_environment
from ckpt_pipeline.demo.fanin import count_rows

Layout = Literal["one", "shared", "disjoint"]
# How often the fan-in benches count the rows while they wait for them.
ROWS_POLL_S = 0.05
JOB_ID = "capacity"
# How long the parent waits at a barrier before the drain is declared broken (a writer died).
BARRIER_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class WriterJob:
    """What one writer process writes, and where."""

    url: str
    batches: list[dict[str, Any]]  # Lambda events
    warmup: list[dict[str, Any]]
    rtt_s: float = 0.0  # simulated network round trip per batch (see measure_drain)


@dataclass(frozen=True)
class WriterResult:
    """One writer's timings and CPU seconds over its timed batches."""

    batch_ms: list[float]
    client_cpu_s: float
    backend_cpu_s: float


def schedstat_cpu_s(pid: int) -> float:
    """CPU seconds of the (single-threaded) process ``pid``, to the nanosecond; /proc/stat's
    tick count (10 ms) if schedstat is missing."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return process_cpu_s(pid)


def _backend(url: str, application_name: str) -> tuple[int, bool]:
    """(pid of the writer's backend, whether the server runs on this machine), found by the
    writer connection's application_name."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,)
        ).fetchone()
        host = conn.info.host
    if row is None:
        raise RuntimeError(f"bench: no backend of {application_name} in pg_stat_activity")
    return int(row[0]), host.startswith("/") or host in ("localhost", "127.0.0.1", "::1")


def _writer(job: WriterJob, ready: Barrier, start: Barrier, results: Pipe) -> None:
    """One writer process: warm up, wait for the others, write, report.

    Three meetings with the parent: ``ready`` (everyone warm: the parent reads the CPU
    counters), ``start`` (the clock starts), and ``ready`` again after the results are sent
    (the parent has read the counters again: the connection may close, and its backend exit).
    """
    name = f"bench-writer-{os.getpid()}"
    handler = writer_environment(psycopg.conninfo.make_conninfo(job.url, application_name=name))
    try:
        for event in job.warmup:
            invoke(handler, event)
        backend, local = _backend(job.url, name)

        def backend_cpu_s() -> float:
            return schedstat_cpu_s(backend) if local else math.nan

        ready.wait()
        start.wait()
        cpu0, backend0 = time.process_time(), backend_cpu_s()
        durations = []
        for event in job.batches:
            began = time.perf_counter()
            invoke(handler, event)
            if job.rtt_s:
                time.sleep(job.rtt_s)
            durations.append(1000 * (time.perf_counter() - began))
        results.send(
            WriterResult(durations, time.process_time() - cpu0, backend_cpu_s() - backend0)
        )
        results.close()
        ready.wait()
    finally:
        handler.close()


@dataclass(frozen=True)
class Drain:
    """One measured drain and the CPU it took."""

    writers: int
    layout: Layout
    seconds: float
    batch_ms: list[float]  # each batch's own duration, sorted
    client_cpu_s: float  # the writer processes, summed
    backend_cpu_s: float  # their backends, summed (NaN when the server is not on this machine)
    machine_busy_s: float  # every core, every process
    machine_steal_s: float  # taken by the hypervisor from this VM's cores
    cores: int

    def pct(self, q: float) -> float:
        return self.batch_ms[min(len(self.batch_ms) - 1, round(q * (len(self.batch_ms) - 1)))]

    @property
    def mean_ms(self) -> float:
        return sum(self.batch_ms) / len(self.batch_ms)

    def per_batch_ms(self, cpu_s: float) -> float:
        return 1000 * cpu_s / len(self.batch_ms)

    @property
    def others_s(self) -> float:
        """CPU the rest of the machine took meanwhile: every process but the writers and their
        backends (the server's WAL writer and other sessions included)."""
        backends = 0.0 if math.isnan(self.backend_cpu_s) else self.backend_cpu_s
        return max(0.0, self.machine_busy_s - self.client_cpu_s - backends)

    def share(self, cpu_s: float) -> float:
        """``cpu_s`` as a fraction of what the cores could give during the drain."""
        return cpu_s / (self.cores * self.seconds)


def _reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE training_checkpoint_shards, training_checkpoints CASCADE")


def _check(url: str, shards: int, complete: bool) -> None:
    """The drain left ``shards`` shard rows of the checkpoint, counted, complete if all."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM training_checkpoint_shards WHERE job_id = %s),"
            " shards_present, is_complete FROM training_checkpoint_progress WHERE job_id = %s",
            (JOB_ID, JOB_ID),
        ).fetchone()
    if row is None or row != (shards, shards, complete):
        raise RuntimeError(
            f"a drain left the checkpoint wrong: (shard rows, counted, complete) = {row},"
            f" expected ({shards}, {shards}, {complete})"
        )


def measure_drain(
    urls: tuple[str, str],
    batches: list[dict[str, Any]],
    warmups: tuple[list[dict[str, Any]], list[dict[str, Any]]],
    layout: Layout,
    *,
    rtt_ms: float = 0.0,
) -> Drain:
    """Write ``batches`` (Lambda events) in ``layout``; per-batch time, total time and CPU.

    ``urls``: two databases of the same schema (the second only for ``disjoint``).
    ``rtt_ms``: a network round trip per batch, slept by the writer after each statement's
    answer. A batch is one autocommitted statement, one round trip holding no lock or
    transaction across the network, so sleeping on the client is what a network hop adds, at
    no CPU: a writer on AWS waits on Lambda -> RDS Proxy -> database far more than it computes.
    """
    writers = 1 if layout == "one" else 2
    targets = [urls[w] if layout == "disjoint" else urls[0] for w in range(writers)]
    for url in set(targets):
        _reset(url)
    # fork: the children inherit the events instead of unpickling 100,000 records.
    ctx = multiprocessing.get_context("fork")
    ready, start = ctx.Barrier(writers + 1), ctx.Barrier(writers + 1)
    pipes, procs = [], []
    for w in range(writers):
        job = WriterJob(targets[w], batches[w::writers], warmups[w], rtt_s=rtt_ms / 1000)
        receiver, sender = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_writer, args=(job, ready, start, sender))
        proc.start()
        sender.close()
        pipes.append(receiver)
        procs.append(proc)
    ready.wait(BARRIER_TIMEOUT_S)
    busy0, steal0 = machine_cpu_s()
    start.wait(BARRIER_TIMEOUT_S)
    started = time.perf_counter()
    results: list[WriterResult] = [receiver.recv() for receiver in pipes]
    seconds = time.perf_counter() - started
    busy1, steal1 = machine_cpu_s()
    ready.wait(BARRIER_TIMEOUT_S)
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"a writer process exited with {proc.exitcode}")
    if layout == "disjoint":
        for w in range(writers):
            _check(targets[w], sum(len(b["Records"]) for b in batches[w::writers]), complete=False)
    else:
        _check(targets[0], sum(len(b["Records"]) for b in batches), complete=True)
    return Drain(
        writers=writers,
        layout=layout,
        seconds=seconds,
        batch_ms=sorted(d for r in results for d in r.batch_ms),
        client_cpu_s=sum(r.client_cpu_s for r in results),
        backend_cpu_s=sum(r.backend_cpu_s for r in results),
        machine_busy_s=busy1 - busy0,
        machine_steal_s=steal1 - steal0,
        cores=os.cpu_count() or 1,
    )


def wait_for_rows(
    database_url: str, job_id: str, *, rows: int, complete: int, deadline: float
) -> float | None:
    """``time.monotonic()`` when ``job_id`` first had ``rows`` shard rows and ``complete``
    complete checkpoints (counted every :data:`ROWS_POLL_S`), None if ``deadline`` (monotonic)
    came first."""
    while time.monotonic() < deadline:
        found, done = count_rows(database_url, job_id)
        if found >= rows and done >= complete:
            return time.monotonic()
        time.sleep(ROWS_POLL_S)
    return None


class DrainSwitch:
    """A receive gate (``ckpt_pipeline.local.receive_gate.ReceiveGate``) the bench opens and
    closes: while closed, the event source's workers receive nothing, as Lambda's while its
    mapping is disabled; :meth:`close` returns once every worker waits at it."""

    def __init__(self, workers: int) -> None:
        self._workers = workers
        self._open = threading.Event()
        self._parked = threading.Condition()
        self.parked = 0

    def wait_open(self, stop: threading.Event) -> bool:
        """The worker's wait before each receive."""
        if self._open.is_set():
            return True
        with self._parked:
            self.parked += 1
            self._parked.notify_all()
        try:
            while not stop.is_set():
                if self._open.wait(0.2):
                    return True
            return False
        finally:
            with self._parked:
                self.parked -= 1

    def record(self, outcome: object) -> None:
        """Nothing: the switch does not trip on failures."""

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop receiving; wait until every worker is back at the gate (its poll answered)."""
        self._open.clear()
        with self._parked:
            if not self._parked.wait_for(lambda: self.parked >= self._workers, timeout_s):
                raise RuntimeError(
                    f"bench: the event source's workers did not stop in {timeout_s} s"
                )

    def open(self) -> float:
        """Let the workers receive; the time (monotonic) they were let go."""
        self._open.set()
        return time.monotonic()

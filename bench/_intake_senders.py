"""The intake bench's ranks: a few sender processes, each driving thousands of ranks' real spools
through a bounded thread pool.

Each simulated rank keeps what a real one has of its own (spool, fsync'd append, ack log, report
body, SQS ids, its ``SendMessageBatch`` or its entries handed to a ``PackRelay``), but not its
threads: 16,384 ranks' 49,152 threads held a 2-core machine at load ~1,000 (BENCHMARKS §1). The
relay is in-process (``LocalPackClient``'s path). Process entry points: top level, picklable.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bench._harness import BarrierProcesses, ranks_sqs
from ckpt_contract import dedup_id, group_id
from ckpt_pipeline.demo.fanin import fanin_step, fanin_uri
from trainer_client.config import ReporterConfig, Tuning, resolve_config
from trainer_client.report._build import build_report
from trainer_client.report._retry import backoff_delay, split_results
from trainer_client.report.pack_relay import PackRelay
from trainer_client.report.sender import send_entry
from trainer_client.report.spool import Spool

# How long a sender process waits for the parent at a barrier before the run is broken.
BARRIER_TIMEOUT_S = 900.0
# A rank's attempts at one barrier before its report counts as a failure (the real sender never
# gives up; the bench must end).
MAX_ATTEMPTS = 8
# Open spool files per rank (lock, append, read, ack log): a process keeps its ranks' spools open.
FDS_PER_RANK = 4
_RNG = random.Random()  # the retries' jitter
RELAY_SENDERS = 4  # the relay's own threads sending packs (PackRelay's default)


@dataclass(frozen=True)
class SenderSetup:
    """What every sender process needs: the queue, the job, and how its ranks send."""

    env: dict[str, str]  # boto3's local endpoint settings (LocalPipeline.client_env())
    queue_url: str
    job_id: str
    world_size: int
    spool_dir: str
    pack: int  # 0: every rank sends its own SendMessageBatch; k: a node's k ranks, one relay
    threads: int  # the process's pool of workers
    read_timeout_s: float = 30.0  # the emulator slows with depth: no timeout-driven resends


@dataclass
class BarrierSent:
    """What one sender process's ranks did at one barrier."""

    process: int
    checkpoint: int
    reports: int = 0
    acked: int = 0  # reports SQS (or the relay, on SQS's word) acknowledged
    messages: int = 0  # messages SQS took: one per report, or one per pack
    calls: int = 0  # a rank's own SendMessageBatch calls (per-rank only)
    retried: int = 0  # entries sent again after a failed call or a failed entry
    errors: Counter[str] = field(default_factory=Counter)
    acked_at: float = 0.0  # time.monotonic() of this process's last acknowledgement
    cpu_s: float = 0.0  # this process's CPU over the barrier


class _Rank:
    """One simulated rank: its configuration (the report's fields), its spool, its group."""

    __slots__ = ("cfg", "group", "spool")

    def __init__(self, cfg: ReporterConfig) -> None:
        t = cfg.tuning
        self.cfg = cfg
        self.group = group_id(cfg.job_id, cfg.rank)
        self.spool = Spool(
            cfg.spool_dir / cfg.job_id, cfg.rank, max_bytes=t.max_spool_bytes,
            max_records=t.max_pending_records, compact_threshold_bytes=t.compact_threshold_bytes,
        )  # fmt: skip

    def report(self, checkpoint: int) -> None:
        """What ``CheckpointReporter.report`` does on the rank's thread: build, encode, spool."""
        step = fanin_step(checkpoint)
        fields = {"step": step, "epoch": checkpoint, "uri": fanin_uri(step, self.cfg.rank),
                  "loss": 0.5}  # fmt: skip
        _, body = build_report(self.cfg, fields)
        self.spool.append(body, step=step)

    def entries(self) -> list[dict[str, str]]:
        """What the rank's sender sends next: its pending records (at a barrier, one)."""
        c = self.cfg
        return [
            send_entry(r.seq, r.body, group=self.group,
                       dedup=dedup_id(c.job_id, c.run_attempt, int(r.step or 0), c.rank))
            for r in self.spool.peek(c.tuning.batch_size)
        ]  # fmt: skip


class _Outcome:
    """A barrier's counters, shared by the pool's workers (one lock)."""

    def __init__(self, result: BarrierSent) -> None:
        self.result = result
        self._lock = threading.Lock()

    def add(self, *, acked: int = 0, calls: int = 0, retried: int = 0, error: str = "") -> None:
        with self._lock:
            r = self.result
            r.acked += acked
            r.calls += calls
            r.retried += retried
            if acked:
                r.acked_at = max(r.acked_at, time.monotonic())
            if error:
                r.errors[error[:160]] += 1


def _send_own(client: Any, queue_url: str, rank: _Rank, out: _Outcome) -> None:
    """A rank's sender without a leader: one SendMessageBatch of its pending entries, acked on
    SQS's answer; what failed is sent again after the sender's backoff."""
    entries = rank.entries()
    for attempt in range(MAX_ATTEMPTS):
        try:
            response = client.send_message_batch(QueueUrl=queue_url, Entries=entries)
        except Exception as exc:  # counted and retried, as the sender does
            out.add(calls=1, retried=len(entries))
            error = f"{type(exc).__name__}: {exc}"
        else:
            ok, failed = split_results(response)
            rank.spool.ack([int(i) for i in ok])
            out.add(acked=len(ok), calls=1)
            if not failed:
                return
            again = {str(f["Id"]) for f in failed}
            entries = [e for e in entries if e["Id"] in again]
            out.add(retried=len(entries))
            error = f"entry failed: {failed[0].get('Code')}"
        time.sleep(backoff_delay(attempt, base_s=0.1, cap_s=2.0, rng=_RNG))
    out.add(error=f"rank {rank.cfg.rank}: gave up after {MAX_ATTEMPTS} attempts ({error})")


def _send_via_relay(relay: PackRelay, node: list[_Rank], out: _Outcome) -> None:
    """A node's ranks through its leader: every rank's entries handed over at once, each rank
    acking its own records on the relay's answer (SQS's verdict on the pack that held them)."""
    todo = [(rank, rank.entries()) for rank in node]
    for attempt in range(MAX_ATTEMPTS):
        # One hand-over for the node: its ranks' calls within one linger, and no other node's
        # entries between them (one relay per process stands in for one per node).
        owners = [(rank, e) for rank, entries in todo for e in entries]
        futures = relay.submit([e for _, e in owners])
        handed = [(rank, e, f) for (rank, e), f in zip(owners, futures, strict=True)]
        todo_next: dict[int, tuple[_Rank, list[dict[str, str]]]] = {}
        acks: dict[int, list[int]] = {}
        error = ""
        for rank, entry, future in handed:
            try:
                verdict = future.result()
            except Exception as exc:  # the relay's call to SQS failed: every entry of it
                verdict, error = {"Code": type(exc).__name__}, f"{type(exc).__name__}: {exc}"
            if "Code" in verdict:
                todo_next.setdefault(id(rank), (rank, []))[1].append(entry)
                error = error or f"entry failed: {verdict['Code']}"
            else:
                acks.setdefault(id(rank), []).append(int(entry["Id"]))
        for rank in node:
            if id(rank) in acks:
                rank.spool.ack(acks[id(rank)])
        out.add(acked=sum(len(a) for a in acks.values()))
        if not todo_next:
            return
        todo = list(todo_next.values())
        out.add(retried=sum(len(e) for _, e in todo))
        time.sleep(backoff_delay(attempt, base_s=0.1, cap_s=2.0, rng=_RNG))
    out.add(error=f"node of rank {node[0].cfg.rank}: gave up after {MAX_ATTEMPTS} ({error})")


def sender_process(
    setup: SenderSetup, index: int, ranks: list[int], checkpoints: int, barrier: Any,
    results: Any,
) -> None:  # fmt: skip
    """``ranks`` (consecutive: a node's ranks stay in one process) report and send at each of
    ``checkpoints`` barriers; one :class:`BarrierSent` per barrier on ``results``, or the error
    that stopped the process."""
    try:
        _run(setup, index, ranks, checkpoints, barrier, results)
    except Exception as exc:  # the parent reports it and stops waiting for this process
        barrier.abort()
        results.put(f"sender process {index}: {type(exc).__name__}: {exc}"[:300])


def _unit(
    node: list[_Rank], checkpoint: int, out: _Outcome, client: Any, queue_url: str,
    relay: PackRelay | None,
) -> None:  # fmt: skip
    """One worker's turn: a rank (or a node's ranks) reports, then sends."""
    try:
        for rank in node:
            rank.report(checkpoint)
        if relay is None:
            _send_own(client, queue_url, node[0], out)
        else:
            _send_via_relay(relay, node, out)
    except Exception as exc:  # one rank's failure is counted, not fatal
        out.add(error=f"{type(exc).__name__}: {exc}")


def _run(
    setup: SenderSetup, index: int, ranks: list[int], checkpoints: int, barrier: Any,
    results: Any,
) -> None:  # fmt: skip
    os.environ.update(setup.env)
    base = resolve_config(
        queue_url=setup.queue_url, job_id=setup.job_id, spool_dir=setup.spool_dir,
        rank=ranks[0], world_size=setup.world_size, run_attempt=0, endpoint_url=None,
        region=None, tuning=Tuning(install_signal_handler=False, spot_poll=False),
    )  # fmt: skip
    pool = ThreadPoolExecutor(setup.threads, thread_name_prefix="ranks")
    # Built by the pool: each new spool fsyncs two files and their directory, and thousands of
    # those one after another would take minutes where concurrent ones share journal commits.
    sims = list(pool.map(lambda r: _Rank(dataclasses.replace(base, rank=r)), ranks))
    client = ranks_sqs(setup.read_timeout_s, setup.threads + RELAY_SENDERS,
                       connect_timeout_s=Tuning().connect_timeout_s, validate=False)  # fmt: skip
    relay = None
    if setup.pack:
        relay = PackRelay(client, setup.queue_url, max_reports=setup.pack, senders=RELAY_SENDERS)
    size = max(1, setup.pack)
    units = [sims[i : i + size] for i in range(0, len(sims), size)]
    try:
        with pool:
            for checkpoint in range(checkpoints):
                barrier.wait(BARRIER_TIMEOUT_S)
                cpu0 = time.process_time()
                packs0 = relay.packs_sent if relay is not None else 0
                out = _Outcome(BarrierSent(index, checkpoint, reports=len(sims)))
                for f in [
                    pool.submit(_unit, u, checkpoint, out, client, setup.queue_url, relay)
                    for u in units
                ]:
                    f.result()
                r = out.result
                r.messages = r.acked if relay is None else relay.packs_sent - packs0
                r.cpu_s = time.process_time() - cpu0
                results.put(r)
    finally:
        if relay is not None:
            relay.close()
        for s in sims:
            s.spool.close()


def chunks(ranks: int, processes: int, pack: int) -> list[list[int]]:
    """Ranks ``0..ranks-1`` in ``processes`` consecutive runs of whole nodes (``pack`` ranks)."""
    node = max(1, pack)
    nodes = -(-ranks // node)
    per = -(-nodes // processes)
    out = [list(range(i * per * node, min(ranks, (i + 1) * per * node))) for i in range(processes)]
    return [c for c in out if c]


def processes_for(ranks: int, wanted: int) -> int:
    """At least ``wanted`` processes; more if one process's spools would pass its file limit."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    per_process = max(1, (soft - 256) // FDS_PER_RANK)
    return max(wanted, -(-ranks // per_process))


class SenderProcesses(BarrierProcesses):
    """The sender processes around one barrier whose last party is the parent: :meth:`release`
    lets every rank report and send, :meth:`sent` collects what each process's ranks did."""

    def __init__(self, setup: SenderSetup, ranks: list[list[int]], checkpoints: int) -> None:
        super().__init__(
            "senders",
            len(ranks),
            sender_process,
            lambda barrier, results, i: (setup, i, ranks[i], checkpoints, barrier, results),
            barrier_timeout_s=BARRIER_TIMEOUT_S,
            join_s=60,
        )

    def sent(self, timeout_s: float) -> tuple[list[BarrierSent], list[str]]:
        """Every process's :class:`BarrierSent` for the barrier just released, and the errors of
        processes that stopped (fewer results if one died or ``timeout_s`` passed)."""
        out: list[BarrierSent] = []
        errors: list[str] = []
        for item in self._collect(timeout_s):
            if isinstance(item, str):
                errors.append(item)
            else:
                out.append(item)
        if len(out) + len(errors) < len(self._processes):
            errors.append(f"{len(self._processes) - len(out)} sender process(es) silent")
        return out, errors

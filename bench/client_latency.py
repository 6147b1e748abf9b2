"""report() latency with the fsync'd spool, and the sender thread's CPU share, against moto.

Method and figures: BENCHMARKS.md §3: ``cadence`` and ``burst`` beside the disk's own write +
fsync, ``steady`` for the sender's CPU. The spool should be on the disk you care about.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench._harness import cli, fresh_queue, machine, moto_sqs, parse, pct, verdict
from trainer_client import CheckpointReporter

BURST_TARGET_P99_MS = 2.0
CADENCE_TARGET_RATIO = 1.5
STEADY_TARGET_CPU_PCT = 1.0
CADENCE_PAUSE_S = 0.01
METRICS = {f"metric_{i}": i / 7 for i in range(8)}
FLOOR_RECORD = b"x" * 470  # about the size of one framed report (header + ~450 B of JSON)


@dataclass(frozen=True)
class Result:
    """Latencies of one scenario (ms, sorted), its disk floor, and the sender's CPU use."""

    name: str
    latencies_ms: list[float]
    floor_ms: list[float]
    sender_cpu_s: float
    wall_s: float
    reports: int

    def verdict(self) -> str:
        p99 = pct(self.latencies_ms, 0.99)
        if self.name == "cadence":
            ratio = p99 / pct(self.floor_ms, 0.99)
            met = ratio <= CADENCE_TARGET_RATIO
            return f"{ratio:.2f}x floor p99, goal <= {CADENCE_TARGET_RATIO}x: {verdict(met)}"
        return f"goal p99 <= {BURST_TARGET_P99_MS} ms: {verdict(p99 <= BURST_TARGET_P99_MS)}"


class Floor:
    """Bare write + fsync of one record to a file beside the spool: what the disk costs."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "raw-fsync-floor"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.samples_ms: list[float] = []

    def once(self) -> None:
        start = time.perf_counter()
        os.write(self.fd, FLOOR_RECORD)
        os.fsync(self.fd)
        self.samples_ms.append((time.perf_counter() - start) * 1000)

    def close(self) -> list[float]:
        os.close(self.fd)
        self.path.unlink()
        return sorted(self.samples_ms)


def _report(rep: CheckpointReporter, step: int) -> float:
    start = time.perf_counter()
    rep.report(
        step=step, epoch=step // 100, uri=f"s3://bench/step-{step}/rank-0.pt",
        loss=1.0 / step, metrics=METRICS, bytes=123_456_789,
    )  # fmt: skip
    return (time.perf_counter() - start) * 1000


def _scenario(rep: CheckpointReporter, name: str, count: int) -> Result:
    floor = Floor(Path(rep.spool_path).parent)
    cpu_before, wall_before = rep.stats.sender_cpu_s, time.perf_counter()
    latencies = []
    for n in range(count):
        if name == "cadence":  # the same state before both: the sender idle, the same pause
            floor.once()
            time.sleep(CADENCE_PAUSE_S)
        latencies.append(_report(rep, 100 + n))
        if name == "cadence":
            rep.flush(30)
            time.sleep(CADENCE_PAUSE_S)
        elif name == "steady":  # paced on the clock, as training steps are
            time.sleep(max(0.0, wall_before + n + 1 - time.perf_counter()))
    # steady: the sender's share over exactly the paced wall time (a last flush adds nothing).
    wall, cpu = time.perf_counter() - wall_before, rep.stats.sender_cpu_s - cpu_before
    if not rep.flush(180):
        print(f"warning: {name}: not everything was acknowledged", file=sys.stderr)
    if name != "steady":
        wall, cpu = time.perf_counter() - wall_before, rep.stats.sender_cpu_s - cpu_before
    if name == "burst":
        for _ in range(count):
            floor.once()
    return Result(name, sorted(latencies), floor.close(), cpu, wall, count)


@contextmanager
def _reporter(queue_url: str, job_id: str, spool_dir: Path) -> Iterator[CheckpointReporter]:
    with CheckpointReporter(
        queue_url, job_id=job_id, spool_dir=spool_dir, rank=0, world_size=1, spot_poll=False,
        install_signal_handler=False,
    ) as rep:  # fmt: skip
        for step in range(1, 21):  # warm-up: imports, first connection
            rep.report(step=step, epoch=0, uri=f"s3://bench/warm/{step}", loss=0.5)
        rep.flush(30)
        yield rep


def run(reports: int, steady_s: int, spool_dir: Path) -> list[Result]:
    """The three scenarios (steady only if ``steady_s`` > 0), each on a fresh queue (moto's FIFO
    dedup scans the whole queue per message)."""
    with moto_sqs() as (_, sqs):
        results = []
        for name, count in (("cadence", reports), ("burst", reports), ("steady", steady_s)):
            if count > 0:
                with _reporter(fresh_queue(sqs, "bench"), f"bench-{name}", spool_dir) as rep:
                    results.append(_scenario(rep, name, count))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Run the scenarios and print p50/p99, the disk floor and the sender's CPU share."""
    p = cli(__doc__)
    p.add_argument("--reports", type=int, default=500, help="reports per scenario")
    p.add_argument("--steady-seconds", type=int, default=60, help="the 1/s run (0: skip)")
    p.add_argument("--spool-dir", type=Path, default=None, help="where to put the spool")
    args = parse(p, argv)
    print(f"start: {machine()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-", dir=args.spool_dir) as tmp:
        results = run(args.reports, args.steady_seconds, Path(tmp))
    where = args.spool_dir or tempfile.gettempdir()
    print(f"report() latency, fsync'd spool in {where}, {args.reports} reports per scenario")
    for r in results:
        if r.name != "steady":
            lat, flo = r.latencies_ms, r.floor_ms
            print(
                f"  {r.name:8s} p50 {pct(lat, 0.5):6.3f} ms  p99 {pct(lat, 0.99):6.3f} ms  max"
                f" {lat[-1]:6.3f} ms  | disk floor p50 {pct(flo, 0.5):6.3f} ms  p99"
                f" {pct(flo, 0.99):6.3f} ms  | {r.verdict()}"
            )
    for r in results:
        share = 100 * r.sender_cpu_s / r.wall_s
        goal = f", goal < {STEADY_TARGET_CPU_PCT}%: {verdict(share < STEADY_TARGET_CPU_PCT)}"
        print(
            f"  sender thread ({r.name}): {r.sender_cpu_s:.3f} s CPU in {r.wall_s:.2f} s wall"
            f" = {share:.2f}% of one core, {1e6 * r.sender_cpu_s / r.reports:.0f} us/report"
            + (goal if r.name == "steady" else "")
        )
    print(f"end: {machine()}")
    return 0

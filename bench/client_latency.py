"""report() latency with the fsync'd spool, and the sender thread's CPU share, against moto.

Run: ``python -m bench.client_latency [--reports N] [--spool-dir DIR] [--in-process-moto]``.

Two scenarios, each next to the disk's own floor (a bare write + fsync with the same pacing):
* ``cadence``: one report, then the sender drains it before the next (a rank reporting once
  per checkpoint, the normal case);
* ``burst``: reports back to back while the sender is busy sending the earlier ones (the worst
  case: the sender's botocore work competes for the GIL).

The spool should be on the disk you care about (local disk for the 2 ms target; EFS is slower
per fsync). By default moto runs as a separate ``moto_server`` process, as SQS is remote in
production: in-process, moto's request handling competes for this process's GIL and inflates
report() latency by milliseconds, which measures moto, not the client.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ckpt_pipeline.local.sqs_server import (
    create_pipeline_queues,
    moto_sqs_server,
    set_local_aws_env,
)
from ckpt_pipeline.ops.sqs import sqs_client
from trainer_client import CheckpointReporter

TARGET_P99_MS = 2.0
CADENCE_PAUSE_S = 0.01
METRICS = {f"metric_{i}": i / 7 for i in range(8)}


@dataclass(frozen=True)
class Result:
    """Latencies of one scenario (ms, sorted), its disk floor, and the sender's CPU use."""

    name: str
    latencies_ms: list[float]
    floor_ms: list[float]
    sender_cpu_s: float
    wall_s: float


def _floor_ms(directory: Path, count: int, pause_s: float) -> list[float]:
    """The disk's own floor: write + fsync of a 500 B record, same pacing, no client."""
    path = directory / "raw-fsync-floor"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    out = []
    try:
        for _ in range(count):
            start = time.perf_counter()
            os.write(fd, b"x" * 500)
            os.fsync(fd)
            out.append((time.perf_counter() - start) * 1000)
            if pause_s:
                time.sleep(pause_s)
    finally:
        os.close(fd)
        path.unlink()
    return sorted(out)


def _scenario(rep: CheckpointReporter, name: str, count: int, first_step: int) -> Result:
    cadence = name == "cadence"
    cpu_before, wall_before = rep.stats.sender_cpu_s, time.perf_counter()
    latencies = []
    for step in range(first_step, first_step + count):
        start = time.perf_counter()
        rep.report(
            step=step, epoch=step // 100, uri=f"s3://bench/step-{step}/rank-0.pt",
            loss=1.0 / step, metrics=METRICS, bytes=123_456_789,
        )  # fmt: skip
        latencies.append((time.perf_counter() - start) * 1000)
        if cadence:
            rep.flush(30)
            time.sleep(CADENCE_PAUSE_S)
    if not rep.flush(180):
        print(f"warning: {name}: not everything was acknowledged", file=sys.stderr)
    wall = time.perf_counter() - wall_before
    floor = _floor_ms(Path(rep.spool_path).parent, count, CADENCE_PAUSE_S if cadence else 0.0)
    return Result(name, sorted(latencies), floor, rep.stats.sender_cpu_s - cpu_before, wall)


def _run(reports: int, spool_dir: Path, in_process: bool) -> list[Result]:
    server = moto_sqs_server(in_process=in_process)
    with server as endpoint:
        set_local_aws_env(endpoint)
        sqs = sqs_client(endpoint)
        results = []
        for n, name in enumerate(("cadence", "burst")):
            # A fresh queue per scenario: moto's FIFO dedup scans the whole queue per message.
            queues = create_pipeline_queues(sqs, prefix=f"bench{uuid.uuid4().hex[:8]}")
            with CheckpointReporter(
                queues.queue_url,
                job_id=f"bench-{n}",
                spool_dir=spool_dir,
                rank=0,
                world_size=1,
                spot_poll=False,
                install_signal_handler=False,
            ) as rep:
                for step in range(1, 21):  # warm-up: imports, first connection
                    rep.report(step=step, epoch=0, uri=f"s3://bench/warm/{step}", loss=0.5)
                rep.flush(30)
                results.append(_scenario(rep, name, reports, 100))
    return results


def _pct(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main(argv: Sequence[str] | None = None) -> int:
    """Run both scenarios and print p50/p99, the disk floor and the sender's CPU share."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reports", type=int, default=500, help="reports per scenario")
    parser.add_argument("--spool-dir", type=Path, default=None, help="where to put the spool")
    parser.add_argument("--in-process-moto", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-", dir=args.spool_dir) as tmp:
        results = _run(args.reports, Path(tmp), args.in_process_moto)
    where = args.spool_dir or tempfile.gettempdir()
    print(f"report() latency, fsync'd spool in {where}, {args.reports} reports per scenario")
    for r in results:
        p50, p99 = _pct(r.latencies_ms, 0.5), _pct(r.latencies_ms, 0.99)
        verdict = "met" if p99 <= TARGET_P99_MS else "MISSED"
        floor50, floor99 = _pct(r.floor_ms, 0.5), _pct(r.floor_ms, 0.99)
        print(
            f"  {r.name:8s} p50 {p50:6.3f} ms  p99 {p99:6.3f} ms  max {r.latencies_ms[-1]:6.3f} ms"
            f"  | disk floor p50 {floor50:6.3f} ms  p99 {floor99:6.3f} ms"
            f"  | p99 <= {TARGET_P99_MS} ms: {verdict}"
        )
    for r in results:
        share = 100 * r.sender_cpu_s / r.wall_s
        print(
            f"  sender thread ({r.name}): {r.sender_cpu_s:.3f} s CPU in {r.wall_s:.2f} s wall"
            f" = {share:.1f}% of one core, {1e6 * r.sender_cpu_s / args.reports:.0f} us/report"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

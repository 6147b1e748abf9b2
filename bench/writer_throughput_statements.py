"""Writer statements' cost: backend CPU and wall per batch of the writer's procedures, alternating.

Method and figures: BENCHMARKS.md §2. One connection CALLs each variant (``VARIANTS``) on
pre-built batches of new rows, alternating round by round; the backend's CPU from
``/proc/<pid>/stat`` (clock ticks: a round should take well over 10 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from statistics import median
from typing import Any

from bench._reports import SENDER_ID, report
from ckpt_contract import CheckpointReport
from ckpt_pipeline.local.embedded_pg import throwaway_database
from lambda_writer import apply_migrations, connect_url

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
WORLD_SIZE = 100
# The procedures' statements as the writers of each release send them (lambda_writer/writer/sql.py
# for this one); the json parameters are built here from the reports, in the same shape.
COUNTED = "CALL ckpt_write_batch_counted(%s::json, %s::json, NULL, NULL)"
OWNED = "CALL ckpt_write_batch_owned(%s::json, %s::json, %s::json, NULL, NULL)"
CLAIMED = "CALL ckpt_write_batch_claimed(%s::json, %s::json, %s::json, %s::json, NULL, NULL)"
OWNERS, LAUNCHES, ROWS = "owners", "launches", "rows"
OWNER = SENDER_ID.partition(":")[0]
# name: (statement, launch id of the reports, its parameters)
VARIANTS: dict[str, tuple[str, str | None, tuple[str, ...]]] = {
    "counted": (COUNTED, None, (ROWS,)),
    "counted-launch": (COUNTED, "L1", (ROWS,)),
    "owned": (OWNED, "L1", (OWNERS, ROWS)),
    "claimed": (CLAIMED, "L1", (OWNERS, LAUNCHES, ROWS)),
    "claimed-no-launch": (CLAIMED, None, (OWNERS, LAUNCHES, ROWS)),
}


def _backend_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def batch_params(reports: Sequence[CheckpointReport], wanted: tuple[str, ...]) -> tuple[str, ...]:
    """The json parameters of one batch of new rows (keys sorted, one checkpoint per step)."""
    steps = {(r.job_id, r.step): r for r in reversed(reports)}
    checkpoints = [
        {"job_id": r.job_id, "step": r.step, "run_attempt": r.run_attempt, "epoch": r.epoch,
         "world_size": r.world_size, "first_reported_at": r.created_at.isoformat()}
        for _, r in sorted(steps.items())
    ]  # fmt: skip
    shards = [
        {"job_id": r.job_id, "step": r.step, "rank": r.rank, "run_attempt": r.run_attempt,
         "epoch": r.epoch, "world_size": r.world_size, "uri": r.uri, "loss": r.loss,
         "metrics": r.metrics, "size_bytes": r.bytes, "sha256": r.sha256,
         "extra": {} if r.launch_id is None else {"launch_id": r.launch_id},
         "sqs_message_id": uuid.uuid4().hex, "reported_at": r.created_at.isoformat(),
         "objects": None}
        for r in sorted(reports, key=lambda r: (r.job_id, r.step, r.rank))
    ]  # fmt: skip
    launches = [
        {"job_id": r.job_id, "step": r.step, "rank": r.rank, "run_attempt": r.run_attempt,
         "launch_id": r.launch_id}
        for r in (min((x for x in reports if x.step == step), key=lambda x: x.rank)
                  for _, step in sorted(steps))
        if r.launch_id is not None
    ]  # fmt: skip
    owners = [{"job_id": reports[0].job_id, "owner": OWNER, "sender": SENDER_ID}]
    texts = {
        OWNERS: (json.dumps(owners),),
        LAUNCHES: (json.dumps(launches),),
        ROWS: (json.dumps(checkpoints), json.dumps(shards)),
    }
    return tuple(t for name in wanted for t in texts[name])


def batches(job: str, launch: str | None, wanted: tuple[str, ...], batch: int, count: int
            ) -> list[tuple[str, ...]]:  # fmt: skip
    """``count`` batches of ``batch`` new shard rows of ``job`` (consecutive ranks and steps)."""
    launch_field: dict[str, Any] = {} if launch is None else {"launch_id": launch}
    return [
        batch_params(
            [report(job, n // WORLD_SIZE, n % WORLD_SIZE, WORLD_SIZE, uri=f"s3://b/{job}/{n}.pt",
                    **launch_field)
             for n in range(b * batch, (b + 1) * batch)],
            wanted,
        )
        for b in range(count)
    ]  # fmt: skip


def run(
    admin_url: str, *, batch: int, rounds: int, per_round: int
) -> dict[str, tuple[float, float]]:
    """Median (backend CPU µs, wall µs) per batch of each variant."""
    results: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    with throwaway_database(admin_url, prefix="ckpt_bench_") as url:
        with connect_url(url) as conn:
            apply_migrations(conn)
        with connect_url(url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            pid = int(row[0])
            params = {
                v: batches(f"job-{v}", launch, wanted, batch, rounds * per_round + 5)
                for v, (_, launch, wanted) in VARIANTS.items()
            }
            for v, (statement, _, _) in VARIANTS.items():  # plans cached, jobs claimed
                for p in params[v][:5]:
                    conn.execute(statement, p)
            for r in range(rounds):
                order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
                first = 5 + r * per_round
                for v in order:
                    statement = VARIANTS[v][0]
                    cpu, wall = _backend_cpu_s(pid), time.perf_counter()
                    for p in params[v][first : first + per_round]:
                        conn.execute(statement, p)
                    results[v].append((
                        (_backend_cpu_s(pid) - cpu) * 1e6 / per_round,
                        (time.perf_counter() - wall) * 1e6 / per_round,
                    ))  # fmt: skip
    return {v: (median(c for c, _ in rs), median(w for _, w in rs)) for v, rs in results.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """Print each variant's median backend CPU and wall per batch, and against ``counted``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100, help="rows per batch (default 100)")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds (default 6)")
    parser.add_argument("--per-round", type=int, default=30, help="batches per round (30)")
    parser.add_argument("--admin-url", default=os.environ.get("CKPT_BENCH_ADMIN_URL", ADMIN_URL))
    args = parser.parse_args(argv)
    if args.batch < 1 or args.rounds < 1 or args.per_round < 1:
        parser.error("--batch, --rounds and --per-round must be at least 1")
    medians = run(args.admin_url, batch=args.batch, rounds=args.rounds, per_round=args.per_round)
    base_cpu = medians["counted"][0]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"writer statements, batch {args.batch}, median of {args.rounds} rounds of"
          f" {args.per_round} batches; {os.cpu_count()} CPUs, load average {load}")  # fmt: skip
    for v, (cpu, wall) in medians.items():
        print(f"{v:18} backend CPU {cpu:8.0f} µs/batch ({100 * (cpu / base_cpu - 1):+4.0f} %),"
              f" wall {wall:8.0f} µs/batch")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

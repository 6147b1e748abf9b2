"""Writer statements' cost: backend CPU and wall per batch of the writer's procedures, alternating.

The writer's own claims (issue 44) set apart from its decode, plan and event handling: one
connection CALLs each statement on pre-built batches of new rows, in one database, the variants
alternating round by round (in reversed order every other round), and the backend's CPU time
is read from ``/proc/<pid>/stat`` (Linux; clock ticks, so a round should take well over 10 ms):

* ``counted``: 0007's ``ckpt_write_batch_counted`` on reports without launch ids (the previous
  release's statement and data; 0014's row trigger does not fire);
* ``counted-launch``: the same statement on reports with launch ids (0014's trigger on each row);
* ``owned``: 0015's ``ckpt_write_batch_owned`` (the owner claim), reports with launch ids;
* ``claimed``: 0018's ``ckpt_write_batch_claimed`` (owner and launch claims once per batch, the
  row trigger skipped), reports with launch ids, and ``claimed-no-launch`` without.

Run: ``python -m bench writer_throughput_statements [--batch 100] [--rounds 6] [--per-round 30]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import median
from typing import Any

from bench._reports import lambda_event, report
from ckpt_pipeline.local.embedded_pg import throwaway_database
from lambda_writer import apply_migrations, connect_url
from lambda_writer.writer import sql
from lambda_writer.writer.planning import BatchPlan, plan_batch
from lambda_writer.writer.records import Poison, ValidReport, classify, parse_event, sent_by

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
WORLD_SIZE = 100
COUNTED = "CALL ckpt_write_batch_counted(%s::json, %s::json, NULL, NULL)"
OWNED = "CALL ckpt_write_batch_owned(%s::json, %s::json, %s::json, NULL, NULL)"
Params = Callable[[BatchPlan], tuple[str, ...]]
# name: (statement, launch id of the reports, parameters of a plan)
VARIANTS: dict[str, tuple[str, str | None, Params]] = {
    "counted": (COUNTED, None, sql.write_params),
    "counted-launch": (COUNTED, "L1", sql.write_params),
    "owned": (OWNED, "L1", sql.owned_write_params),
    "claimed": (sql.WRITE_BATCH, "L1", sql.claimed_write_params),
    "claimed-no-launch": (sql.WRITE_BATCH, None, sql.claimed_write_params),
}


def _backend_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def plans(job: str, launch: str | None, batch: int, count: int) -> list[BatchPlan]:
    """``count`` batches of ``batch`` new shard rows of ``job`` (consecutive ranks and steps)."""
    launch_field: dict[str, Any] = {} if launch is None else {"launch_id": launch}
    out = []
    for b in range(count):
        reports = [
            report(job, n // WORLD_SIZE, n % WORLD_SIZE, WORLD_SIZE, uri=f"s3://b/{job}/{n}.pt",
                   **launch_field)
            for n in range(b * batch, (b + 1) * batch)
        ]  # fmt: skip
        senders = [sent_by(m, None) for m in parse_event(lambda_event(reports))]
        valid = [classify(m) for m in senders if not isinstance(m, Poison)]
        out.append(plan_batch([v for v in valid if isinstance(v, ValidReport)]))
    return out


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
                v: [fn(p) for p in plans(f"job-{v}", launch, batch, rounds * per_round + 5)]
                for v, (_, launch, fn) in VARIANTS.items()
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

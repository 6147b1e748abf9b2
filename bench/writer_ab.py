"""The writer before and after a change: two trees' writers on the same reports, alternating.

``--before-tree DIR`` is a checkout of another commit (``git worktree add``; default: this tree,
which measures the method's own noise). Each pair runs the
real handler of both trees, in alternating order, each in its own process (the trees share
package names) on its own fresh database migrated by that tree: the same reports (``--rows``
shard rows of one job, events of ``--batch`` records), after a warm-up. Per run it takes the
wall rows/s and the CPU per batch of the writer's process and of its database backend
(``/proc/<pid>/stat``, Linux): CPU is what a busy machine disturbs least, wall is what the
criterion names. Printed per batch size: each tree's medians and the median of the pairs'
after ÷ before ratios with their range (BENCHMARKS §2, "The writer before and after").
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from bench._harness import cli, load, machine, parse

REPO = Path(__file__).resolve().parent.parent

# Run inside either tree: only names both the previous release and this one have.
_RUN = """
import json, os, sys, time, uuid
import psycopg
from bench._reports import events, invoke, report, writer_environment
from ckpt_pipeline.local.embedded_pg import throwaway_database
from lambda_writer import apply_migrations, connect_url

admin, batch, rows, launch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
fields = {"launch_id": launch} if launch else {}
world = 100

def cpu_s(pid):
    stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")

with throwaway_database(admin, prefix="ckpt_bench_ab_") as url:
    with connect_url(url) as conn:
        apply_migrations(conn)
    handler = writer_environment(url)
    job = f"job-{uuid.uuid4().hex[:8]}"
    reports = [report(job, 1 + n // world, n % world, world, **fields)
               for n in range(rows + 20 * batch)]
    evs = events(reports, batch)
    warm, timed = evs[:20], evs[20:]
    for e in warm:
        invoke(handler, e)
    dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(admin, autocommit=True) as c:
        (pid,), = c.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s",
                            (dbname,)).fetchall()
    backend, client, wall = cpu_s(pid), time.process_time(), time.perf_counter()
    for e in timed:
        invoke(handler, e)
    wall = time.perf_counter() - wall
    print(json.dumps({"rows_s": rows / wall,
                      "client_ms": (time.process_time() - client) * 1e3 / len(timed),
                      "backend_ms": (cpu_s(pid) - backend) * 1e3 / len(timed)}))
"""


def run_tree(tree: Path, admin_url: str, batch: int, rows: int, launch: str) -> dict[str, float]:
    """One run of ``tree``'s writer: rows/s and CPU ms per batch (its process, its backend)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "POWERTOOLS_METRICS_DISABLED": "true"}
    done = subprocess.run(
        [sys.executable, "-c", _RUN, admin_url, str(batch), str(rows), launch],
        cwd=tree, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"the writer of {tree} failed:\n{done.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures | {"cpu_ms": figures["client_ms"] + figures["backend_ms"]}


def _ratios(after: list[dict[str, float]], before: list[dict[str, float]], key: str) -> str:
    ratios = sorted(a[key] / b[key] for a, b in zip(after, before, strict=True))
    return f"{statistics.median(ratios):.3f} ({ratios[0]:.2f}–{ratios[-1]:.2f})"


def main(argv: Sequence[str] | None = None) -> int:
    """Print both trees' figures per batch size and the pairs' ratios."""
    p = cli(__doc__, admin_url=True)
    p.add_argument("--before-tree", type=Path, default=REPO)
    p.add_argument(
        "--before-launch-id", default="L1",
        help="launch id of the before tree's reports (L1; '' for a tree whose reports had none)",
    )  # fmt: skip
    p.add_argument("--after-tree", type=Path, default=REPO)
    p.add_argument("--after-launch-id", default="L1", help="launch id of the after tree's (L1)")
    p.add_argument("--batch", type=int, nargs="+", default=[10, 100])
    p.add_argument("--rows", type=int, default=3000, help="timed shard rows per run (3000)")
    p.add_argument("--pairs", type=int, default=7, help="alternating pairs per batch size (7)")
    args = parse(p, argv)
    if args.rows < 100 or args.pairs < 1 or min(args.batch) < 1:
        p.error("--rows must be at least 100, --pairs and --batch at least 1")
    sides = {
        "before": (args.before_tree.resolve(), args.before_launch_id),
        "after": (args.after_tree.resolve(), args.after_launch_id),
    }
    print(f"the writer before and after, {args.pairs} alternating pairs of {args.rows} rows;"
          f" {machine()}")  # fmt: skip
    for side, (tree, launch) in sides.items():
        print(f"  {side}: {tree} (reports' launch id: {launch or 'none'})")
    for batch in args.batch:
        runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        for pair in range(args.pairs):
            for side in list(sides) if pair % 2 == 0 else list(reversed(sides)):
                tree, launch = sides[side]
                runs[side].append(run_tree(tree, args.admin_url, batch, args.rows, launch))
        print(f"batch {batch}:")
        for side, figures in runs.items():
            med = {k: statistics.median(f[k] for f in figures) for k in figures[0]}
            print(f"  {side:7} {med['rows_s']:8,.0f} rows/s   CPU per batch: writer"
                  f" {med['client_ms']:.3f} ms, backend {med['backend_ms']:.3f} ms")  # fmt: skip
        after, before = runs["after"], runs["before"]
        rows = _ratios(after, before, "rows_s")
        cpu = _ratios(after, before, "cpu_ms")
        print(f"  after ÷ before, median of the pairs (range): rows/s {rows}, CPU per batch {cpu}")
    print(f"load average at end {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

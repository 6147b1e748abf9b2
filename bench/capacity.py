"""Capacity: the writer's cost per batch against the ranks of a checkpoint, and a second writer.

Method and figures: BENCHMARKS.md §6. Per N, one checkpoint written by 1 and 2 writer processes
and, as the control, the same 2 into disjoint databases (``bench._drains``), the fastest of
``--repeat``; then the measured cost per batch as ``bench intake_model``'s ``--batch10-ms``.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench._drains import Drain, Layout, measure_drain
from bench._harness import cli, load, machine, migrated_database, parse, secs, verdict
from bench._reports import checkpoint, events
from bench.intake_model import FIFO_MAX_BATCH as BATCH
from bench.writer_throughput import commit_floor_ms

WARMUP_BATCHES = 20  # per connection, on another job: plpgsql's cached plans, catalog caches
TARGET_FLAT = 1.2  # mean per batch at the largest N within 20 % of the smallest N's
TARGET_SECOND_WRITER = 1.8
LAYOUTS: tuple[Layout, ...] = ("one", "shared", "disjoint")


def checkpoint_batches(ranks: int, job_id: str = "capacity") -> list[dict[str, Any]]:
    """One checkpoint (job, step 1) of ``ranks`` reports as the FIFO event source's events."""
    return events(checkpoint(job_id, 1, ranks, uri="s3://bench/capacity/1.pt"), BATCH)


@dataclass(frozen=True)
class Case:
    """The drains of one N, the fastest of the repeats of each layout, and the shared/disjoint
    ratio of each repeat (whose two drains ran back to back)."""

    ranks: int
    one: Drain
    shared: Drain
    disjoint: Drain
    paired: list[float]  # per repeat: disjoint drain seconds / shared drain seconds
    commit_ms: float  # the commit floor on the same database

    @property
    def gain(self) -> float:
        """What a second writer of one checkpoint adds: the goal's figure (>= 1.8x)."""
        return self.one.seconds / self.shared.seconds

    @property
    def ceiling(self) -> float:
        """What a second writer adds when the two share nothing but the machine."""
        return self.one.seconds / self.disjoint.seconds

    @property
    def relative(self) -> float:
        """gain / ceiling: 1.0 when one checkpoint serialises its writers no more than the
        machine serialises two writers of different databases."""
        return self.disjoint.seconds / self.shared.seconds


HEADER = (
    f"{'N':>6} {'w':>1} {'layout':8} {'drain':>8} {'p50':>6} {'p99':>6} {'mean':>6} {'gain':>6}"
    f" {'vs dis':>6} {'cpu/batch: client':>17} {'backend':>7} {'busy':>5} {'others':>6}"
    f" {'steal':>5} {'commit':>6}  load"
)


def _row(case: Case, d: Drain) -> str:
    gain = {"one": "", "shared": f"{case.gain:5.2f}x", "disjoint": f"{case.ceiling:5.2f}x"}
    rel = f"{case.relative:6.2f}" if d.layout == "shared" else ""
    return (
        f"{case.ranks:6d} {d.writers:1d} {d.layout:8} {secs(d.seconds):>8}"
        f" {d.pct(0.5):6.2f} {d.pct(0.99):6.2f} {d.mean_ms:6.2f} {gain[d.layout]:>6} {rel:>6}"
        f" {d.per_batch_ms(d.client_cpu_s):14.2f} ms {d.per_batch_ms(d.backend_cpu_s):7.2f}"
        f" {100 * d.share(d.machine_busy_s):4.0f}% {100 * d.share(d.others_s):5.0f}%"
        f" {100 * d.share(d.machine_steal_s):4.0f}% {case.commit_ms:6.2f}  {load()}"
    )


def measure_all(
    admin_url: str, ranks: Sequence[int], repeat: int, rtt_ms: float = 0.0
) -> list[Case]:
    """Drains of every layout for every N, printing each case as measured.

    Every repeat runs every layout in turn (shared and disjoint back to back, their order swapped
    each repeat), so that the other work on the machine falls on all of them alike; the fastest
    drain of each is kept (other work only ever slows a drain down).
    """
    print(HEADER, flush=True)
    out = []
    for n in ranks:
        batches = checkpoint_batches(n)
        warm = checkpoint_batches(WARMUP_BATCHES * BATCH, "warmup-0")
        warmups = (warm, checkpoint_batches(WARMUP_BATCHES * BATCH, "warmup-1"))
        runs: dict[Layout, list[Drain]] = {lay: [] for lay in LAYOUTS}
        floors = []
        with contextlib.ExitStack() as stack:
            pair = [
                stack.enter_context(migrated_database(admin_url, prefix="ckpt_capacity_"))
                for _ in range(2)
            ]
            for r in range(repeat):
                floors.append(commit_floor_ms(pair[0]))
                order: tuple[Layout, ...] = LAYOUTS if r % 2 == 0 else ("one", "disjoint", "shared")
                for layout in order:
                    drain = measure_drain(
                        (pair[0], pair[1]), batches, warmups, layout, rtt_ms=rtt_ms
                    )
                    runs[layout].append(drain)
        fastest = {lay: min(runs[lay], key=lambda d: d.seconds) for lay in LAYOUTS}
        paired = [
            dis.seconds / sh.seconds
            for sh, dis in zip(runs["shared"], runs["disjoint"], strict=True)
        ]
        case = Case(n, fastest["one"], fastest["shared"], fastest["disjoint"], paired, min(floors))
        out.append(case)
        for d in (case.one, case.shared, case.disjoint):
            print(_row(case, d), flush=True)
    return out


def verdicts(cases: Sequence[Case]) -> bool:
    """Print the goals: flat per batch, linear drain, second writer >= 1.8x; and the second
    writer against the machine's own two-writer ceiling (disjoint databases)."""
    ns = [c.ranks for c in cases]
    flat = cases[-1].one.mean_ms / cases[0].one.mean_ms
    per_k = ", ".join(f"{1000 * c.one.seconds / c.ranks:.3f}" for c in cases)
    gains = [c.gain for c in cases]
    ok_flat, ok_gain = flat <= TARGET_FLAT, min(gains) >= TARGET_SECOND_WRITER
    print(
        f"  mean per batch at N={ns[-1]} / N={ns[0]} = {flat:.2f} (target <= {TARGET_FLAT}):"
        f" {verdict(ok_flat)}; 1-writer drain per 1,000 ranks: {per_k} s (linear"
        f" when constant); second writer {min(gains):.2f}x..{max(gains):.2f}x (target >="
        f" {TARGET_SECOND_WRITER}): {verdict(ok_gain)}"
    )
    print(
        f"    per N = {', '.join(map(str, ns))}: second writer on one checkpoint"
        f" {', '.join(f'{c.gain:.2f}x' for c in cases)}; on disjoint databases (the machine's"
        f" own two-writer gain) {', '.join(f'{c.ceiling:.2f}x' for c in cases)}; one / disjoint"
        f" {', '.join(f'{c.relative:.2f}' for c in cases)} (1.00 = one checkpoint serialises"
        f" its writers no more than two databases do); paired per repeat (median, min-max):"
        f" {', '.join(_spread(c.paired) for c in cases)}"
    )
    two = [c.shared for c in cases]
    per_batch = ", ".join(
        f"{d.per_batch_ms(d.client_cpu_s):.2f} / {d.per_batch_ms(d.backend_cpu_s):.2f}" for d in two
    )
    print(
        f"    CPU with 2 writers on one checkpoint, per N: per batch (writer process / its"
        f" backend) {per_batch} ms; share of the {two[0].cores} cores' time during the drain:"
        f" writer processes {_pcts(two, lambda d: d.client_cpu_s)}, their backends"
        f" {_pcts(two, lambda d: d.backend_cpu_s)}, everything else"
        f" {_pcts(two, lambda d: d.others_s)} (steal {_pcts(two, lambda d: d.machine_steal_s)})"
    )
    return ok_flat and ok_gain


def _spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _pcts(drains: Sequence[Drain], cpu_s: Callable[[Drain], float]) -> str:
    return ", ".join(f"{100 * d.share(cpu_s(d)):.0f}%" for d in drains)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure per-batch cost and drains; 1 if a goal is missed."""
    p = cli(__doc__, admin_url=True)
    p.add_argument("--ranks", type=int, nargs="+", default=[1000, 4000, 16000])
    p.add_argument("--repeat", type=int, default=2, help="drains per case; fastest kept")
    p.add_argument(
        "--rtt-ms", type=float, default=0.0,
        help="simulated network round trip per batch, slept by each writer after its statement"
        " (default 0); the cost per batch for the AWS model is then not printed (it includes it)",
    )  # fmt: skip
    args = parse(p, argv)
    if not args.rtt_ms >= 0:
        p.error(f"--rtt-ms must be 0 or above, got {args.rtt_ms:g}")
    print(
        f"capacity: one checkpoint of N ranks in FIFO batches of {BATCH}, the writer's path, 1 and"
        f" 2 writer processes; {machine()} at start"
        + (f"; simulated round trip {args.rtt_ms:g} ms per batch" if args.rtt_ms else ""),
        flush=True,
    )
    print(
        "  layout: one = 1 writer; shared = 2 writers, every second batch each, one checkpoint in"
        " one database (the design); disjoint = 2 writers, the same batches, each into its own"
        " database. gain = 1-writer drain / this drain; vs dis = disjoint drain / shared drain;"
        " cpu/batch: CPU ms per batch of the writer processes and of their backends;"
        " busy/others/steal: the machine's CPU in % of all cores; commit = mean autocommitted"
        " one-row INSERT on the same database (the WAL flush every batch pays)",
        flush=True,
    )
    cases = measure_all(args.admin_url, sorted(args.ranks), args.repeat, rtt_ms=args.rtt_ms)
    ok = verdicts(cases)
    if not args.rtt_ms:
        case = cases[-1]
        batch_ms = case.one.seconds * 1000 / math.ceil(case.ranks / BATCH)
        print(f"  on AWS: python -m bench intake_model --batch10-ms {batch_ms:.2f}"
              f" (1 writer's drain per batch, N={case.ranks})", flush=True)  # fmt: skip
    return 0 if ok else 1

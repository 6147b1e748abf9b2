"""The AWS model of the intake designs: one barrier of N ranks drained by two writers.

Method and figures: BENCHMARKS.md §6 (the quotas cited in ``bench._intake_model``, the
assumptions printed). Exit 1 if no design within SQS's limits drains the largest N within
``--goal-s``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

from bench._harness import cli, parse
from bench._intake_model import Assumptions, print_assumptions, print_pack_sizes, print_table
from trainer_client.report.pack_relay import (
    DEFAULT_LINGER_S,
    DEFAULT_RETRY_AFTER_S,
    DEFAULT_TIMEOUT_S,
)

GOAL_S = 15.0


def main(argv: Sequence[str] | None = None) -> int:
    """Print the assumptions and the table; 1 if the goal is out of every design's reach."""
    p = cli(__doc__)
    p.add_argument("--ranks", type=int, nargs="+", default=[1000, 16384, 100_000])
    # One option per assumption, named as its field (--invoke-ms, --row-ms, --pollers...).
    for f in fields(Assumptions):
        kind = float if f.type == "float" else int
        p.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default)
    p.add_argument("--goal-s", type=float, default=GOAL_S)
    args = parse(p, argv)
    if min(args.ranks) < 1 or args.ranks_per_pack < 1 or args.pollers < 1:
        p.error("--ranks, --ranks-per-pack and --pollers must be at least 1")
    if args.concurrency < 1 or args.window_s < 1:
        p.error("--concurrency must be at least 1, --window-s at least 1 (BatchSize > 10)")
    a = Assumptions(**{f.name: getattr(args, f.name) for f in fields(Assumptions)})
    print(
        f"intake model: one checkpoint barrier, {a.concurrency} writers, goal <= {args.goal_s:g} s"
    )
    print_assumptions(a)
    drains = print_table(sorted(args.ranks), a, args.goal_s)
    print_pack_sizes(a.ranks_per_pack)
    largest = max(args.ranks)
    met = [d for d in drains if d.ranks == largest and d.fits and d.seconds <= args.goal_s]
    print(
        f"  at {largest} ranks: {', '.join(d.design.name for d in met) or 'no design'} within"
        f" {args.goal_s:g} s"
    )
    print(
        "  packed per node: a rank that reports after its node's pack left goes in the next"
        f" pack (one more message, + the leader's {1000 * DEFAULT_LINGER_S:.0f} ms linger); a"
        " dead leader costs each of its ranks one refused connection (a hung one"
        f" {DEFAULT_TIMEOUT_S:g} s, the relay timeout), then the rank sends its own message as"
        f" today for {DEFAULT_RETRY_AFTER_S:g} s: at most ranks-per-pack messages more"
    )
    return 0 if met else 1

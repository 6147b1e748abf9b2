"""The benchmarks: one by name with its own options, or all of them one after another.

``python -m bench NAME [OPTIONS]`` runs one (``--help`` lists its options); ``python -m bench
[--quick] [--only NAME ...] [--sqs moto|localstack]`` runs every section in turn (``make
bench``; ``--quick``: a smoke run). Exit 1 if any section failed or missed its target.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import pkgutil
import platform
import sys
import time
import traceback
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import bench
from bench._harness import load

# (name, quick-run arguments): every bench, in the order of the whole run, which passes no
# arguments.
SECTIONS: list[tuple[str, list[str]]] = [
    (name, quick.split())
    for name, quick in (
        ("fanin", "--ranks 16 64 --checkpoints 2"),
        ("intake", "--ranks 64 --checkpoints 1 --processes 1 --threads 4 --sqs moto"),
        ("intake_model", ""),
        ("writer_throughput", "--rows 1000"),
        ("writer_ab", "--rows 200 --pairs 1 --batch 10"),
        ("client_latency", "--reports 100"),
        ("lag", "--rates 50 --seconds 5 --ranks 10"),
        ("cold_start", "--runs 3"),
        ("bundle_size", ""),
        ("capacity", "--ranks 1000"),
        ("save_overhead", "--sizes-gb 0.01 --saves 2 --frameworks plain hf"),
        ("restore", "--sizes-gb 0.004 --rounds 1 --ranks 2 --s3 moto"),
        ("restart_collectives", "--ranks 2 3"),
        ("restart_scale", "--nodes 2 --dcp-mb 2 --hf-mb 2"),
        ("read_paths", "--shards 1000 4096 --ranks 10000 --checkpoints 10 --wide-ranks 100"),
    )
]
# Every bench module (not the shared _modules) runs by name.
NAMES = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_"))
# The sections given the whole run's --sqs (intake keeps its own default, LocalStack: moto slows
# with queue depth, BENCHMARKS §1).
_SQS = {"fanin", "lag"}


def _every_bench() -> str:
    """One line per bench that runs by name (``python -m bench NAME --help`` for its options),
    its module docstring's first paragraph."""
    lines = ["benches (python -m bench NAME --help), in the order of the whole run:"]
    for name, _ in SECTIONS:  # read, not imported: some benches import aws_cdk or torch
        doc = ast.get_docstring(ast.parse((Path(bench.__path__[0]) / f"{name}.py").read_text()))
        first = " ".join((doc or "").split("\n\n")[0].split())
        lines.append(f"  {name:<28} {first}")
    return "\n".join(lines)


def run_one(name: str, argv: Sequence[str]) -> int:
    """``bench.NAME``'s own ``main(argv)``."""
    sys.argv[0] = f"python -m bench {name}"  # argparse's prog in the bench's usage lines
    status: int = importlib.import_module(f"bench.{name}").main(list(argv))
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """One bench by name, or every section in order with its wall time and exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in NAMES:
        return run_one(argv[0], argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__.splitlines()[0],
        epilog=_every_bench(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--only", nargs="+", choices=[s[0] for s in SECTIONS], default=None)
    parser.add_argument("--sqs", choices=["moto", "localstack"], default="moto")
    args = parser.parse_args(argv)
    print(
        f"# bench {'--quick ' if args.quick else ''}started {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        f" on {platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()},"
        f" load average {load()}",
        flush=True,
    )
    statuses: dict[str, int] = {}
    for name, quick in SECTIONS:
        if args.only and name not in args.only:
            continue
        print(f"\n## {name}", flush=True)
        started = time.monotonic()
        chosen = quick if args.quick else []
        try:
            statuses[name] = run_one(name, [*chosen, "--sqs", args.sqs] if name in _SQS else chosen)
        except Exception:  # one broken section must not hide the others' figures
            traceback.print_exc()
            statuses[name] = 1
        print(
            f"({name}: exit {statuses[name]}, {time.monotonic() - started:.0f} s,"
            f" load average now {os.getloadavg()[0]:.2f})",
            flush=True,
        )
    failed = [name for name, status in statuses.items() if status]
    print(f"\n# done; sections with a non-zero exit: {', '.join(failed) or 'none'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

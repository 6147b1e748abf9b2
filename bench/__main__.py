"""All benchmarks, one after another, each printing its own section (``make bench``).

Run: ``python -m bench [--quick] [--only NAME ...] [--sqs moto|localstack]``. ``--quick``
shrinks every section (a smoke run, not figures to quote). The exit status is 1 if any section
failed or missed its target; every section runs regardless.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from bench import capacity, client_latency, cold_start, fanin, lag, writer_throughput

Main = Callable[[Sequence[str] | None], int]

# (name, entry point, full-run arguments, quick-run arguments)
SECTIONS: list[tuple[str, Main, list[str], list[str]]] = [
    ("fanin", fanin.main, [], ["--ranks", "16", "64", "--checkpoints", "2"]),
    ("writer_throughput", writer_throughput.main, [], ["--rows", "1000"]),
    ("client_latency", client_latency.main, [], ["--reports", "100"]),
    ("lag", lag.main, [], ["--rates", "50", "--seconds", "5", "--ranks", "10"]),
    ("cold_start", cold_start.main, [], ["--runs", "3", "--no-bundle"]),
    ("capacity", capacity.main, [], ["--ranks", "1000"]),
]

# The sections that take ``--sqs``.
_SQS = {"fanin", "lag"}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sections in order; print each one's wall time and exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--only", nargs="+", choices=[s[0] for s in SECTIONS], default=None)
    parser.add_argument(
        "--sqs", choices=["moto", "localstack"], default="moto", help="for fanin and lag"
    )
    args = parser.parse_args(argv)
    load = os.getloadavg()
    print(
        f"# bench {'--quick ' if args.quick else ''}started {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        f" on {platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()},"
        f" load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        flush=True,
    )
    statuses: dict[str, int] = {}
    for name, entry, full, quick in SECTIONS:
        if args.only and name not in args.only:
            continue
        print(f"\n## {name}", flush=True)
        started = time.monotonic()
        try:
            chosen = quick if args.quick else full
            statuses[name] = entry([*chosen, "--sqs", args.sqs] if name in _SQS else chosen)
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

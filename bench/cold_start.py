"""Cold start: the writer handler's import time in fresh interpreters, and the bundle size.

Run: ``python -m bench.cold_start [--runs 10] [--top 8] [--no-bundle] [--wheelhouse DIR]``.

Each run is a new ``python -c "import lambda_writer.handler"`` process, timed from outside (so it
includes interpreter start-up, printed separately from ``python -c pass``), which is what Lambda's
init phase pays for the module before the first event. ``-X importtime`` then names the modules
that cost the most (cumulative, top-level imports only).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

HANDLER_IMPORT = "import lambda_writer.handler"
# As in Lambda: Powertools metrics are set up at import; no secrets or DB are touched then.
_ENV = {**os.environ, "POWERTOOLS_METRICS_DISABLED": "true"}


def _timed_run(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=_ENV)
    return time.perf_counter() - started


def top_imports(code: str, top: int) -> list[tuple[float, str]]:
    """(cumulative ms, module) of the costliest imports the handler module makes itself."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        check=True, env=_ENV, capture_output=True, text=True,
    )  # fmt: skip
    entries = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, raw = line.split(":", 1)[1].split("|")
        # The tree indents each level by two spaces after the one separating space; level 1 is
        # what the imported module (the handler, or the package it belongs to) imports itself.
        if raw.startswith("   ") and not raw.startswith("     "):
            entries.append((int(cumulative) / 1000, raw.strip()))
    return sorted(entries, reverse=True)[:top]


def main(argv: Sequence[str] | None = None) -> int:
    """Print import-time p50/min over ``--runs`` fresh processes, the top imports, the bundle."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--no-bundle", action="store_true", help="skip building the bundle")
    parser.add_argument("--wheelhouse", default=None, help="offline wheels for the bundle")
    args = parser.parse_args(argv)
    _timed_run(HANDLER_IMPORT)  # warm the page cache and .pyc files, as a deployed bundle is
    bare = sorted(_timed_run("pass") for _ in range(args.runs))
    full = sorted(_timed_run(HANDLER_IMPORT) for _ in range(args.runs))
    p50, p50_bare = statistics.median(full), statistics.median(bare)
    print(
        f"cold start: '{HANDLER_IMPORT}' in a fresh {sys.implementation.name}"
        f" {sys.version.split()[0]} process, {args.runs} runs"
    )
    print(
        f"  whole process p50 {1000 * p50:.0f} ms, min {1000 * full[0]:.0f} ms;"
        f" bare interpreter p50 {1000 * p50_bare:.0f} ms"
        f" -> the import alone ~{1000 * (p50 - p50_bare):.0f} ms"
    )
    print("  costliest direct imports (-X importtime, cumulative):")
    for ms, name in top_imports(HANDLER_IMPORT, args.top):
        print(f"    {ms:7.1f} ms  {name}")
    if args.no_bundle:
        return 0
    from bench import bundle_size  # imports aws_cdk (jsii starts node): only when needed

    bundle_args = [] if args.wheelhouse is None else ["--wheelhouse", args.wheelhouse]
    return bundle_size.main(bundle_args)


if __name__ == "__main__":
    sys.exit(main())

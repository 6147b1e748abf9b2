"""Cold start before/after: the writer handler's import from two trees' bundles, interleaved.

``--before-tree DIR`` is a checkout of another commit (``git worktree add``); its handler's
module is ``--before-module`` (``lambda_writer.handler`` before one folder per function).

Each tree's writer bundle is built by that tree's own ``infra.bundling`` (runtime wheels for this
host, its sources, bytecode), made read-only, and imported as ``bench.cold_start`` imports it as
Lambda loads it (base interpreter ``-S``, the bundle and the stdlib only, the runtime bootstrap's
stdlib imports first, ``PYDANTIC_DISABLE_PLUGINS``). Every round runs both, in alternating order,
so the machine's load hits both alike; the figures are per tree (min, median and the median's
95 % interval from the order statistics) and of the paired difference after - before (median,
95 % interval by the sign test's order statistics).
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench._harness import cli, load, machine, parse
from bench.cold_start import REPO, Layout, _read_only, run_layout, unlock

_IMPORT = """
import time
t0 = time.perf_counter()
import {module}
print("RESULT", (time.perf_counter() - t0) * 1000, 0.0)
"""

# Builds one tree's bundle with that tree's own bundling code (cwd first on sys.path).
_BUILD = """
import sys
from pathlib import Path
from infra import bundling
assert Path(bundling.__file__).resolve().is_relative_to(Path.cwd().resolve()), bundling.__file__
bundling.build_bundle(Path(sys.argv[1]), root=Path.cwd(), python=[sys.executable],
                      target=["--only-binary=:all:"])
"""


def build(tree: Path, task: Path) -> None:
    """``tree``'s writer bundle into ``task``, read-only."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-c", _BUILD, str(task)], cwd=tree, env=env, check=True)
    _read_only(task)


def median_interval(values: Sequence[float]) -> tuple[float, float]:
    """The 95 % distribution-free interval of the median: order statistics k and n - k + 1 with
    k the largest such that P(Binomial(n, 1/2) < k) <= 2.5 %."""
    ordered, n = sorted(values), len(values)
    k, below = 0, 0.0
    while True:
        below += math.comb(n, k) / 2**n
        if below > 0.025:
            break
        k += 1
    if k == 0:
        return ordered[0], ordered[-1]
    return ordered[k - 1], ordered[n - k]


def _line(name: str, values: Sequence[float]) -> str:
    low, high = median_interval(values)
    return (
        f"  {name:<44} min {min(values):6.1f}  median {statistics.median(values):6.1f}"
        f"  [95 % {low:6.1f}, {high:6.1f}] ms"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Print both trees' import figures and their paired difference."""
    p = cli(__doc__)
    p.add_argument("--before-tree", type=Path, required=True)
    p.add_argument("--before-module", default="lambda_writer.handler")
    p.add_argument("--after-tree", type=Path, default=REPO)
    p.add_argument("--after-module", default="lambda_writer.writer.handler")
    p.add_argument("--runs", type=int, default=40)
    args = parse(p, argv)
    sides = {
        "before": (args.before_tree.resolve(), args.before_module),
        "after": (args.after_tree.resolve(), args.after_module),
    }
    figures: dict[str, list[float]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="ckpt-cold-ab-") as tmp:
        workdir = Path(tmp)
        try:
            layouts = {}
            for side, (tree, _module) in sides.items():
                task = workdir / side
                build(tree, task)
                layouts[side] = Layout(task, side)
            event = workdir / "unused-event.json"
            event.write_text("{}")
            print(
                f"cold start before/after: the writer handler's import as Lambda loads it, "
                f"{args.runs} rounds interleaved; {machine()}"
            )
            for side, (tree, module) in sides.items():  # warm the page cache
                run_layout(layouts[side], _IMPORT.format(module=module), event, None)
                print(f"  {side}: import {module} from the bundle of {tree}")
            for round_ in range(args.runs):
                order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
                for side in order:
                    script = _IMPORT.format(module=sides[side][1])
                    figures[side].append(run_layout(layouts[side], script, event, None)[0])
        finally:
            unlock(workdir)
    for side in sides:
        print(_line(f"{side} ({sides[side][1]})", figures[side]))
    diffs = [a - b for a, b in zip(figures["after"], figures["before"], strict=True)]
    low, high = median_interval(diffs)
    print(
        f"  {'after - before, paired by round':<44} median {statistics.median(diffs):+6.1f}"
        f"  [95 % {low:+6.1f}, {high:+6.1f}] ms"
    )
    print(f"  load average at end {load()}")
    return 0

"""Cold start: the writer handler's import and its first batch in fresh interpreters.

Method and figures: BENCHMARKS.md §5. Every round runs each layout in fresh processes, the
layouts' order alternating, so that the machine's load hits them alike. ``--before-tree DIR``
(another commit's checkout) adds that tree's bundle, built by its own ``infra.bundling``, and
the paired difference of the asset's import against it. Then ``-X importtime`` charges every
module's self time to the nearest importing package of interest (``ckpt_contract.message``'s
line to pydantic's: the contract model's build). The bundle's size: ``bench bundle_size``.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench._harness import cli, load, machine, median_interval, migrated_database, parse

REPO = Path(__file__).resolve().parent.parent
HANDLER_IMPORT = "import lambda_writer.writer.handler"
# As in Lambda: Powertools metrics are set up at import; no secrets or DB are touched then.
_ENV = {**os.environ, "POWERTOOLS_METRICS_DISABLED": "true", "PYTHONPATH": str(REPO)}
_ENV.pop("LAMBDA_TASK_ROOT", None)  # no Tracer: the X-Ray SDK is not in this venv's picture
# The writer function's own setting (infra/writer.py), for the Lambda-layout runs.
_LAMBDA_ENV = {**_ENV, "PYDANTIC_DISABLE_PLUGINS": "__all__", "PYTHONDONTWRITEBYTECODE": "1"}
_LAMBDA_ENV.pop("PYTHONPATH")
# What Lambda's Python runtime has imported before it imports the handler: the stdlib modules at
# the top of its bootstrap (awslambdaric/bootstrap.py). Its own modules import a few more
# (concurrent.futures, decimal), left out here: the figure errs high.
_RUNTIME_PREAMBLE = "import importlib, json, logging, os, sys, time, traceback\n"

# Timed inside the child: the import, then one invocation (the context holds the attributes
# Powertools reads, https://docs.aws.amazon.com/lambda/latest/dg/python-context.html).
_FIRST_BATCH = """
import sys, time, types
text = open(sys.argv[1]).read()
ctx = types.SimpleNamespace(function_name="ckpt-writer-bench", memory_limit_in_mb=256,
    invoked_function_arn="arn:aws:lambda:us-east-1:000000000000:function:ckpt-writer-bench",
    aws_request_id="bench", get_remaining_time_in_millis=lambda: 30000)
t0 = time.perf_counter()
import lambda_writer.writer.handler as h
t1 = time.perf_counter()
import json
response = h.handler(json.loads(text), ctx)
t2 = time.perf_counter()
assert response == {"batchItemFailures": []}, response
print("RESULT", (t1 - t0) * 1000, (t2 - t1) * 1000)
"""
_IMPORT_ONLY = """
import time
t0 = time.perf_counter()
import {module}
print("RESULT", (time.perf_counter() - t0) * 1000, 0.0)
"""
# Builds a tree's bundle with that tree's own bundling code (its cwd first on sys.path).
_BUILD = """
import sys
from pathlib import Path
from infra import bundling
assert Path(bundling.__file__).resolve().is_relative_to(Path.cwd().resolve()), bundling.__file__
bundling.build_bundle(Path(sys.argv[1]), root=Path.cwd(), python=[sys.executable],
                      target=["--only-binary=:all:"])
"""
_IAM_TOKEN = """
import os, time
os.environ.update(AWS_ACCESS_KEY_ID="AKIDEXAMPLE", AWS_SECRET_ACCESS_KEY="x" * 40,
    AWS_SESSION_TOKEN="bench", AWS_REGION="eu-west-1")
import lambda_writer.writer.handler
t0 = time.perf_counter()
from lambda_writer.shared import aws
aws.rds_auth_token(host="p.proxy-x.eu-west-1.rds.amazonaws.com", port=5432, user="ckpt_writer",
                   region="eu-west-1")
print("RESULT", (time.perf_counter() - t0) * 1000)
"""

# Package (top-level name) -> the share it is charged to; modules outside these are charged to
# the nearest importer that is in one (stdlib modules first imported by psycopg are psycopg's).
_GROUPS = {
    "pydantic": "pydantic", "pydantic_core": "pydantic", "annotated_types": "pydantic",
    "typing_inspection": "pydantic", "ckpt_contract": "ckpt_contract (other)",
    "psycopg": "psycopg", "psycopg_binary": "psycopg", "psycopg_c": "psycopg",
    "aws_lambda_powertools": "aws_lambda_powertools", "jmespath": "aws_lambda_powertools",
    "boto3": "boto3/botocore", "botocore": "boto3/botocore", "aws_xray_sdk": "boto3/botocore",
    "lambda_writer": "lambda_writer (own + stdlib it imports)",
}  # fmt: skip
_MODEL_BUILD = "ckpt_contract.message"


@dataclass
class Layout:
    """One bundle directory laid out as Lambda's /var/task, and its figures."""

    path: Path
    label: str
    root: Path | None = None  # run by this Debian root's python3.14 (--runtime-root)
    module: str = "lambda_writer.writer.handler"  # another tree's (--before-module): import only
    imports: list[float] = field(default_factory=list)
    batches: list[float] = field(default_factory=list)


def _run(script: str, *args: str, env: dict[str, str] | None = None) -> list[float]:
    """The RESULT figures of one fresh ``python -c SCRIPT ARGS`` importing from this checkout."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], cwd=REPO, env=env or _ENV, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    return _result(proc.stdout)


def _result(stdout: str) -> list[float]:
    line = next(x for x in reversed(stdout.splitlines()) if x.startswith("RESULT "))
    return [float(v) for v in line.split()[1:]]


def _in_root(root: Path) -> list[str]:
    """The root's python3.14, run in the caller's working directory (seen there as /mnt/cwd)."""
    return ["env", f"ARM64_ROOT={root}", str(REPO / ".ci" / "arm64-python")]


def lambda_layout(workdir: Path) -> Layout:
    """The writer bundle for this host's platform and Python, with bytecode, read-only."""
    from infra import bundling  # imports aws_cdk (jsii starts node): only when needed

    task = workdir / "bytecode"
    bundling.build_bundle(task, root=REPO, python=[sys.executable], target=["--only-binary=:all:"])
    _read_only(task)
    return Layout(task, "with bytecode (the asset)")


def runtime_layout(workdir: Path, root: Path) -> Layout:
    """The bundle for the Lambda runtime's Python version and this host's architecture."""
    from infra import bundling, constants

    machine = platform.machine()
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)
    marker = root / f".ckpt-{arch}-complete"  # written last by .ci/setup-arm64.sh
    if not marker.exists():
        raise SystemExit(
            f"--runtime-root {root}: no {marker.name} (ROOT_ARCH={arch} .ci/setup-arm64.sh)"
        )
    target = [
        "--platform", f"manylinux_2_28_{machine}", "--platform", f"manylinux2014_{machine}",
        "--implementation", "cp", "--python-version", constants.LAMBDA_PYTHON_VERSION,
        "--only-binary=:all:",
    ]  # fmt: skip
    task = workdir / "runtime" / "task"  # the root sees runtime/ as /mnt/cwd
    bundling.build_bundle(task, root=REPO, python=_in_root(root), target=target)
    _read_only(task)
    version = constants.LAMBDA_PYTHON_VERSION
    return Layout(task, f"python{version} (the runtime's version, {machine}), bytecode", root)


def tree_layout(workdir: Path, tree: Path, module: str) -> Layout:
    """``tree``'s writer bundle, built by its own ``infra.bundling``, read-only."""
    task = workdir / "before"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-c", _BUILD, str(task)], cwd=tree, env=env, check=True)
    _read_only(task)
    return Layout(task, f"--before-tree {tree} ({module})", module=module)


def _read_only(tree: Path) -> None:
    for path in (*tree.rglob("*"), tree):
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~0o222)


def unlock(workdir: Path) -> None:
    """Make ``workdir``'s read-only bundles deletable again."""
    for path in (workdir, *workdir.rglob("*")):
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o200)


def run_layout(layout: Layout, script: str, event: Path, url: str | None) -> list[float]:
    """Import (+ first batch) from ``layout`` and the stdlib only, as Lambda does."""
    db = {} if url is None else {"DATABASE_URL": url}
    if layout.root is None:
        # -S: no site-packages of the build host; PYTHONPATH puts the bundle first, as Lambda's
        # /var/task is; cwd / so that nothing of this checkout is importable.
        base = getattr(sys, "_base_executable", sys.executable)
        proc = subprocess.run(
            [base, "-S", "-c", _RUNTIME_PREAMBLE + script, str(event)], cwd="/",
            env={**_LAMBDA_ENV, **db, "PYTHONPATH": str(layout.path)}, capture_output=True,
            text=True, check=True,
        )  # fmt: skip
        return _result(proc.stdout)
    # The root's interpreter gets no variables: set first, as Lambda's are before its bootstrap.
    home = layout.path.parent
    shutil.copyfile(event, home / "event.json")
    env = {k: v for k, v in _LAMBDA_ENV.items() if k.startswith(("POWERTOOLS_", "PYDANTIC_"))}
    setup = (
        f"import os, sys; os.environ.update({env | db!r}); sys.path.insert(0, '/mnt/cwd/task');"
        " sys.dont_write_bytecode = True\n"
    )
    proc = subprocess.run(
        [*_in_root(layout.root), "-S", "-c", setup + _RUNTIME_PREAMBLE + script,
         "/mnt/cwd/event.json"],
        cwd=home, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return _result(proc.stdout)


def write_event(path: Path) -> None:
    """10 new valid reports of one new checkpoint, as Lambda's SQS event source delivers them."""
    import uuid

    from bench._reports import checkpoint, lambda_event

    job = f"cold-{uuid.uuid4().hex[:12]}"
    path.write_text(json.dumps(lambda_event(checkpoint(job, 1, 10, metrics={"acc": 0.9}))))


def attribute(runs: int) -> tuple[dict[str, float], float]:
    """({share: ms}, model build ms): min self time per module over ``runs``, charged to groups."""
    best: dict[str, int] = {}
    parents: dict[str, str | None] = {}
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", HANDLER_IMPORT],
            cwd=REPO, env=_ENV, capture_output=True, text=True, check=True,
        )  # fmt: skip
        # The tree is printed children first: a line at depth d adopts the pending d+1 lines.
        pending: dict[int, list[str]] = defaultdict(list)
        for line in proc.stderr.splitlines():
            if not line.startswith("import time:") or "cumulative" in line:
                continue
            self_us, _, raw = line.split(":", 1)[1].split("|")
            name = raw.strip()
            depth = (len(raw) - len(raw.lstrip(" ")) - 1) // 2
            for child in pending.pop(depth + 1, []):
                parents[child] = name
            pending[depth].append(name)
            parents.setdefault(name, None)
            best[name] = min(best.get(name, 1 << 62), int(self_us))
    shares: dict[str, float] = defaultdict(float)
    for name, us in best.items():
        node: str | None = name
        group: str | None = None
        while node is not None and group is None:
            group = _GROUPS.get(node.split(".")[0])
            node = parents.get(node)
        if group is not None:  # None: interpreter start-up (site, encodings), not the import
            shares["pydantic" if name == _MODEL_BUILD else group] += us / 1000
    return dict(shares), best.get(_MODEL_BUILD, 0) / 1000


def _ms(values: Sequence[float]) -> str:
    low, high = median_interval(values)
    return (
        f"min {min(values):6.1f}  p50 {statistics.median(values):6.1f} [95 % {low:.1f}, {high:.1f}]"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Print import (and first batch) figures and the attribution."""
    p = cli(__doc__, admin_url=True)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--no-first-batch", action="store_true", help="import only (no DB)")
    p.add_argument("--no-lambda-layout", action="store_true",
                   help="skip the bundle-as-Lambda-loads-it runs")  # fmt: skip
    p.add_argument("--runtime-root", type=Path, default=None,
                   help="a Debian root with python3.14 for this host (ROOT_ARCH=amd64"
                   " .ci/setup-arm64.sh)")  # fmt: skip
    p.add_argument("--before-tree", type=Path, default=None,
                   help="another checkout: its bundle beside this one's")  # fmt: skip
    p.add_argument("--before-module", default="lambda_writer.handler", help="its handler module")
    args = parse(p, argv)
    if args.before_tree is not None and args.no_lambda_layout:
        p.error("--before-tree is compared with this tree's bundle: drop --no-lambda-layout")
    print(
        f"cold start: '{HANDLER_IMPORT}' in fresh {sys.implementation.name}"
        f" {sys.version.split()[0]} processes, {args.runs} runs, interleaved; {machine()} at start"
    )
    figures: dict[str, list[float]] = defaultdict(list)
    with contextlib.ExitStack() as stack:
        url = None
        if not args.no_first_batch:
            url = stack.enter_context(migrated_database(args.admin_url, prefix="ckpt_bench_cold_"))
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        event = workdir / "event.json"
        layouts: list[Layout] = []
        if not args.no_lambda_layout:
            stack.callback(unlock, workdir)  # read-only trees: let the cleanup delete them
            layouts.append(lambda_layout(workdir))
            if args.runtime_root is not None:
                layouts.append(runtime_layout(workdir, args.runtime_root))
            if args.before_tree is not None:
                layouts.append(tree_layout(workdir, args.before_tree.resolve(), args.before_module))
        own_import = _IMPORT_ONLY.format(module="lambda_writer.writer.handler")
        _run(own_import)  # warm the page cache and .pyc files, as a deployed bundle is
        for layout in layouts:  # the page cache only: nothing can be written there
            write_event(event)
            run_layout(layout, _IMPORT_ONLY.format(module=layout.module), event, None)
        for round_ in range(args.runs):
            write_event(event)
            if url is None:
                figures["import"].append(_run(own_import)[0])
            else:
                imported, batch = _run(_FIRST_BATCH, str(event), env={**_ENV, "DATABASE_URL": url})
                figures["import"].append(imported)
                figures["batch"].append(batch)
            figures["iam"].append(_run(_IAM_TOKEN)[0])
            for layout in layouts if round_ % 2 == 0 else layouts[::-1]:
                write_event(event)
                first_batch = url is not None and layout.module == "lambda_writer.writer.handler"
                script = _FIRST_BATCH if first_batch else _IMPORT_ONLY.format(module=layout.module)
                imported, batch = run_layout(layout, script, event, url if first_batch else None)
                layout.imports.append(imported)
                if first_batch:
                    layout.batches.append(batch)
    if layouts:
        print(
            "  as Lambda loads it: the bundle (infra.bundling's layout), read-only, base"
            " interpreter -S, the runtime bootstrap's stdlib imports first,"
            " PYDANTIC_DISABLE_PLUGINS=__all__:"
        )
    for layout in layouts:
        print(f"    {layout.label}:")
        print(f"      in-process import        {_ms(layout.imports)} ms   (goal: min <= 200 ms)")
        if layout.batches:
            total = [i + b for i, b in zip(layout.imports, layout.batches, strict=True)]
            print(f"      first batch (10 records) {_ms(layout.batches)} ms")
            print(f"      import + first batch     {_ms(total)} ms")
    if args.before_tree is not None:
        diffs = [a - b for a, b in zip(layouts[0].imports, layouts[-1].imports, strict=True)]
        low, high = median_interval(diffs)
        print(f"    this tree - before tree, import paired by round: median"
              f" {statistics.median(diffs):+.1f} [95 % {low:+.1f}, {high:+.1f}] ms")  # fmt: skip
    print("  this venv (dev install):")
    print(f"    in-process import         {_ms(figures['import'])} ms")
    if figures["batch"]:
        total = [i + b for i, b in zip(figures["import"], figures["batch"], strict=True)]
        print(f"    first batch (10 records)  {_ms(figures['batch'])} ms")
        print(f"    import + first batch      {_ms(total)} ms")
    print(f"    IAM token                 {_ms(figures['iam'])} ms   (AWS first connect)")
    shares, build = attribute(args.runs)
    print("  shares of the import (-X importtime, min self time per module, charged to importer):")
    for name, ms in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"    {name:<40}{ms:8.1f} ms")
    whole, pyd = sum(shares.values()), shares.get("pydantic", 0.0)
    print(f"    {'sum':<40}{whole:8.1f} ms")
    print(
        f"  pydantic's share: {pyd:.1f} ms of {whole:.1f} ms ({100 * pyd / whole:.0f} %), of which"
        f" ckpt_contract.message's line {build:.1f} ms (the model build, pydantic.main, .fields)"
    )
    print(f"  load average at end {load()}")
    return 0

"""Cold start: the writer handler's import and its first batch in fresh interpreters; the bundle.

Run: ``python -m bench.cold_start [--runs 10] [--tree DIR ...] [--no-first-batch] [--no-bundle]
[--no-lambda-layout] [--runtime-root DIR]``.

Per tree (default: this checkout; ``--tree DIR`` repeated measures those instead, e.g. ``git
worktree``s of two commits, run interleaved so the machine's load hits them alike), each run is:

* ``python -c "import lambda_writer.handler"`` timed from outside (wall, and the child's CPU):
  what Lambda's init phase pays for the module, interpreter start-up included (``python -c
  pass`` is printed beside it);
* a fresh process that imports the handler and then calls it once on a real SQS event of 10
  new valid reports, against a throwaway migrated database on the local PostgreSQL
  (``DATABASE_URL``): import, then first batch (connect included), timed inside the process.
  Deferring an import from the first line to the second is no win; only their sum is;
* on AWS the first connect also makes an IAM auth token (boto3, an RDS client, local signing):
  timed in a fresh process after the handler import, with fake static credentials (no network).

As Lambda loads it (``--no-lambda-layout`` skips this): the writer's runtime wheels installed for
this host with ``pip --target`` beside the sources, as ``infra.bundling`` lays out the asset, made
read-only as Lambda's /var/task is (nothing gets cached between runs), imported by the base
interpreter with only that directory and the stdlib on the path, after the stdlib modules Lambda's
runtime bootstrap has imported before it imports a handler, with the function's
``PYDANTIC_DISABLE_PLUGINS``: once with the bundle's bytecode (``infra.bundling.compile_bytecode``,
the asset as built now) and once from sources only (the asset before: every cold start compiled
every module). Same import + first batch as above, interleaved with the trees. With ``--tree``
given more than once, one bundle with bytecode per tree (the same wheels), also interleaved: the
before/after of a change to the import, as Lambda loads it.

``--runtime-root DIR`` (a Debian root with python3.14 for this host's architecture, built by
``ROOT_ARCH=amd64 .ci/setup-arm64.sh``; root privileges) adds the same bundle for the Lambda
runtime's Python version (``constants.LAMBDA_PYTHON_VERSION``, its wheels for this host's
architecture), byte-compiled and run by that interpreter, natively, in the root: what the function
runs, but for the architecture. The dev venv's interpreter is not it: here a pyenv build without
PGO/LTO, a different version, different wheels.

``-X importtime`` then charges every module's self time (the minimum over the runs, so the
machine's load inflates it least) to the nearest importing package of interest: what the import
would save without that package. ``ckpt_contract.message``'s own line is counted in pydantic's
share: the contract model's build, and also the bodies of ``pydantic.main`` and ``pydantic.fields``,
which pydantic's lazy ``__getattr__`` imports through ``importlib`` and ``-X importtime`` does not
list. So pydantic is also timed apart, in the bundle with bytecode: what the import would save
without it (its import after the handler's other libraries, Powertools and psycopg, are loaded),
and the contract model's build alone (``import ckpt_contract`` after that).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HANDLER_IMPORT = "import lambda_writer.handler"
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
# As in Lambda: Powertools metrics are set up at import; no secrets or DB are touched then.
_ENV = {**os.environ, "POWERTOOLS_METRICS_DISABLED": "true"}
_ENV.pop("LAMBDA_TASK_ROOT", None)  # no Tracer: the X-Ray SDK is not in this venv's picture

# Timed inside the child: the import, then one invocation (the context is the attributes
# Powertools reads, https://docs.aws.amazon.com/lambda/latest/dg/python-context.html).
_FIRST_BATCH = """
import sys, time, types
text = open(sys.argv[1]).read()
ctx = types.SimpleNamespace(function_name="ckpt-writer-bench", memory_limit_in_mb=256,
    invoked_function_arn="arn:aws:lambda:us-east-1:000000000000:function:ckpt-writer-bench",
    aws_request_id="bench", get_remaining_time_in_millis=lambda: 30000)
t0 = time.perf_counter()
import lambda_writer.handler as h
t1 = time.perf_counter()
import json
response = h.handler(json.loads(text), ctx)
t2 = time.perf_counter()
assert response == {"batchItemFailures": []}, response
print("RESULT", (t1 - t0) * 1000, (t2 - t1) * 1000)
"""
# What Lambda's Python runtime has imported before it imports the handler: the stdlib modules at
# the top of its bootstrap (awslambdaric/bootstrap.py, which the managed runtime runs). Its own
# modules import a few more (concurrent.futures, decimal), left out here: the figure errs high.
_RUNTIME_PREAMBLE = "import importlib, json, logging, os, sys, time, traceback\n"
# The writer function's own setting (infra/writer.py), for the Lambda-layout runs.
_LAMBDA_ENV = {**_ENV, "PYDANTIC_DISABLE_PLUGINS": "__all__", "PYTHONDONTWRITEBYTECODE": "1"}
_LAMBDA_ENV.pop("PYTHONPATH", None)

# {make} is one of the two token makers below; the handler is imported first, as in Lambda.
_IAM_TOKEN = """
import os, time
os.environ.update(AWS_ACCESS_KEY_ID="AKIDEXAMPLE", AWS_SECRET_ACCESS_KEY="x" * 40,
    AWS_SESSION_TOKEN="bench", AWS_REGION="eu-west-1")
import lambda_writer.handler
t0 = time.perf_counter()
from lambda_writer import aws
host, port, user = "p.proxy-x.eu-west-1.rds.amazonaws.com", 5432, "ckpt_writer"
{make}
print("RESULT", (time.perf_counter() - t0) * 1000)
"""
# What lambda_writer.connection._iam_token did at the "before" commit (an RDS client) ...
_VIA_CLIENT = (
    'aws.client("rds", region="eu-west-1")'
    ".generate_db_auth_token(DBHostname=host, Port=port, DBUsername=user)"
)
# ... and lambda_writer.aws.rds_auth_token (the same token, no RDS client), where the tree has it.
_CLIENTLESS = 'aws.rds_auth_token(host=host, port=port, user=user, region="eu-west-1")'

# Package (top-level name) -> the share it is charged to; modules outside these are charged to
# the nearest importer that is in one (stdlib modules first imported by psycopg are psycopg's).
_GROUPS = {
    "pydantic": "pydantic",
    "pydantic_core": "pydantic",
    "annotated_types": "pydantic",
    "typing_inspection": "pydantic",
    "ckpt_contract": "ckpt_contract (other)",
    "psycopg": "psycopg",
    "psycopg_binary": "psycopg",
    "psycopg_c": "psycopg",
    "aws_lambda_powertools": "aws_lambda_powertools",
    "jmespath": "aws_lambda_powertools",
    "boto3": "boto3/botocore",
    "botocore": "boto3/botocore",
    "aws_xray_sdk": "boto3/botocore",
    "lambda_writer": "lambda_writer (own + stdlib it imports)",
}
_MODEL_BUILD = "ckpt_contract.message"


@dataclass
class Tree:
    """One source tree whose ``lambda_writer`` is measured, and its figures."""

    path: Path
    label: str
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    imports: list[float] = field(default_factory=list)
    batches: list[float] = field(default_factory=list)
    iam_client: list[float] = field(default_factory=list)
    iam_clientless: list[float] = field(default_factory=list)

    @property
    def has_clientless(self) -> bool:
        return "def rds_auth_token" in (self.path / "lambda_writer" / "aws.py").read_text()


def _label(path: Path) -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(path), *args], capture_output=True, text=True, check=False
        ).stdout.strip()

    dirty = git("status", "--porcelain", "--", "lambda_writer", "ckpt_contract")
    return f"{git('rev-parse', '--short', 'HEAD') or path.name}{' + changes' if dirty else ''}"


def _run(
    tree: Path, args: Sequence[str], env: dict[str, str] | None = None
) -> tuple[float, float, str]:
    """(wall s, child CPU s, stdout) of one fresh ``python ARGS`` importing from ``tree``."""
    # cwd and PYTHONPATH put the tree first, ahead of this checkout's editable install.
    child_env = {**(env or _ENV), "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *args], cwd=tree, env=child_env, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


@dataclass
class Layout:
    """One bundle directory laid out as Lambda's /var/task, and its figures."""

    path: Path
    label: str
    imports: list[float] = field(default_factory=list)
    batches: list[float] = field(default_factory=list)
    apart: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    root: Path | None = None  # run by this Debian root's python3.14 (--runtime-root)


def _in_root(root: Path) -> list[str]:
    """The root's python3.14, run in the caller's working directory (seen there as /mnt/cwd)."""
    return ["env", f"ARM64_ROOT={root}", str(REPO / ".ci" / "arm64-python")]


def _runtime_layout(workdir: Path, n: int, tree: Tree, root: Path) -> Layout:
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
    task = workdir / f"runtime-{n}" / "task"  # the root sees runtime-N as /mnt/cwd
    bundling.build_bundle(task, root=tree.path, python=_in_root(root), target=target)
    _read_only(task)
    label = (
        f"python{constants.LAMBDA_PYTHON_VERSION} (the runtime's version, {machine}), with bytecode"
    )
    return Layout(task, f"{tree.label}, {label}" if tree.path != REPO else label, root=root)


def _lambda_layouts(workdir: Path, trees: Sequence[Tree]) -> list[Layout]:
    """The writer bundle for this host, with bytecode and from sources only, all read-only.

    One bundle with bytecode per tree (the same wheels, each tree's sources), so that two commits'
    cold starts are measured interleaved; sources only for the first tree.
    """
    from infra import bundling  # imports aws_cdk (jsii starts node): only when needed

    # The bundle as infra.bundling builds it, for this host's platform and Python.
    compiled = workdir / "bytecode"
    bundling.build_bundle(
        compiled, root=trees[0].path, python=[sys.executable], target=["--only-binary=:all:"]
    )
    sources = workdir / "sources-only"
    shutil.copytree(compiled, sources, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    named = len(trees) > 1
    layouts = [Layout(compiled, f"{trees[0].label}, with bytecode" if named
                      else "with bytecode (the asset now)")]  # fmt: skip

    def wheels_only(directory: str, _: list[str]) -> Sequence[str]:
        return bundling.PACKAGES if Path(directory) == compiled else ()

    for n, tree in enumerate(trees[1:], start=1):
        other = workdir / f"bytecode-{n}"
        shutil.copytree(compiled, other, symlinks=True, ignore=wheels_only)
        bundling.copy_sources(tree.path, other)
        bundling.compile_bytecode(other, [sys.executable])
        layouts.append(Layout(other, f"{tree.label}, with bytecode"))
    layouts.append(Layout(sources, f"{trees[0].label}, sources only" if named
                          else "sources only (the asset before)"))  # fmt: skip
    for layout in layouts:
        _read_only(layout.path)
    return layouts


def _read_only(tree: Path) -> None:
    for path in (*tree.rglob("*"), tree):
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~0o222)


def _unlock(workdir: Path) -> None:
    for path in (workdir, *workdir.rglob("*")):
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o200)


def _run_layout(layout: Layout, script: str, event: Path, url: str | None) -> list[float]:
    """Import (+ first batch) in the base interpreter, from ``layout`` and the stdlib only."""
    if layout.root is not None:
        return _run_in_root(layout, script, event, url)
    base = getattr(sys, "_base_executable", sys.executable)
    env = {**_LAMBDA_ENV, "PYTHONPATH": str(layout.path)}
    if url is not None:
        env["DATABASE_URL"] = url
    # -S: no site-packages of the build host; PYTHONPATH still puts the bundle first, as Lambda's
    # /var/task is. cwd / so that nothing of this checkout is importable.
    proc = subprocess.run(
        [base, "-S", "-c", _RUNTIME_PREAMBLE + script, str(event)], cwd="/", env=env,
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return _result(proc.stdout)


def _run_in_root(layout: Layout, script: str, event: Path, url: str | None) -> list[float]:
    """As :func:`_run_layout`, by the root's interpreter (which gets no variables: set them first).

    The variables and the path are set before the runtime preamble, as Lambda's are before its
    bootstrap starts; nothing they change is imported before the timed import.
    """
    home = layout.path.parent
    shutil.copyfile(event, home / "event.json")
    env = {k: v for k, v in _LAMBDA_ENV.items() if k.startswith(("POWERTOOLS_", "PYDANTIC_"))}
    if url is not None:
        env["DATABASE_URL"] = url
    setup = (
        f"import os, sys; os.environ.update({env!r}); sys.path.insert(0, '/mnt/cwd/task');"
        " sys.dont_write_bytecode = True\n"
    )
    proc = subprocess.run(
        [*_in_root(layout.root or Path()), "-S", "-c", setup + _RUNTIME_PREAMBLE + script,
         "/mnt/cwd/event.json"],
        cwd=home, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return _result(proc.stdout)


_IMPORT_ONLY = """
import time
t0 = time.perf_counter()
import lambda_writer.handler
print("RESULT", (time.perf_counter() - t0) * 1000, 0.0)
"""


# Pydantic's part of the handler's import, timed apart: its import after the handler's other
# libraries (what the contract imports of it, and the plugin loader its model build imports),
# then the contract's model build.
_PYDANTIC_APART = """
import time
import aws_lambda_powertools.metrics, psycopg
t0 = time.perf_counter()
from pydantic import (BaseModel, ConfigDict, Field, StringConstraints, ValidationError,
    ValidationInfo, field_serializer, field_validator)
import pydantic.plugin._loader
t1 = time.perf_counter()
import ckpt_contract
print("RESULT", (t1 - t0) * 1000, (time.perf_counter() - t1) * 1000)
"""


def _result(stdout: str) -> list[float]:
    line = next(x for x in reversed(stdout.splitlines()) if x.startswith("RESULT "))
    return [float(v) for v in line.split()[1:]]


def _event(path: Path) -> None:
    """10 new valid reports of one checkpoint, as Lambda's SQS event source delivers them."""
    from ckpt_contract import CheckpointReport, encode

    job, now = f"cold-{uuid.uuid4().hex[:12]}", datetime.now(UTC)
    records = []
    for rank in range(10):
        report = CheckpointReport.create(
            job_id=job, run_attempt=0, step=1, epoch=0, world_size=10, rank=rank,
            uri=f"s3://bench/{job}/1/{rank}.pt", loss=0.5, metrics={"acc": 0.9}, created_at=now,
        )  # fmt: skip
        records.append(
            {
                "messageId": str(uuid.uuid4()),
                "body": encode(report),
                "attributes": {
                    "MessageGroupId": report.group_id,
                    "ApproximateReceiveCount": "1",
                    "ApproximateFirstReceiveTimestamp": str(int(now.timestamp() * 1000)),
                    "SequenceNumber": str(rank + 1),
                },
                "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:bench.fifo",
            }
        )
    path.write_text(json.dumps({"Records": records}))


def attribute(tree: Path, runs: int) -> tuple[dict[str, float], float]:
    """({share: ms}, model build ms): min self time per module over ``runs``, charged to groups."""
    best: dict[str, int] = {}
    parents: dict[str, str | None] = {}
    for _ in range(runs):
        env = {**_ENV, "PYTHONPATH": str(tree)}
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", HANDLER_IMPORT],
            cwd=tree, env=env, capture_output=True, text=True, check=True,
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
        root: str | None = name
        group: str | None = None
        while root is not None and group is None:
            group = _GROUPS.get(root.split(".")[0])
            root = parents.get(root)
        if group is not None:  # None: interpreter start-up (site, encodings), not the import
            shares["pydantic" if name == _MODEL_BUILD else group] += us / 1000
    return dict(shares), best.get(_MODEL_BUILD, 0) / 1000


@contextlib.contextmanager
def _database(admin_url: str) -> Iterator[str]:
    from bench._writer_profile import apply_schema
    from ckpt_pipeline.local.embedded_pg import throwaway_database

    with throwaway_database(admin_url, prefix="ckpt_bench_cold_") as url:
        apply_schema(url, None)
        yield url


def _ms(values: Sequence[float]) -> str:
    return f"min {min(values):6.1f}  p50 {statistics.median(values):6.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    """Print import (and first batch) figures per tree, the attribution, the bundle size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument(
        "--tree", action="append", default=[], help="a tree to measure (repeatable; default: this)"
    )
    parser.add_argument("--admin-url", default=os.environ.get("CKPT_BENCH_ADMIN_URL", ADMIN_URL))
    parser.add_argument("--no-first-batch", action="store_true", help="import only (no DB)")
    parser.add_argument("--no-bundle", action="store_true", help="skip building the bundle")
    parser.add_argument("--wheelhouse", default=None, help="offline wheels for the bundle")
    parser.add_argument(
        "--no-lambda-layout", action="store_true", help="skip the bundle-as-Lambda-loads-it runs"
    )
    parser.add_argument(
        "--runtime-root", type=Path, default=None,
        help="a Debian root with python3.14 for this host (ROOT_ARCH=amd64 .ci/setup-arm64.sh)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    trees = [Tree(p, _label(p)) for p in [Path(t).resolve() for t in args.tree] or [REPO]]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"cold start: '{HANDLER_IMPORT}' in fresh {sys.implementation.name}"
        f" {sys.version.split()[0]} processes, {args.runs} runs per tree, interleaved;"
        f" {os.cpu_count()} CPUs, load average {load} at start"
    )
    bare: list[float] = []
    with contextlib.ExitStack() as stack:
        url = None if args.no_first_batch else stack.enter_context(_database(args.admin_url))
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        event = workdir / "event.json"
        layouts: list[Layout] = []
        if not args.no_lambda_layout:
            stack.callback(_unlock, workdir)  # read-only trees: let the cleanup delete them
            layouts = _lambda_layouts(workdir, trees)
            if args.runtime_root is not None:
                layouts[1:1] = [
                    _runtime_layout(workdir, n, tree, args.runtime_root)
                    for n, tree in enumerate(trees)
                ]
        for tree in trees:  # warm the page cache and .pyc files, as a deployed bundle is
            _run(tree.path, ["-c", HANDLER_IMPORT])
        for layout in layouts:  # the page cache only: nothing can be written there
            _event(event)
            _run_layout(layout, _IMPORT_ONLY, event, None)
        for _ in range(args.runs):
            bare.append(_run(REPO, ["-c", "pass"])[0])
            for tree in trees:
                wall, cpu, _ = _run(tree.path, ["-c", HANDLER_IMPORT])
                tree.wall.append(wall * 1000)
                tree.cpu.append(cpu * 1000)
                if url is not None:
                    _event(event)
                    out = _run(
                        tree.path, ["-c", _FIRST_BATCH, str(event)], {**_ENV, "DATABASE_URL": url}
                    )[2]
                    imported, batch = _result(out)
                    tree.imports.append(imported)
                    tree.batches.append(batch)
                via_client = _IAM_TOKEN.format(make=_VIA_CLIENT)
                tree.iam_client.append(_result(_run(tree.path, ["-c", via_client])[2])[0])
                if tree.has_clientless:
                    clientless = _IAM_TOKEN.format(make=_CLIENTLESS)
                    tree.iam_clientless.append(_result(_run(tree.path, ["-c", clientless])[2])[0])
            for layout in layouts:
                _event(event)
                script = _IMPORT_ONLY if url is None else _FIRST_BATCH
                imported, batch = _run_layout(layout, script, event, url)
                layout.imports.append(imported)
                if layout is layouts[0]:
                    pyd, build = _run_layout(layout, _PYDANTIC_APART, event, None)
                    layout.apart["pydantic's own (apart)"].append(pyd)
                    layout.apart["model build (apart)"].append(build)
                if url is not None:
                    layout.batches.append(batch)
    print(f"  bare interpreter ('python -c pass'): wall {_ms([1000 * b for b in bare])} ms")
    if layouts:
        print(
            "  as Lambda loads it: this host's wheels + sources (infra.bundling's layout),"
            " read-only,"
            " base interpreter -S, the runtime bootstrap's stdlib imports first,"
            " PYDANTIC_DISABLE_PLUGINS=__all__:"
        )
    for layout in layouts:
        print(f"    {layout.label}:")
        goal = "   (the goal: min <= 200 ms)" if "sources" not in layout.label else ""
        print(f"      in-process import        {_ms(layout.imports)} ms{goal}")
        if layout.batches:
            total = [i + b for i, b in zip(layout.imports, layout.batches, strict=True)]
            print(f"      first batch (10 records) {_ms(layout.batches)} ms")
            print(f"      import + first batch     {_ms(total)} ms")
        for what, values in layout.apart.items():
            print(f"      {what:<25}{_ms(values)} ms")
    for tree in trees:
        print(f"  {tree.label} (this venv, dev install):")
        print(f"    whole process, wall       {_ms(tree.wall)} ms")
        print(f"    whole process, CPU        {_ms(tree.cpu)} ms")
        if tree.imports:
            total = [i + b for i, b in zip(tree.imports, tree.batches, strict=True)]
            print(f"    in-process import         {_ms(tree.imports)} ms")
            print(f"    first batch (10 records)  {_ms(tree.batches)} ms")
            print(f"    import + first batch      {_ms(total)} ms")
        print(f"    IAM token, RDS client     {_ms(tree.iam_client)} ms   (AWS first connect)")
        if tree.iam_clientless:
            print(f"    IAM token, clientless     {_ms(tree.iam_clientless)} ms   (rds_auth_token)")
    print("  shares of the import (-X importtime, min self time per module, charged to importer):")
    attributions = [attribute(tree.path, args.runs) for tree in trees]
    names = sorted(
        {n for shares, _ in attributions for n in shares},
        key=lambda n: -attributions[0][0].get(n, 0),
    )
    print("    " + " " * 40 + "".join(f"{t.label:>21}" for t in trees))
    for name in names:
        print(f"    {name:<40}" + "".join(f"{s.get(name, 0):18.1f} ms" for s, _ in attributions))
    print(f"    {'sum':<40}" + "".join(f"{sum(s.values()):18.1f} ms" for s, _ in attributions))
    for tree, (shares, build) in zip(trees, attributions, strict=True):
        whole, pyd = sum(shares.values()), shares.get("pydantic", 0.0)
        print(
            f"  pydantic's share ({tree.label}): {pyd:.1f} ms of {whole:.1f} ms"
            f" ({100 * pyd / whole:.0f} %), of which ckpt_contract.message's line {build:.1f} ms"
            " (the model build, pydantic.main, pydantic.fields)"
        )
    print(f"  load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.no_bundle:
        return 0
    from bench import bundle_size  # imports aws_cdk (jsii starts node): only when needed

    bundle_args = [] if args.wheelhouse is None else ["--wheelhouse", args.wheelhouse]
    return bundle_size.main(bundle_args)


if __name__ == "__main__":
    sys.exit(main())

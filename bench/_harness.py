"""What every bench repeats, written once: its command line, the load line beside its figures,
the local services it brings up (a migrated throwaway database, moto's SQS with a fresh queue,
an S3 emulator's client), measurement windows and percentiles, markdown tables, and the worker
processes released together at one barrier. Each bench module holds only its scenario.

The figures' plots are :mod:`bench._plot`'s (its own module: it imports no bench, and no bench
imports matplotlib unless ``--plot`` is given).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import queue
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Self

from bench import _plot

# The local server the database benches make their throwaway databases on (make test-services).
ADMIN_URL = os.environ.get("CKPT_BENCH_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


# -- the command line and the load line ---------------------------------------------------------


def load() -> str:
    """The 1, 5 and 15 minute load averages, printed beside every figure on a shared machine."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> str:
    """``N CPUs, load average a b c``, and the share of time some task waited for a CPU (Linux's
    PSI) where the kernel gives it: the line every bench starts its output with."""
    text = f"{os.cpu_count()} CPUs, load average {load()}"
    try:
        some = Path("/proc/pressure/cpu").read_text().split()[1]  # "avg10=12.34"
    except (OSError, IndexError):
        return text
    return f"{text}, CPU pressure {some.replace('avg10=', 'some avg10 ')} %"


def cli(
    doc: str, *, plot: str | None = None, sqs: str | None = None, admin_url: bool = False
) -> argparse.ArgumentParser:
    """A bench's parser (its docstring's first line as the description; ``python -m bench NAME``
    sets its prog) with the options several benches share: ``--plot DIR`` drawing ``plot`` there,
    ``--sqs`` (default ``sqs``), ``--admin-url``."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    if plot is not None:
        p.add_argument("--plot", type=Path, default=None, metavar="DIR",
                       help=f"also draw DIR/{plot} (needs the plot extra: matplotlib)")  # fmt: skip
    if sqs is not None:
        p.add_argument("--sqs", choices=["moto", "localstack"], default=sqs)
    if admin_url:
        p.add_argument("--admin-url", default=ADMIN_URL, help="server for a throwaway database")
    return p


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``; fail before a long run, not after it, when ``--plot`` lacks matplotlib."""
    args = p.parse_args(argv)
    if getattr(args, "plot", None) is not None:
        _plot.require()
    return args


def plotted(path: Path) -> None:
    """Say where a figure was drawn."""
    print(f"plot: {path}", flush=True)


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def secs(seconds: float | None) -> str:
    """``12.3 s``, ``45 ms`` under a second, ``never`` for a wait that did not end."""
    if seconds is None:
        return "never"
    return f"{seconds:.1f} s" if seconds >= 1 else f"{1000 * seconds:.0f} ms"


def table(header: str) -> None:
    """Print a markdown table's header row and its separator."""
    print(f"{header}\n|{'---|' * (header.count('|') - 1)}", flush=True)


# -- windows and percentiles ---------------------------------------------------------------------


def pct(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted ``ordered`` (the nearest rank)."""
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def median_interval(values: Sequence[float]) -> tuple[float, float]:
    """The 95 % distribution-free interval of the median (the sign test's order statistics k and
    n - k + 1, k the largest with P(Binomial(n, 1/2) < k) <= 2.5 %)."""
    ordered, n = sorted(values), len(values)
    k, below = 0, 0.0
    while (below := below + math.comb(n, k) / 2**n) <= 0.025:
        k += 1
    return (ordered[0], ordered[-1]) if k == 0 else (ordered[k - 1], ordered[n - k])


def median_ms(
    call: Callable[[], object], rounds: int, *, clock: Callable[[], float] = time.perf_counter,
    warm: bool = False,
) -> float:  # fmt: skip
    """Median milliseconds of ``call`` over ``rounds`` by ``clock`` (wall, or
    ``time.process_time``: CPU), after one unmeasured call when ``warm``."""
    if warm:
        call()
    times = []
    for _ in range(rounds):
        t0 = clock()
        call()
        times.append(1000 * (clock() - t0))
    return statistics.median(times)


# -- the local services ------------------------------------------------------------------------


@contextlib.contextmanager
def migrated_database(admin_url: str = ADMIN_URL, *, prefix: str = "ckpt_bench_") -> Iterator[str]:
    """A throwaway database on ``admin_url``'s server with every migration applied; its URL."""
    from ckpt_pipeline.local.embedded_pg import throwaway_database
    from lambda_writer import apply_migrations, connect_url

    with throwaway_database(admin_url, prefix=prefix) as url:
        with connect_url(url) as conn:
            apply_migrations(conn)
        yield url


def role_database(cluster: Any, prefix: str, role: str, statement_timeout: str) -> tuple[str, str]:
    """A migrated database on a throwaway ``cluster`` and a login role's URL for it (the writer's
    or an application's, with the seed's ``statement_timeout``): (admin URL, role URL)."""
    from ckpt_pipeline.local.embedded_pg import create_login_role
    from lambda_writer import apply_migrations, connect_url

    db = cluster.create_database(f"{prefix}_{uuid.uuid4().hex[:8]}")
    with connect_url(db) as conn:
        apply_migrations(conn)
    return db, create_login_role(cluster.admin_url, db, role, statement_timeout=statement_timeout)


@contextlib.contextmanager
def moto_sqs() -> Iterator[tuple[str, Any]]:
    """moto's server in its own process, boto3's environment pointed at it: (endpoint, an SQS
    client)."""
    from ckpt_pipeline.local.sqs_server import moto_sqs_server, set_local_aws_env
    from ckpt_pipeline.ops.sqs import sqs_client

    with moto_sqs_server() as endpoint:
        set_local_aws_env(endpoint)
        yield endpoint, sqs_client(endpoint)


def fresh_queue(sqs: Any, prefix: str) -> str:
    """A new pipeline queue pair's queue URL (moto's FIFO dedup scans the whole queue per
    message: a run gets its own)."""
    from ckpt_pipeline.local.sqs_server import create_pipeline_queues

    return create_pipeline_queues(sqs, prefix=f"{prefix}{uuid.uuid4().hex[:8]}").queue_url


def drain_bodies(sqs: Any, queue_url: str) -> list[dict[str, Any]]:
    """Every message left on ``queue_url``, received, deleted, its body decoded."""
    bodies: list[dict[str, Any]] = []
    while True:
        got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        if not got.get("Messages"):
            return bodies
        for m in got["Messages"]:
            bodies.append(json.loads(m["Body"]))
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])


def ranks_sqs(read_timeout_s: float, pool: int, *, connect_timeout_s: float = 5.0,
              validate: bool = True) -> Any:  # fmt: skip
    """The one boto3 SQS client a process's simulated ranks share (why: ``bench._ranks``),
    configured as a reporter's: one attempt per call, its timeouts, a pool of ``pool``
    connections; ``validate=False`` as ``_sqs_client._boto_client``."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client("sqs", config=Config(
        connect_timeout=connect_timeout_s, read_timeout=read_timeout_s,
        retries={"total_max_attempts": 1, "mode": "standard"}, parameter_validation=validate,
        max_pool_connections=pool,
    ))  # fmt: skip


def helpers_s3(endpoint: str, pool: int) -> Any:
    """The S3 client the client's own helpers make (``s3_client_for``), pointed at ``endpoint``
    through boto3's environment, as a job's is."""
    from ckpt_pipeline.ops.sqs import LOCAL_REGION
    from trainer_client.storage.verify import s3_client_for

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    os.environ.setdefault("AWS_DEFAULT_REGION", LOCAL_REGION)
    return s3_client_for(pool)


def caller_s3(endpoint: str, pool: int, *, text_timestamps: bool = False) -> Any:
    """A plain boto3 client of ``endpoint``, as a caller passes one; ``text_timestamps``: leaving
    timestamps as text, as the helpers' own clients do (``s3_client_for(…,
    parse_timestamps=False)``)."""
    import boto3
    import botocore.session
    from botocore.config import Config

    core = botocore.session.get_session()
    if text_timestamps:
        core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=str)
    return boto3.session.Session(botocore_session=core).client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
        aws_secret_access_key="bench",
        config=Config(max_pool_connections=pool, retries={"mode": "standard"}),
    )  # fmt: skip


# -- worker processes released together --------------------------------------------------------


class BarrierProcesses:
    """``count`` spawned processes running ``target(*process_args(barrier, results, i))`` (the
    parent runs threads: no fork), released together at one barrier whose last party is the
    parent; one result per process comes back on a queue. The simulated ranks
    (``bench._ranks``) and the intake's senders (``bench._intake_senders``) both run on it."""

    def __init__(
        self, name: str, count: int, target: Callable[..., None],
        process_args: Callable[[Any, Any, int], tuple[Any, ...]],
        *, barrier_timeout_s: float, join_s: float,
    ) -> None:  # fmt: skip
        ctx = multiprocessing.get_context("spawn")
        self._barrier_timeout_s, self._join_s = barrier_timeout_s, join_s
        self._barrier = ctx.Barrier(count + 1)
        self._results: Any = ctx.Queue()
        self._processes = [
            ctx.Process(target=target, args=process_args(self._barrier, self._results, i),
                        name=f"{name}-{i}")
            for i in range(count)
        ]  # fmt: skip

    def __enter__(self) -> Self:
        for proc in self._processes:
            proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._barrier.abort()
        for proc in self._processes:
            proc.join(self._join_s)
            if proc.is_alive():
                proc.kill()
                proc.join()

    def release(self) -> float:
        """Wait until every process is at the barrier, then release them; the release time."""
        self._barrier.wait(self._barrier_timeout_s)
        return time.monotonic()

    def _collect(self, timeout_s: float) -> Iterator[Any]:
        """One item per process, fewer if a process died or ``timeout_s`` passed."""
        got, deadline = 0, time.monotonic() + timeout_s
        while got < len(self._processes):
            try:
                item = self._results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                if time.monotonic() > deadline or not any(p.is_alive() for p in self._processes):
                    return
                continue
            got += 1
            yield item

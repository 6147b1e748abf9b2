"""Writer throughput: rows/s into PostgreSQL, the writer beside COPY and a naive UPSERT.

Method and figures: BENCHMARKS.md §2. The real handler at batches of 10, 100 and 1,000, each
beside COPY of as many rows per transaction, COPY of all rows at once, and one autocommitted
UPSERT per message, in a throwaway database. ``--rtt-ms`` relays the writers' traffic through a
loopback relay delaying each direction by half of it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from psycopg import sql as pgsql

from bench import _plot
from bench._harness import cli, load, machine, migrated_database, parse, plotted, verdict
from bench._reports import events, invoke, report, writer_environment
from ckpt_contract import CheckpointReport, StoredObject, decode
from ckpt_pipeline.local.tcp_relay import TcpRelay
from lambda_writer import Connection, connect_url

WORLD_SIZE = 100
TARGET_VS_NAIVE = 10.0
TARGET_VS_SAME_GRANULARITY = 0.7
BATCH = 10  # FIFO event sources deliver at most 10 records per batch

REPO_10 = "writer, batch 10"
COPY_10 = "COPY, 10 rows per transaction"
REPO_100 = "writer, batch 100"
COPY_100 = "COPY, 100 rows per transaction"
REPO_1000 = "writer, batch 1000"
COPY_1000 = "COPY, 1000 rows per transaction"
COPY_BULK = "COPY, all rows in 1 transaction"
NAIVE = "naive, 1 autocommit UPSERT/msg"

SHARD_COLUMNS = (
    "job_id", "step", "rank", "run_attempt", "epoch", "world_size", "uri", "loss", "metrics",
    "size_bytes", "sha256", "extra", "sqs_message_id", "reported_at",
)  # fmt: skip
NAIVE_UPSERT = f"""
WITH checkpoint AS (
    INSERT INTO training_checkpoints (job_id, step, run_attempt, epoch, world_size,
                                      first_reported_at)
    VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (job_id, step) DO NOTHING
)
INSERT INTO training_checkpoint_shards AS s ({", ".join(SHARD_COLUMNS)})
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s::jsonb, %s, %s)
ON CONFLICT (job_id, step, rank) DO UPDATE SET
    run_attempt = EXCLUDED.run_attempt, uri = EXCLUDED.uri, loss = EXCLUDED.loss,
    metrics = EXCLUDED.metrics, updated_at = now()
WHERE EXCLUDED.run_attempt > s.run_attempt
"""
COPY_SHARDS = pgsql.SQL("COPY training_checkpoint_shards ({}) FROM STDIN").format(
    pgsql.SQL(", ").join(pgsql.Identifier(c) for c in SHARD_COLUMNS)
)
Event = dict[str, Any]


def make_reports(
    rows: int, *, pins: bool = False, launch_id: str | None = None
) -> list[CheckpointReport]:
    """``rows`` reports: consecutive ranks of successive checkpoints of one job; with ``pins``
    each pins its one object (size and ETag), as a DCP rank's report on S3 does; with
    ``launch_id`` each carries it, as a client of this release does (the writer's launch guard,
    migration 0014, then checks every row)."""
    launch = {} if launch_id is None else {"launch_id": launch_id}
    base = datetime(2026, 1, 1, tzinfo=UTC)

    def pinned(uri: str) -> dict[str, Any]:
        if not pins:
            return {}
        etag = '"0123456789abcdef0123456789abcdef"'
        return {"objects": [StoredObject(uri=uri, bytes=123_456_789, etag=etag)]}

    return [
        report(
            "bench-job", step, rank, WORLD_SIZE, epoch=step // 10, uri=uri, loss=1.0 / (i + 1),
            metrics={"acc": 0.5, "lr": 0.001}, bytes=123_456_789, sha256="0" * 64,
            created_at=base + timedelta(seconds=i), **pinned(uri), **launch,
        )
        for i in range(rows)
        for step, rank in [divmod(i, WORLD_SIZE)]
        for uri in [f"s3://bench/bench-job/step-{step}/rank-{rank}.pt"]
    ]  # fmt: skip


def _rows(event: Event) -> list[tuple[object, ...]]:
    """The shard rows of an event's records: each body decoded by the contract, as the writer
    decodes it, so that COPY and the naive writer start from the same input as the writer."""
    out: list[tuple[object, ...]] = []
    for record in event["Records"]:
        r = decode(record["body"])
        out.append((
            r.job_id, r.step, r.rank, r.run_attempt, r.epoch, r.world_size, r.uri, r.loss,
            json.dumps(r.metrics), r.bytes, r.sha256, json.dumps(r.extra, default=str),
            record["messageId"], r.created_at,
        ))  # fmt: skip
    return out


def run_naive(conn: Connection, batches: Sequence[Event]) -> None:
    """One autocommitted UPSERT per message (no completeness count: flatters the naive way)."""
    for event in batches:
        for row in _rows(event):
            checkpoint = (row[0], row[1], row[3], row[4], row[5], row[13])
            conn.execute(NAIVE_UPSERT, (*checkpoint, *row))


def prepare_copy(conn: Connection, reports: Sequence[CheckpointReport]) -> None:
    """COPY needs the checkpoint rows (foreign key) to exist: inserted before timing."""
    first = {(r.job_id, r.step): r for r in reversed(reports)}
    with conn.transaction():
        for r in first.values():
            conn.execute(
                "INSERT INTO training_checkpoints"
                " (job_id, step, run_attempt, epoch, world_size, first_reported_at)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                (r.job_id, r.step, r.run_attempt, r.epoch, r.world_size, r.created_at),
            )


def run_copy(conn: Connection, batches: Sequence[Event]) -> None:
    """One autocommitted COPY (one transaction, one commit) per event's rows."""
    for event in batches:
        with conn.cursor() as cur, cur.copy(COPY_SHARDS) as copy:
            for row in _rows(event):
                copy.write_row(row)


def timed(
    conn: Connection, reports: Sequence[CheckpointReport], run: Callable[[], None], *,
    copy: bool = False,
) -> float:  # fmt: skip
    """Rows per second of ``run`` on empty tables (checkpoint rows inserted first for COPY)."""
    conn.execute("TRUNCATE training_checkpoint_shards, training_checkpoints CASCADE")
    if copy:
        prepare_copy(conn, reports)
    started = time.perf_counter()
    run()
    elapsed = time.perf_counter() - started
    (count,) = conn.execute("SELECT count(*) FROM training_checkpoint_shards").fetchone() or (0,)
    if count != len(reports):
        raise RuntimeError(f"expected {len(reports)} shard rows, found {count}")
    return len(reports) / elapsed


def measure(
    url: str, reports: Sequence[CheckpointReport], *, rtt_ms: float = 0.0
) -> dict[str, float]:
    """Rows per second of each method, one round (``rtt_ms`` through a delaying relay). Every
    method gets the same Lambda events, built before the clock; the writer is one execution
    environment of the real handler (its own connection), the others a connection of their own."""
    by_10, by_100 = events(reports, BATCH), events(reports, 100)
    by_1000, whole = events(reports, 1000), events(reports, 1 << 30)
    with contextlib.ExitStack() as stack:
        if rtt_ms > 0:
            relay = stack.enter_context(TcpRelay.to_postgres(url, one_way_delay_s=rtt_ms / 2000))
            url = relay.postgres_url(url)
        conn = stack.enter_context(connect_url(url, autocommit=True))
        writer = writer_environment(url)
        stack.callback(writer.close)

        def write(batches: Sequence[Event]) -> Callable[[], None]:
            def run() -> None:
                for event in batches:
                    invoke(writer, event)

            return run

        timed(conn, reports[:200], write(events(reports[:200], BATCH)))  # warm-up
        return {
            REPO_10: timed(conn, reports, write(by_10)),
            COPY_10: timed(conn, reports, lambda: run_copy(conn, by_10), copy=True),
            REPO_100: timed(conn, reports, write(by_100)),
            COPY_100: timed(conn, reports, lambda: run_copy(conn, by_100), copy=True),
            REPO_1000: timed(conn, reports, write(by_1000)),
            COPY_1000: timed(conn, reports, lambda: run_copy(conn, by_1000), copy=True),
            COPY_BULK: timed(conn, reports, lambda: run_copy(conn, whole), copy=True),
            NAIVE: timed(conn, reports, lambda: run_naive(conn, by_10)),
        }


def commit_floor_ms(url: str, commits: int = 200) -> float:
    """Mean time of a one-row autocommitted INSERT: the server's commit (WAL flush) floor."""
    with connect_url(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_commit_probe (x integer)")
        began = time.perf_counter()
        for i in range(commits):
            conn.execute("INSERT INTO bench_commit_probe VALUES (%s)", (i,))
        return 1000 * (time.perf_counter() - began) / commits


@dataclass(frozen=True)
class Throughput:
    """Best rows/s of each method over the rounds, and the batch profile."""

    rates: dict[str, float]
    rows: int
    rounds: int
    rtt_ms: float

    @property
    def vs_naive(self) -> float:
        return self.rates[REPO_10] / self.rates[NAIVE]

    @property
    def vs_copy_10(self) -> float:
        return self.rates[REPO_10] / self.rates[COPY_10]

    @property
    def met(self) -> bool:
        return self.vs_naive >= TARGET_VS_NAIVE and self.vs_copy_10 >= TARGET_VS_SAME_GRANULARITY


def run(
    admin_url: str,
    *,
    rows: int,
    rounds: int,
    rtt_ms: float,
    pins: bool = False,
    launch_id: str | None = None,
) -> Throughput:
    """Every method ``rounds`` times, alternating (the other work on a shared machine comes and
    goes by the minute and only ever slows a method down, so each one's best round is kept)."""
    reports = make_reports(rows, pins=pins, launch_id=launch_id)
    best: dict[str, float] = {}
    with migrated_database(admin_url) as url:
        for _ in range(rounds):
            for method, rate in measure(url, reports, rtt_ms=rtt_ms).items():
                best[method] = max(rate, best.get(method, 0.0))
    return Throughput(best, rows, rounds, rtt_ms)


def print_report(t: Throughput) -> None:
    naive, copy10, bulk = t.rates[NAIVE], t.rates[COPY_10], t.rates[COPY_BULK]
    print(
        f"writer throughput, {t.rows} rows per method, best of {t.rounds} rounds, one connection,"
        f" simulated RTT {t.rtt_ms:g} ms; {machine()}"
    )
    print(f"{'method':34} {'rows/s':>10} {'x naive':>8} {'% COPY-10':>10} {'% bulk':>7}")
    for method, rate in t.rates.items():
        print(
            f"{method:34} {rate:10.0f} {rate / naive:8.1f} {100 * rate / copy10:9.0f}%"
            f" {100 * rate / bulk:6.0f}%"
        )
    print(
        f"bound at this granularity: COPY of 10 rows per transaction is {copy10 / naive:.1f}x"
        " naive (no conflict handling, no count)"
    )
    print(
        f"batch 10: {t.vs_naive:.1f}x naive (target {TARGET_VS_NAIVE:.0f}x),"
        f" {100 * t.vs_copy_10:.0f}% of COPY at the same granularity (target"
        f" {100 * TARGET_VS_SAME_GRANULARITY:.0f}%): {verdict(t.met)}"
    )
    for writer, copy in ((REPO_100, COPY_100), (REPO_1000, COPY_1000)):
        print(
            f"{writer}: {100 * t.rates[writer] / t.rates[copy]:.0f}% of COPY at the same"
            f" granularity, {1000 / t.rates[writer]:.3f} ms per row (decode, plan, one statement)"
        )
    print(f"load average now {load()}")


def plot_writer(t: Throughput, path: Path) -> Path:
    """Rows/s of each write method, the writer beside COPY at the same granularity."""

    fig, (ax,) = _plot.figure(
        f"Writer throughput, one connection ({t.rows} rows, best of {t.rounds})"
    )
    names = list(t.rates)
    colours = [
        _plot.PIPELINE if n.startswith("writer") else _plot.DIRECT if n == NAIVE else _plot.FLOOR
        for n in names
    ]
    bars = ax.barh(names, [t.rates[n] for n in names], color=colours)
    naive, copy10 = t.rates[NAIVE], t.rates[COPY_10]
    labels = [f"{r:,.0f}  ({r / naive:.1f}x naive, {100 * r / copy10:.0f} % of COPY-10)"
              for r in t.rates.values()]  # fmt: skip
    ax.bar_label(bars, labels, padding=3, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(right=max(t.rates.values()) * 12)  # room for the labels
    ax.set_xlabel("rows/s (log scale)")
    ax.tick_params(axis="y", labelsize=8)
    return _plot.save(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison and print the table; exit 1 if a target is missed."""
    p = cli(__doc__, plot="writer_throughput.png", admin_url=True)
    p.add_argument("--rows", type=int, default=3000, help="rows per method (default 3000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, best kept (default 3)")
    p.add_argument("--rtt-ms", type=float, default=0.0, help="simulated round trip")
    p.add_argument(
        "--pins", action="store_true",
        help="each report pins its object (size, ETag) as a DCP rank's does; COPY and the naive"
        " writer do not store pins",
    )  # fmt: skip
    p.add_argument(
        "--launch-id", default=None, metavar="ID",
        help="every report carries this launch id, as this release's client sends one (the "
        "writer's launch guard checks each row); default: none, the previous clients' reports",
    )  # fmt: skip
    args = parse(p, argv)
    if args.rows < 200 or args.rounds < 1 or not args.rtt_ms >= 0:
        p.error("--rows must be at least 200, --rounds at least 1, --rtt-ms 0 or above")
    result = run(
        args.admin_url,
        rows=args.rows,
        rounds=args.rounds,
        rtt_ms=args.rtt_ms,
        pins=args.pins,
        launch_id=args.launch_id,
    )
    print_report(result)
    if args.plot is not None:
        plotted(plot_writer(result, args.plot / "writer_throughput.png"))
    return 0 if result.met else 1

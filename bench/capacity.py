"""Capacity: does the writer's cost per batch stay flat in the ranks of a checkpoint, and what
does a second writer add? Then the drain model for a checkpoint of that many ranks.

Run: ``python -m bench.capacity [--ranks 1000 4000 16000] [--schemas old delta slots]
[--repeat N] [--prebuilt] [--rtt-ms MS] [--batch-ms MS] [--admin-url URL]``. ``--rtt-ms``: every
writer waits a simulated network round trip per batch (see ``bench._drains.measure_drain``).

Measured in this run, for every N of ``--ranks`` and every schema of ``--schemas`` side by side:
one checkpoint of N shards (one job, one step, world_size = N) written through the real
repository (``plan_batch`` + ``write_batch``) in 10-record batches on the local PostgreSQL, by 1
and by 2 writers (``--repeat`` times each, alternating with the other schemas; the fastest drain
kept). Each writer is its own process with its own connection, as two Lambda
execution environments are (threads would share one GIL), and takes every second batch; both
write the same checkpoint at once. Schema "old" is migrations 0001-0003 (each batch recounts all
shards of its checkpoint under the checkpoint's row lock); "delta" is 0001-0005 (0004: the
count moves by the batch's exact delta, the row lock is held only at the end of the statement;
0005: the same statement fed two json parameters instead of 20 arrays), written through 0005's
statement; "slots" is every migration (0006 and any later one: the delta goes to the writing
backend's own count row, the checkpoint row is written only when raised or once complete, after
the commit), written through the repository. "delta-nosync" is "delta" with synchronous_commit
off on the bench's connections: a diagnostic of how much of the serialised tail is the commit's
WAL flush.

The second writer's gain on a 2-core machine measures the machine as much as the design, so two
controls run in the same repeats (``bench._drains``): "disjoint", the same two writers with the
same batches, each into its own database of the same schema (nothing of the design can serialise
them: the machine's own two-writer gain at that moment), printed as the ratio "one checkpoint /
disjoint" next to the raw gain; and, with ``--prebuilt``, every drain again with each batch's
parameters built before the clock (the same statement and rows; only the database's work is
timed), since here the writer processes' Python competes with the backends for the cores, while
on AWS each writer runs on its own Lambda's CPU. Every drain prints the CPU of the writer
processes and of their backends per batch, and the machine's busy, other and steal time.
``--batch-ms`` replaces the measured per-batch cost in the model by a production figure (e.g.
measured through RDS Proxy: add the round trip and the Lambda poller's receive/delete).

Then the AWS model (``--model-ranks``, default 10,000 and 100,000): one checkpoint barrier, every
rank sends its one report at once; drain time = the slowest of the send side, the receive/delete
side and the writers, in normal and in high-throughput FIFO mode, and which limit is hit first.
The writer's cost per batch in AWS = the database cost measured above (or ``--batch-ms``) + one
round trip through RDS Proxy (``--proxy-rtt-ms``) + the event source's per-invocation overhead
(``--invoke-ms``); a second writer adds what the 2-writer drain measured above added.

AWS figures used (the pages are cited in ``bench._aws_model``, where the numbers are defined):
* SQS FIFO, normal mode: 300 transactions/s per API action (SendMessage[Batch], ReceiveMessage,
  DeleteMessage[Batch]); a batch call carries up to 10 messages;
* SQS FIFO, high-throughput mode: 70,000 transactions/s per API action in us-east-1, us-west-2
  and eu-west-1 (less elsewhere, down to 2,400: ``--ht-tps``);
* Lambda's SQS event source: FIFO batches of at most 10 records, no batching window;
  concurrency <= min(active message groups, MaximumConcurrency);
* not published by AWS, so assumptions named as such: the event source's per-invocation
  overhead (receive, invoke, delete) and the round trip through RDS Proxy.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from bench import writer_throughput
from bench._aws_model import (
    BATCH,
    DEFAULT_INVOKE_MS,
    DEFAULT_PROXY_RTT_MS,
    HT_FIFO_TPS_PER_ACTION,
    AwsModel,
    fmt_seconds,
    print_model,
)
from bench._drains import (
    STATEMENTS,
    Client,
    Drain,
    Layout,
    check_prebuilt_matches_repository,
    cpu_pair_gain,
    measure_drain,
)
from bench._writer_profile import (
    Write,
    apply_schema,
    commit_floor_ms,
    write_arrays,
    write_json_function,
)
from bench.writer_throughput import ADMIN_URL
from ckpt_contract import CheckpointReport, encode
from ckpt_pipeline.local.embedded_pg import throwaway_database
from lambda_writer.connection import connect_url
from lambda_writer.migrate import load_migrations
from lambda_writer.records import SqsMessage, ValidReport, classify
from lambda_writer.repository import write_batch

# Per schema: the highest migration applied (None = all of them), and whether the bench's
# connections turn synchronous_commit off ("delta-nosync": a diagnostic of how much of the
# serialised tail is the commit's WAL flush; never a configuration of the writer).
SCHEMAS: dict[str, tuple[int | None, bool]] = {
    "old": (3, False),
    "delta": (5, False),
    "delta-nosync": (5, True),
    "slots": (None, False),
}
# The schema of this release: the goals are judged on it, the AWS model uses its figures.
CURRENT = "slots"
# The statement each schema's writer sent: 0003 took 20 arrays, 0005 two json texts; the
# repository (this release) calls 0006's procedure.
WRITERS: dict[int | None, Write] = {3: write_arrays, 5: write_json_function, None: write_batch}
WARMUP_BATCHES = 20  # per connection, on another job: plpgsql's cached plans, catalog caches
TARGET_FLAT = 1.2  # mean per batch at the largest N within 20 % of the smallest N's
TARGET_SECOND_WRITER = 1.8
LAYOUTS: tuple[Layout, ...] = ("one", "shared", "disjoint")


def checkpoint_reports(ranks: int, *, job_id: str = "capacity") -> list[ValidReport]:
    """One checkpoint (job, step 1) with one report per rank, as the writer decodes them."""
    now = datetime.now(UTC)
    out = []
    for rank in range(ranks):
        report = CheckpointReport.create(
            job_id=job_id, run_attempt=0, step=1, epoch=0, rank=rank, world_size=ranks,
            uri=f"s3://bench/capacity/step-1/rank-{rank}.pt", loss=0.5, created_at=now,
        )  # fmt: skip
        message = SqsMessage(
            message_id=str(uuid.uuid4()), body=encode(report), group_id=report.group_id,
            receive_count=1, first_receive_ms=None, sequence_number=None,
            source_arn="arn:aws:sqs:us-east-1:000000000000:capacity.fifo",
        )  # fmt: skip
        valid = classify(message)
        assert isinstance(valid, ValidReport)
        out.append(valid)
    return out


@dataclass(frozen=True)
class Case:
    """The drains of one (schema, N, client), the fastest of the repeats of each layout, and the
    shared/disjoint ratio of each repeat (whose two drains ran back to back)."""

    one: Drain
    shared: Drain
    disjoint: Drain
    paired: list[float]  # per repeat: disjoint drain seconds / shared drain seconds

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


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


HEADER = (
    f"{'N':>6} {'schema':12} {'client':8} {'w':>1} {'layout':8} {'drain':>8} {'p50':>6}"
    f" {'p99':>6} {'mean':>6} {'gain':>6} {'vs dis':>6} {'cpu/batch: client':>17}"
    f" {'backend':>7} {'busy':>5} {'others':>6} {'steal':>5} {'commit':>6}  load"
)


def _row(n: int, schema: str, case: Case, d: Drain, floor: float) -> str:
    gain = {"one": "", "shared": f"{case.gain:5.2f}x", "disjoint": f"{case.ceiling:5.2f}x"}
    rel = f"{case.relative:6.2f}" if d.layout == "shared" else ""
    return (
        f"{n:6d} {schema:12} {d.client:8} {d.writers:1d} {d.layout:8} {fmt_seconds(d.seconds):>8}"
        f" {d.pct(0.5):6.2f} {d.pct(0.99):6.2f} {d.mean_ms:6.2f} {gain[d.layout]:>6} {rel:>6}"
        f" {d.per_batch_ms(d.client_cpu_s):14.2f} ms {d.per_batch_ms(d.backend_cpu_s):7.2f}"
        f" {100 * d.share(d.machine_busy_s):4.0f}% {100 * d.share(d.others_s):5.0f}%"
        f" {100 * d.share(d.machine_steal_s):4.0f}% {floor:6.2f}  {_load()}"
    )


def measure_all(
    admin_url: str,
    ranks: Sequence[int],
    schemas: Sequence[str],
    repeat: int,
    clients: Sequence[Client],
    rtt_ms: float = 0.0,
) -> dict[tuple[str, int, Client], Case]:
    """Drains of every layout for every (schema, N, client), printing each case as measured.

    Every repeat runs every schema, client and layout in turn (shared and disjoint back to back,
    their order swapped each repeat), so that the other work on the machine, which comes and
    goes, falls on all of them alike; the fastest drain of each is kept (other work only ever
    slows a drain down) and each repeat's shared/disjoint pair gives one paired ratio.
    """
    if "prebuilt" in clients:
        check_prebuilt_matches_repository()
    print(HEADER, flush=True)
    out: dict[tuple[str, int, Client], Case] = {}
    for n in ranks:
        reports = checkpoint_reports(n)
        batches = [reports[i : i + BATCH] for i in range(0, len(reports), BATCH)]
        warm = [checkpoint_reports(WARMUP_BATCHES * BATCH, job_id=f"warmup-{w}") for w in (0, 1)]
        warmups = (
            [warm[0][i : i + BATCH] for i in range(0, len(warm[0]), BATCH)],
            [warm[1][i : i + BATCH] for i in range(0, len(warm[1]), BATCH)],
        )
        keys = [(s, c) for s in schemas for c in clients]
        runs: dict[tuple[str, Client, Layout], list[Drain]] = {
            (s, c, lay): [] for s, c in keys for lay in LAYOUTS
        }
        floors: dict[str, list[float]] = {s: [] for s in schemas}
        with contextlib.ExitStack() as stack:
            urls: dict[str, tuple[str, str]] = {}
            for schema in schemas:
                pair = tuple(
                    stack.enter_context(throwaway_database(admin_url, prefix="ckpt_capacity_"))
                    for _ in range(2)
                )
                for url in pair:
                    apply_schema(url, SCHEMAS[schema][0])
                urls[schema] = (pair[0], pair[1])
            for r in range(repeat):
                order: tuple[Layout, ...] = LAYOUTS if r % 2 == 0 else ("one", "disjoint", "shared")
                for schema, client in keys:
                    upto, nosync = SCHEMAS[schema]
                    if client == clients[0]:
                        floors[schema].append(commit_floor_ms(urls[schema][0]))
                    for layout in order:
                        drain = measure_drain(
                            urls[schema], batches, warmups, layout, client,
                            write=WRITERS[upto], statement=STATEMENTS[upto],
                            async_commit=nosync, rtt_ms=rtt_ms,
                        )  # fmt: skip
                        runs[(schema, client, layout)].append(drain)
        for schema, client in keys:
            floor = min(floors[schema])
            fastest = {
                lay: min(runs[(schema, client, lay)], key=lambda d: d.seconds) for lay in LAYOUTS
            }
            paired = [
                dis.seconds / sh.seconds
                for sh, dis in zip(
                    runs[(schema, client, "shared")],
                    runs[(schema, client, "disjoint")],
                    strict=True,
                )
            ]
            case = Case(fastest["one"], fastest["shared"], fastest["disjoint"], paired)
            out[(schema, n, client)] = case
            for d in (case.one, case.shared, case.disjoint):
                print(_row(n, schema, case, d, floor), flush=True)
    return out


def verdicts(drains: dict[tuple[str, int, Client], Case], schema: str, client: Client) -> bool:
    """Print the goals for ``schema``: flat per batch, linear drain, second writer >= 1.8x; and
    the second writer against the machine's own two-writer ceiling (disjoint databases)."""
    ns = sorted(n for s, n, c in drains if s == schema and c == client)
    if not ns:
        return True
    cases = [drains[(schema, n, client)] for n in ns]
    flat = cases[-1].one.mean_ms / cases[0].one.mean_ms
    per_k = ", ".join(f"{1000 * c.one.seconds / n:.3f}" for n, c in zip(ns, cases, strict=True))
    gains = [c.gain for c in cases]
    ok_flat = flat <= TARGET_FLAT
    ok_gain = min(gains) >= TARGET_SECOND_WRITER
    label = f"{schema} ({client} client)"
    print(
        f"  {label}: mean per batch at N={ns[-1]} / N={ns[0]} = {flat:.2f}"
        f" (target <= {TARGET_FLAT}): {'met' if ok_flat else 'MISSED'};"
        f" 1-writer drain per 1,000 ranks: {per_k} s (linear when constant);"
        f" second writer {min(gains):.2f}x..{max(gains):.2f}x (target >= {TARGET_SECOND_WRITER}):"
        f" {'met' if ok_gain else 'MISSED'}"
    )
    print(
        f"    {label}, per N = {', '.join(map(str, ns))}: second writer on one checkpoint"
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
        f"    {label}, CPU with 2 writers on one checkpoint, per N: per batch (writer process /"
        f" its backend) {per_batch} ms; share of the {two[0].cores} cores' time during the drain:"
        f" writer processes {_pcts(two, lambda d: d.client_cpu_s)}, their backends"
        f" {_pcts(two, lambda d: d.backend_cpu_s)}, everything else"
        f" {_pcts(two, lambda d: d.others_s)} (steal {_pcts(two, lambda d: d.machine_steal_s)})"
    )
    return ok_flat and ok_gain


def _spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _pcts(drains: Sequence[Drain], cpu_s: Callable[[Drain], float]) -> str:
    return ", ".join(f"{100 * d.share(cpu_s(d)):.0f}%" for d in drains)


def throughput_batch_ms(admin_url: str, rows: int = 3000) -> float:
    """Mean ms per batch of 10 of bench.writer_throughput's repository path (cross-check)."""
    reports = writer_throughput.make_reports(rows)
    run = writer_throughput.run_repository
    with throwaway_database(admin_url, prefix="ckpt_capacity_") as url:
        apply_schema(url, None)
        with connect_url(url, autocommit=True) as conn:
            run(conn, reports[:200], BATCH)  # warm-up
            rate = writer_throughput.timed(conn, reports, lambda: run(conn, reports, BATCH))
    return 1000 * BATCH / rate


def _print_cpu_pair(when: str) -> None:
    gains = cpu_pair_gain()
    print(
        f"  cores {when} the drains: 2 CPU-bound processes (a pure-Python loop, nothing shared)"
        f" finish {', '.join(f'{g:.2f}x' for g in gains)} faster than 1; load {_load()}",
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Measure per-batch cost and drains, then print the drain model and its bottleneck."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1000, 4000, 16000])
    parser.add_argument("--schemas", nargs="+", choices=list(SCHEMAS), default=list(SCHEMAS))
    parser.add_argument("--repeat", type=int, default=2, help="drains per case; fastest kept")
    parser.add_argument(
        "--prebuilt", action="store_true",
        help="also drain with every batch's parameters built before the clock (the same statement"
        " and rows): the database's scaling apart from the writer processes' CPU",
    )  # fmt: skip
    parser.add_argument(
        "--batch-ms", type=float, default=None,
        help="database cost per batch to model (default: the 1-writer drain measured here)",
    )  # fmt: skip
    parser.add_argument("--model-ranks", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--concurrency", type=int, default=2, help="writer concurrency on AWS")
    parser.add_argument(
        "--invoke-ms", type=float, default=DEFAULT_INVOKE_MS,
        help=f"event source overhead per invocation (default {DEFAULT_INVOKE_MS}, an assumption)",
    )  # fmt: skip
    parser.add_argument(
        "--proxy-rtt-ms", type=float, default=DEFAULT_PROXY_RTT_MS,
        help=f"round trip Lambda -> RDS Proxy -> DB (default {DEFAULT_PROXY_RTT_MS}, assumption)",
    )  # fmt: skip
    parser.add_argument(
        "--ht-tps", type=int, default=HT_FIFO_TPS_PER_ACTION,
        help="high-throughput FIFO transactions/s per API action of the Region"
        f" (default {HT_FIFO_TPS_PER_ACTION}: us-east-1, us-west-2, eu-west-1)",
    )  # fmt: skip
    parser.add_argument(
        "--rtt-ms", type=float, default=0.0,
        help="simulated network round trip per batch, slept by each writer after its statement"
        " (default 0); the AWS model is then skipped (its batch cost would include it)",
    )  # fmt: skip
    parser.add_argument(
        "--admin-url", default=os.environ.get("CKPT_BENCH_ADMIN_URL", ADMIN_URL),
        help="server to create the throwaway databases on",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not args.rtt_ms >= 0:
        parser.error(f"--rtt-ms must be 0 or above, got {args.rtt_ms:g}")
    print(
        f"capacity: one checkpoint of N ranks in FIFO batches of {BATCH}, real repository, 1 and"
        f" 2 writer processes; {os.cpu_count()} CPUs, load average at start {_load()} (other work"
        " on this machine shares the cores)"
        + (f"; simulated round trip {args.rtt_ms:g} ms per batch" if args.rtt_ms else ""),
        flush=True,
    )
    newest = load_migrations()[-1].name
    print(
        f"  schemas: old = migrations up to 0003, delta = up to 0005, slots = all of them (the"
        f" newest: {newest}), through the repository's write_batch",
        flush=True,
    )
    print(
        "  layout: one = 1 writer; shared = 2 writers, every second batch each, one checkpoint in"
        " one database (the design); disjoint = 2 writers, the same batches, each into its own"
        " database (same schema and statement: they share only the server's CPU, WAL and disk)."
        " gain = 1-writer drain / this drain; vs dis = disjoint drain / shared drain.",
        flush=True,
    )
    print(
        "  client: live = plan_batch + the schema's write function in the clock (this release:"
        " lambda_writer.repository.write_batch); prebuilt = the same statement and parameters,"
        " built before the clock (isolates the database from the writer processes' CPU; on AWS"
        " each writer has its own). cpu/batch: CPU ms per batch of the writer processes and of"
        " their backends; busy/others/steal: the machine's CPU during the drain, in % of all"
        " cores (others = every process but the writers and their backends).",
        flush=True,
    )
    print(
        "  commit = mean autocommitted one-row INSERT on the same database: the WAL flush every"
        " batch pays (old, delta: inside the checkpoint row lock; slots: under no shared lock)",
        flush=True,
    )
    clients: list[Client] = ["live", "prebuilt"] if args.prebuilt else ["live"]
    _print_cpu_pair("before")
    drains = measure_all(
        args.admin_url, args.ranks, args.schemas, args.repeat, clients, rtt_ms=args.rtt_ms
    )
    _print_cpu_pair("after")
    # Every schema's verdicts are printed side by side; the exit status is this release's, on
    # the writer's full path (the goal as stated).
    oks = {
        (schema, client): verdicts(drains, schema, client)
        for schema in args.schemas
        for client in clients
    }
    schema = CURRENT if CURRENT in args.schemas else args.schemas[0]
    ok = oks[(schema, "live")]
    if args.rtt_ms:
        print("  AWS model: skipped under --rtt-ms (run without it for the model)", flush=True)
        return 0 if ok else 1
    case = drains[(schema, max(args.ranks), "live")]
    one, two = case.one, case.shared
    local_batch_ms = one.seconds * 1000 / math.ceil(max(args.ranks) / BATCH)
    print(
        f"  local check, schema {schema}: 1-writer drain {local_batch_ms:.2f} ms per batch at"
        f" N={max(args.ranks)} vs {throughput_batch_ms(args.admin_url):.2f} ms per batch of the"
        " writer_throughput path (repository, batch 10, 3000 rows, same server, this run)",
        flush=True,
    )
    batch_ms = args.batch_ms if args.batch_ms is not None else local_batch_ms
    model = AwsModel(
        db_batch_ms=batch_ms,
        second_writer_gain=one.seconds / two.seconds,
        invoke_ms=args.invoke_ms,
        proxy_rtt_ms=args.proxy_rtt_ms,
        concurrency=args.concurrency,
        ht_tps=args.ht_tps,
    )
    source = "--batch-ms" if args.batch_ms is not None else f"measured above, N={max(args.ranks)}"
    print_model(model, args.model_ranks, source)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Where a listing's time goes at 100,000 shards: per page, the server's CPU and the client's.

Method and figures: BENCHMARKS.md §10. The checkpoint's key ranges listed one page at a time
with each range's prefix and with the checkpoint's, then concurrently as ``verify_objects`` does
at each ``--workers``; the server's CPU from ``/proc`` (``--server-pid`` for a running emulator).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from bench._cpu import tree_cpu_s as server_cpu
from bench._harness import caller_s3, cli, load, machine, parse, table
from bench._s3_filled import Fill, filled_s3_process
from bench.read_paths import expected_of
from trainer_client.storage.verify import verify_objects
from trainer_client.storage.verify_rules import KeyRange, key_ranges


@dataclass
class Pages:
    """One way of listing the checkpoint: per-page figures (seconds)."""

    name: str
    wall: list[float]
    client: list[float]
    server: list[float]
    keys: int

    def row(self) -> str:
        def ms(xs: list[float]) -> str:
            return f"{1000 * statistics.median(xs):.1f}"

        return (
            f"| {self.name} | {len(self.wall)} | {self.keys:,} | {sum(self.wall):.2f}"
            f" | {ms(self.wall)} | {sum(self.server):.2f} | {ms(self.server)}"
            f" | {sum(self.client):.2f} | {ms(self.client)} | {load()} |"
        )


def serial_pages(
    client: Any,
    bucket: str,
    ranges: Sequence[KeyRange],
    prefix: Callable[[KeyRange], str],
    pid: int,
) -> Pages:
    """One ``ListObjectsV2`` per range, one at a time; each page's wall, client and server CPU."""
    pages = Pages("", [], [], [], 0)
    for r in ranges:
        request: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix(r), "MaxKeys": 1000}
        if r.start_after is not None:
            request["StartAfter"] = r.start_after
        s0, c0, t0 = server_cpu(pid), time.process_time(), time.perf_counter()
        answer = client.list_objects_v2(**request)
        pages.wall.append(time.perf_counter() - t0)
        pages.client.append(time.process_time() - c0)
        pages.server.append(server_cpu(pid) - s0)
        pages.keys += sum(r.holds(item["Key"]) for item in answer.get("Contents", []))
    return pages


@contextlib.contextmanager
def _server(args: argparse.Namespace, fill: Fill) -> Iterator[tuple[str, int]]:
    if args.s3_endpoint:
        if not args.server_pid:
            raise SystemExit("--s3-endpoint needs --server-pid (the server's process)")
        yield args.s3_endpoint, args.server_pid
        return
    with filled_s3_process([fill]) as (endpoint, pid):
        yield endpoint, pid


def main(argv: Sequence[str] | None = None) -> int:
    p = cli(__doc__)
    p.add_argument("--shards", type=int, default=100_000)
    p.add_argument("--workers", type=int, nargs="+", default=[64], help="of each concurrent pass")
    p.add_argument("--no-serial", action="store_true", help="the concurrent passes only")
    p.add_argument("--s3-endpoint", help="a running, filled S3 emulator (LocalStack's)")
    p.add_argument("--server-pid", type=int, help="its process (CPU read from /proc)")
    p.add_argument("--s3-name", default="moto")
    p.add_argument("--text-timestamps", action="store_true", help="the helpers' client's parser")
    args = parse(p, argv)
    fill = Fill(f"rp-{args.shards}", f"job/step-{args.shards}/", args.shards)
    ranges = key_ranges(fill.object_keys())
    print(f"list_pages: {machine()}", flush=True)
    with _server(args, fill) as (endpoint, pid):
        client = caller_s3(endpoint, max(args.workers), text_timestamps=args.text_timestamps)
        client.list_objects_v2(Bucket=fill.bucket, MaxKeys=1)  # the connection, the first parse
        print(f"S3 ({args.s3_name}, pid {pid}): {args.shards:,} shards, {len(ranges)} ranges;"
              f" timestamps {'as text' if args.text_timestamps else 'parsed'}")  # fmt: skip
        table("| pages | n | keys | wall s | wall ms/page | server CPU s | server ms/page"
              " | client CPU s | client ms/page | load |")  # fmt: skip
        serial: list[tuple[str, Callable[[KeyRange], str]]] = [
            ("serial, each range's prefix", lambda r: r.prefix),
            ("serial, the checkpoint's prefix", lambda _r: fill.prefix),
        ]
        for name, prefix in [] if args.no_serial else serial:
            pages = serial_pages(client, fill.bucket, ranges, prefix, pid)
            pages.name = name
            print(pages.row(), flush=True)
        expected = expected_of(fill)
        for workers in args.workers:
            s0, c0, t0 = server_cpu(pid), time.process_time(), time.perf_counter()
            result = verify_objects(
                expected, s3_client=client, max_workers=workers, list_workers=workers
            )
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            server = server_cpu(pid) - s0
            if not result.intact:
                raise SystemExit(result.summary())
            print(f"| verify_objects by listing, {workers} workers | {len(ranges)}"
                  f" | {result.checked:,} | {wall:.2f} | | {server:.2f} | | {cpu:.2f} | |"
                  f" {load()} |", flush=True)  # fmt: skip
    return 0

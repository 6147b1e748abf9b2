"""``ckpt-pipeline replay-dlq``: progress, the per-message listing and the truthful last line.

The last line always says what moved, what failed and what is left in the DLQ (SQS's approximate
counts after the run released what it held), and the exit code follows it: 130 after Ctrl-C,
1 when anything failed, was refused (a ``foreign sender`` message) or was left without being
examined, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from ckpt_pipeline.exit_codes import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK
from ckpt_pipeline.ops.replay import Discard, ReplayItem, ReplaySummary, replay_dlq
from ckpt_pipeline.ops.replay_plan import ReplayFilter, compile_reason
from ckpt_pipeline.ops.replay_redrive import MoveTaskResult, move_with_sqs_task
from ckpt_pipeline.ops.sqs import QueueDepth, queue_depth

_ID_CHARS = 8


@contextmanager
def _first_sigint_stops() -> Iterator[threading.Event]:
    """The first Ctrl-C asks the run to stop after its current batch; a second one stops now."""
    stop = threading.Event()

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        print("stopping after this batch (Ctrl-C again to stop now)", file=sys.stderr)

    if threading.current_thread() is not threading.main_thread():
        yield stop  # signals reach the main thread only (tests call main() from threads)
        return
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def run_replay(
    sqs: Any,
    args: argparse.Namespace,
    *,
    dlq_url: str,
    queue_url: str | None,
    discard: Discard | None = None,
) -> int:
    """Run the replay; print the listing and the last line; returns the exit code."""
    console = Console(stderr=True)
    out = Console()
    # --json lists each message's outcome: one by one, never SQS's move task (counts only).
    everything = not (args.dry_run or args.job or args.reason or args.limit or args.json or discard)
    with _first_sigint_stops() as stop:
        if everything and queue_url is not None:
            result = move_with_sqs_task(
                sqs, dlq_url=dlq_url, queue_url=queue_url, should_stop=stop.is_set
            )
            if isinstance(result, MoveTaskResult):
                return _report_move_task(out, result)
            if not args.quiet:
                console.print(
                    f"SQS move task not used: {result}; moving one by one", soft_wrap=True
                )
        summary = _custom(
            sqs, args, console, dlq_url=dlq_url, queue_url=queue_url, stop=stop, discard=discard
        )
    for item in summary.items:
        if item.outcome == "refused":
            # One line per refusal, whatever the listing's width (the reason names both ids).
            print(
                f"ckpt-pipeline replay-dlq: {item.message.message_id}: {item.message.reason}"
                f" — {item.detail}",
                file=sys.stderr,
            )
    if args.json:
        print(listing_json(summary, dry_run=args.dry_run))
        return replay_exit_code(summary)
    if summary.items:
        for line in listing_lines(summary, dry_run=args.dry_run, width=out.width):
            out.print(line, markup=False, highlight=False, soft_wrap=True)
    out.print(last_line(summary, dry_run=args.dry_run), soft_wrap=True)
    return replay_exit_code(summary)


def _custom(
    sqs: Any,
    args: argparse.Namespace,
    console: Console,
    *,
    dlq_url: str,
    queue_url: str | None,
    stop: threading.Event,
    discard: Discard | None,
) -> ReplaySummary:
    replay_filter = ReplayFilter(
        job=args.job,
        reason=compile_reason(args.reason) if args.reason else None,
        after_transfer=args.after_transfer,
    )
    total = queue_depth(sqs, dlq_url).visible
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console,
        transient=True,
        disable=args.quiet,
    ) as progress:
        doing = "listing" if args.dry_run else "discarding" if discard else "replaying"
        task = progress.add_task(doing, total=total or None)

        def on_item(item: ReplayItem) -> None:
            progress.advance(task)

        return replay_dlq(
            sqs,
            dlq_url=dlq_url,
            queue_url=queue_url,
            replay_filter=replay_filter,
            limit=args.limit,
            dry_run=args.dry_run,
            visibility_timeout_s=args.visibility_timeout,
            on_item=on_item,
            should_stop=stop.is_set,
            discard=discard,
        )


def _left(depth: QueueDepth | None) -> str:
    if depth is None:
        return "left in the DLQ: unknown"
    return f"{depth.total} left in the DLQ"


def last_line(summary: ReplaySummary, *, dry_run: bool) -> str:
    """Moved (or would move), failed, skipped, and what is left; why some were not reached."""
    if dry_run:
        head = f"dry run: {summary.would_move} would move, {summary.skipped} skipped"
    elif summary.discarded:
        head = f"discarded {summary.discarded}, failed {summary.failed}, skipped {summary.skipped}"
    else:
        head = f"moved {summary.moved}, failed {summary.failed}, skipped {summary.skipped}"
    if summary.refused:
        head += f", refused {summary.refused}"
    line = f"{head}; {_left(summary.left)}"
    unreached = summary.not_reached
    if summary.interrupted:
        line += f", {unreached} not reached: interrupted"
    elif summary.limit_reached:
        line += f", {unreached} not reached: --limit reached"
    elif unreached:
        in_flight = summary.left.in_flight if summary.left else 0
        # In flight elsewhere: another reader, or a run that was killed before it released them;
        # their group is locked until they are visible again (after their visibility timeout).
        why = f"{in_flight} in flight elsewhere, retry later" if in_flight else "not seen"
        line += f", {unreached} not reached: {why}"
    return line


def replay_exit_code(summary: ReplaySummary) -> int:
    """130 if interrupted; 1 if any failed, was refused or was left unexamined (not by --limit);
    else 0."""
    if summary.interrupted:
        return EXIT_INTERRUPTED
    if summary.failed or summary.refused or (summary.not_reached and not summary.limit_reached):
        return EXIT_INCOMPLETE
    return EXIT_OK


def _report_move_task(out: Console, result: MoveTaskResult) -> int:
    line = f"moved {result.moved} (SQS move task, {result.status.lower()}); {_left(result.left)}"
    if result.failure:
        line += f"; task failed: {result.failure}"
    out.print(line, soft_wrap=True)
    if result.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if result.status == "COMPLETED" and result.left.total == 0 else EXIT_INCOMPLETE


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def listing_lines(summary: ReplaySummary, *, dry_run: bool, width: int) -> list[str]:
    """One row per message within ``width`` columns (80 when not a terminal).

    The message id is cut to its first characters, group and job to a few (``--json`` has them
    whole); the last column, the reason (preceded by why for a skip or failure), is never cut:
    it wraps onto lines indented under its column.
    """
    title = "DLQ messages" + (" (dry run)" if dry_run else "")
    fixed = [("message", _ID_CHARS), ("group", 12), ("job", 10), ("outcome", 10)]
    indent = sum(w + 2 for _, w in fixed)
    rest = max(20, width - indent)
    lines = [title, "  ".join(f"{name:<{w}}" for name, w in fixed) + "  " + "reason"]
    for item in summary.items:
        message = item.message
        detail = f"{item.detail} · {message.reason}" if item.detail else message.reason
        cells = [
            message.message_id[:_ID_CHARS],
            message.group_id or "-",
            message.job_id or "-",
            item.outcome,
        ]
        row = "  ".join(f"{_cut(c, w):<{w}}" for c, (_, w) in zip(cells, fixed, strict=True))
        wrapped = textwrap.wrap(detail, rest, break_long_words=True, break_on_hyphens=False)
        lines.append(f"{row}  {wrapped[0] if wrapped else ''}".rstrip())
        lines.extend(" " * indent + part for part in wrapped[1:])
    return lines


def listing_json(summary: ReplaySummary, *, dry_run: bool) -> str:
    """Every message with its whole reason, and the counts and last line, as one document."""
    return json.dumps(
        {
            "dry_run": dry_run,
            "messages": [
                {
                    "message_id": item.message.message_id,
                    "group_id": item.message.group_id,
                    "job_id": item.message.job_id,
                    "receive_count": item.message.receive_count,
                    "outcome": item.outcome,
                    "detail": item.detail,
                    "error_class": item.message.error_class,
                    "reason": item.message.reason,
                }
                for item in summary.items
            ],
            "summary": last_line(summary, dry_run=dry_run),
        },
        indent=2,
    )

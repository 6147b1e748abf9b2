"""``ckpt-pipeline replay-dlq``: progress, the per-message listing and the summary (rich)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from ckpt_pipeline.ops.replay import ReplayItem, ReplaySummary, replay_dlq
from ckpt_pipeline.ops.replay_plan import ReplayFilter, compile_reason
from ckpt_pipeline.ops.sqs import queue_depth

_REASON_WIDTH = 80


def run_replay(sqs: Any, args: argparse.Namespace, *, dlq_url: str, queue_url: str | None) -> int:
    """Run the replay with a progress bar; print what happened; 1 if any message failed."""
    console = Console(stderr=True)
    replay_filter = ReplayFilter(
        job=args.job, reason=compile_reason(args.reason) if args.reason else None
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
        task = progress.add_task("listing" if args.dry_run else "replaying", total=total or None)

        def on_item(item: ReplayItem) -> None:
            progress.advance(task)

        summary = replay_dlq(
            sqs,
            dlq_url=dlq_url,
            queue_url=queue_url,
            replay_filter=replay_filter,
            limit=args.limit,
            dry_run=args.dry_run,
            visibility_timeout_s=args.visibility_timeout,
            on_item=on_item,
        )
    out = Console()
    out.print(_listing(summary, dry_run=args.dry_run))
    if args.dry_run:
        out.print(f"dry run: {summary.would_move} would move, {summary.skipped} skipped")
    else:
        out.print(f"moved {summary.moved}, skipped {summary.skipped}, failed {summary.failed}")
    return 1 if summary.failed else 0


def _listing(summary: ReplaySummary, *, dry_run: bool) -> Table:
    table = Table(title="DLQ messages" + (" (dry run)" if dry_run else ""))
    for column in ("message id", "group", "job", "reason", "outcome", "new dedup id"):
        table.add_column(column, overflow="fold")
    for item in summary.items:
        message = item.message
        reason = message.reason
        if len(reason) > _REASON_WIDTH:
            reason = reason[: _REASON_WIDTH - 1] + "…"
        outcome = item.outcome + (f" ({item.detail})" if item.detail else "")
        table.add_row(
            message.message_id,
            message.group_id or "-",
            message.job_id or "-",
            reason,
            outcome,
            item.new_dedup_id or "-",
        )
    return table

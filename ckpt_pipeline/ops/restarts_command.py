"""``ckpt-pipeline restarts``: a job's restarts (what each resumed from, what it skipped and why,
what it cost) and what preemption cost the job (the effective training time ratio).

Exit status: 0 when shown; 1 when the job has no restart records; 2 when an option is refused.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ckpt_pipeline.cli_args import check_job
from ckpt_pipeline.exit_codes import EXIT_OK
from ckpt_pipeline.settings import Settings

EXIT_NONE = 1


def add_parser(commands: Any) -> None:
    """Register ``restarts`` on the CLI's subcommands."""
    restarts = commands.add_parser(
        "restarts", help="a job's restarts: what each resumed from and why, what they cost"
    )
    restarts.add_argument("--job", required=True, help="the job")
    restarts.add_argument("--json", action="store_true", help="JSON instead of a table")


def gather_restarts(database_url: str, job_id: str) -> dict[str, Any]:
    """The job's restarts and their cost, as one JSON-ready document."""
    from ckpt_pipeline.ops.restarts import cost, job_restarts
    from lambda_writer import connect_url

    with connect_url(database_url, autocommit=True) as conn:
        restarts, span = job_restarts(conn, job_id)
    return {
        "job_id": job_id,
        "restarts": [r.as_json() for r in restarts],
        "cost": cost(restarts, span).as_json(),
    }


def describe_restart(restart: dict[str, Any]) -> str:
    """One restart in a line: when, the launch, what it resumed from and why, what it cost."""
    resumed = restart["resumed_step"]
    head = f"{restart['restarted_at'][:19]}  run_attempt {restart['run_attempt']}: " + (
        "started from scratch" if resumed is None else f"resumed from step {resumed}"
    )
    parts = [head]
    if restart["skipped_total"]:
        named = "; ".join(
            f"step {s['step']} {s['kind']} ({s['reason']})" for s in restart["skipped"]
        )
        parts.append(f"skipped {restart['skipped_total']}: {named}")
    restored = restart["restored_s"]
    parts.append(
        f"decided in {restart['decided_s']:.2f} s"
        + ("" if restored is None else f", training again after {restored:.2f} s")
    )
    if restart["fetched_bytes"]:
        parts.append(
            f"{restart['fetched_bytes'] / 1e6:.1f} MB fetched by {restart['nodes_fetched']} node(s)"
        )
    if restart["steps_lost"] is not None:
        parts.append(f"steps lost {restart['steps_lost']}")
    if restart["in_loop"]:
        parts.append(f"RESTART LOOP: restart {restart['loop_restarts'] + 1} in a row from it")
    if restart["unwritten_reports"] or restart["unsent_reports"]:
        parts.append(
            f"{restart['unsent_reports']} report(s) unsent, {restart['unwritten_reports']} "
            "unwritten at the deadline"
        )
    return "; ".join(parts)


def summary(document: dict[str, Any]) -> str:
    """What preemption cost the job, in a line."""
    c = document["cost"]
    ratio = c["effective_training_time_ratio"]
    return (
        f"{c['restarts']} restart(s); {c['steps_lost']} step(s) redone; "
        f"{c['lost_s']:.0f} s of {c['wall_s']:.0f} s wall time lost; "
        f"{c['restarting_s']:.1f} s in the restart calls; effective training time ratio "
        + ("n/a" if ratio is None else f"{ratio:.3f}")
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Print the job's restarts, oldest first, and their cost."""
    job = check_job(args.job)
    document = gather_restarts(settings.require_database_url(), job)
    if args.json:
        print(json.dumps(document, indent=2))
    elif not document["restarts"]:
        print(f"job {job}: no restart records")
    else:
        print(f"job {job}:")
        for restart in document["restarts"]:
            print(f"  {describe_restart(restart)}")
        print(f"  {summary(document)}")
    return EXIT_OK if document["restarts"] else EXIT_NONE

"""``ckpt-pipeline prune``: its arguments, and the run that prints the plan or what was removed.

Imported by the CLI when it builds its parser, so nothing heavy at module level (psycopg and the
executor are imported by :func:`run`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ckpt_pipeline.exit_codes import EXIT_FAILED, EXIT_OK
from ckpt_pipeline.settings import Settings
from lambda_writer import JobPlan, Removal, RetentionPolicy, check_job_id


def add_parser(commands: Any) -> None:
    """Register ``prune`` on the CLI's subparsers."""
    prune = commands.add_parser(
        "prune",
        help="remove old checkpoints' rows (a dry run unless --apply)",
        description="Remove checkpoints a retention policy does not keep. Never removes the\n"
        "latest complete checkpoint, the resume target, the best K, or anything newer\n"
        "than the latest complete one. A removed checkpoint leaves a tombstone: a late\n"
        "report of it is dropped by the writer. A dry run unless --apply.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = prune.add_mutually_exclusive_group(required=True)
    which.add_argument("--job", help="this job")
    which.add_argument("--all", action="store_true", help="every job")
    prune.add_argument("--keep-last", type=_int, metavar="N", help="keep the N newest complete")
    prune.add_argument(
        "--keep-best", type=_int, default=0, metavar="K", help="also keep the K best by --metric"
    )
    prune.add_argument("--metric", help="loss or a metrics key (with --keep-best)")
    prune.add_argument("--mode", default="min", help="min (default) or max: which value is best")
    prune.add_argument(
        "--keep-every", type=_int, metavar="S", help="also keep complete steps divisible by S"
    )
    prune.add_argument(
        "--superseded", action="store_true", help="also remove older attempts' shard rows"
    )
    prune.add_argument(
        "--delete-objects",
        action="store_true",
        help="delete the stored objects first (file:// paths, or s3:// objects exactly as"
        " pinned); a checkpoint keeps its rows where one is not deleted",
    )
    prune.add_argument("--apply", action="store_true", help="remove (default: print the plan)")
    prune.add_argument(
        "--no-check-files",
        dest="check_files",
        action="store_false",
        help="protect the database's resume target without checking its files exist",
    )
    prune.add_argument("--json", action="store_true", help="JSON instead of text")


def _int(text: str) -> int:
    # The range is checked by RetentionPolicy, which names the option and the rule.
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def policy_from(args: argparse.Namespace) -> RetentionPolicy:
    """The validated policy the arguments ask for."""
    return RetentionPolicy(
        keep_last=args.keep_last,
        keep_best=args.keep_best,
        metric=args.metric,
        mode=args.mode,
        keep_every=args.keep_every,
        superseded=args.superseded,
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Plan, print; with ``--apply`` remove and print what was removed."""
    policy = policy_from(args)
    jobs = None if args.all else [check_job_id(args.job)]
    url = settings.require_database_url()
    from ckpt_pipeline.ops.prune import apply_plans, connect_check, plan_prune

    connect_check(url)
    plans = plan_prune(url, policy, jobs=jobs, check_files=args.check_files)
    if not args.apply:
        objects = _planned_objects(url, plans) if args.delete_objects else {}
        print(render_plans_json(plans, objects) if args.json else render_plans(plans, objects))
        return EXIT_OK
    outcomes = apply_plans(
        url, plans, policy, delete_objects=args.delete_objects, check_files=args.check_files
    )
    print(render_outcomes_json(outcomes) if args.json else render_outcomes(outcomes))
    failed = any(o.not_deleted for o in outcomes)
    if failed:
        print(
            "ckpt-pipeline prune: some objects were not deleted; their rows stay", file=sys.stderr
        )
    return EXIT_FAILED if failed else EXIT_OK


# Per job, per step: the objects --delete-objects would delete (prune_objects.planned_objects).
PlannedObjects = dict[str, dict[int, tuple[Any, ...]]]


def _planned_objects(url: str, plans: list[JobPlan]) -> PlannedObjects:
    from ckpt_pipeline.ops.prune_objects import planned_objects
    from lambda_writer import connect_url

    with connect_url(url, autocommit=True) as conn:
        return {
            p.job_id: planned_objects(conn, p.job_id, list(p.remove), list(p.superseded))
            for p in plans
        }


def removal_json(job_id: str, r: Removal) -> dict[str, Any]:
    """One removal as both the dry run and --apply print it (the same shape)."""
    return {
        "job_id": job_id,
        "step": r.step,
        "run_attempt": r.run_attempt,
        "world_size": r.world_size,
        "is_complete": r.is_complete,
        "shard_rows": r.shard_rows,
    }


def render_plans_json(plans: list[JobPlan], objects: PlannedObjects | None = None) -> str:
    """The dry run as JSON: ``remove`` and ``superseded`` as ``--apply --json`` prints them, and
    with --delete-objects the objects that would be deleted."""
    return json.dumps(
        {
            "apply": False,
            "objects": [
                {"job_id": job, "step": step, "uri": o.uri}
                for job, steps in (objects or {}).items()
                for step, found in steps.items()
                for o in found
            ],
            "remove": [removal_json(p.job_id, r) for p in plans for r in p.remove],
            "superseded": [removal_json(p.job_id, r) for p in plans for r in p.superseded],
            "jobs": [
                {
                    "job_id": p.job_id,
                    "latest_complete": p.latest_complete,
                    "kept": {str(step): list(why) for step, why in p.kept.items()},
                }
                for p in plans
            ],
        },
        indent=2,
    )


def render_plans(plans: list[JobPlan], objects: PlannedObjects | None = None) -> str:
    """The dry run as text: every removal (with --delete-objects, each object it would delete)
    and every kept checkpoint with its reasons."""
    lines: list[str] = []
    for p in plans:
        latest = "none" if p.latest_complete is None else f"step {p.latest_complete}"
        lines.append(f"job {p.job_id}: latest complete {latest}")
        steps = (objects or {}).get(p.job_id, {})
        for r in p.remove:
            lines.append("  remove     " + _describe(r))
            lines.extend(f"    delete   {o.uri}" for o in steps.get(r.step, ()))
        for r in p.superseded:
            lines.append(f"  superseded step {r.step}: {r.shard_rows} shard rows of older attempts")
            lines.extend(f"    delete   {o.uri}" for o in steps.get(r.step, ()))
        for step, why in p.kept.items():
            lines.append(f"  keep       step {step}: {', '.join(why)}")
    checkpoints = sum(len(p.remove) for p in plans)
    rows = sum(r.shard_rows for p in plans for r in p.remove)
    superseded = sum(r.shard_rows for p in plans for r in p.superseded)
    lines.append(
        f"dry run: would remove {checkpoints} checkpoints ({rows} shard rows) and"
        f" {superseded} superseded shard rows; --apply removes them"
    )
    return "\n".join(lines)


def _describe(r: Removal) -> str:
    state = "complete" if r.is_complete else "incomplete"
    value = "" if r.value is None else f", value {r.value:.6g}"
    return f"step {r.step} attempt {r.run_attempt}: {state}, {r.shard_rows} shard rows{value}"


def render_outcomes_json(outcomes: list[Any]) -> str:
    """What --apply removed, as JSON (``remove``/``superseded`` shaped as the dry run's)."""
    return json.dumps(
        {
            "apply": True,
            "remove": [removal_json(o.job_id, r) for o in outcomes for r in o.removed],
            "superseded": [removal_json(o.job_id, r) for o in outcomes for r in o.superseded],
            "kept_changed": [
                {"job_id": o.job_id, "step": step} for o in outcomes for step in o.kept_changed
            ],
            "objects_deleted": sum(o.objects_deleted for o in outcomes),
            "not_deleted": [
                {"job_id": o.job_id, "step": n.step, "uri": n.uri, "reason": n.reason}
                for o in outcomes
                for n in o.not_deleted
            ],
        },
        indent=2,
    )


def render_outcomes(outcomes: list[Any]) -> str:
    """What --apply removed, as text."""
    lines: list[str] = []
    for o in outcomes:
        for r in o.removed:
            lines.append(f"job {o.job_id}: removed " + _describe(r))
        for r in o.superseded:
            lines.append(
                f"job {o.job_id}: removed {r.shard_rows} superseded shard rows of step {r.step}"
            )
        for step in o.kept_changed:
            lines.append(f"job {o.job_id}: kept step {step}: it changed since the plan")
        for n in o.not_deleted:
            lines.append(f"job {o.job_id}: kept step {n.step}: {n.uri} not deleted: {n.reason}")
    checkpoints = sum(len(o.removed) for o in outcomes)
    rows = sum(r.shard_rows for o in outcomes for r in o.removed)
    superseded = sum(r.shard_rows for o in outcomes for r in o.superseded)
    deleted = sum(o.objects_deleted for o in outcomes)
    lines.append(
        f"removed {checkpoints} checkpoints ({rows} shard rows) and {superseded} superseded"
        f" shard rows; {deleted} objects deleted"
    )
    return "\n".join(lines)

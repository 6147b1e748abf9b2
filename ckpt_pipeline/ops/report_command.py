"""``ckpt-pipeline report --job J --out FILE.png``: a job's story in one picture.

Steps over wall time: every checkpoint at the time it was first reported (complete, incomplete,
pruned), every restart as a vertical line at the time it trained again, with the step it resumed
from, the work it lost (from the newest step saved down to the one resumed from) and the wall
time lost shaded; the title says what preemption cost (``ckpt-pipeline restarts``' figures).

Exit status: 0 when drawn; 1 when the job has neither checkpoints nor restarts; 2 when an option
is refused.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ckpt_pipeline.cli_args import check_job
from ckpt_pipeline.exceptions import ConfigError
from ckpt_pipeline.exit_codes import EXIT_OK
from ckpt_pipeline.settings import Settings

EXIT_NOTHING = 1

_CHECKPOINTS = """
SELECT step, first_reported_at, is_complete FROM training_checkpoints
WHERE job_id = %(job_id)s ORDER BY step
"""
_PRUNED = """
SELECT step, pruned_at FROM training_checkpoint_tombstones WHERE job_id = %(job_id)s
"""


def add_parser(commands: Any) -> None:
    """Register ``report`` on the CLI's subcommands."""
    report = commands.add_parser("report", help="draw a job's checkpoints and restarts (PNG)")
    report.add_argument("--job", required=True, help="the job")
    report.add_argument("--out", required=True, type=Path, help="the PNG file to write")


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Read the job and draw it."""
    job = check_job(args.job)
    if args.out.suffix.lower() != ".png":
        raise ConfigError("--out", f"must name a .png file (got {str(args.out)!r})")
    from ckpt_pipeline.ops.restarts import cost, job_restarts
    from lambda_writer import connect_url

    with connect_url(settings.require_database_url(), autocommit=True) as conn:
        checkpoints = conn.execute(_CHECKPOINTS, {"job_id": job}).fetchall()
        pruned = conn.execute(_PRUNED, {"job_id": job}).fetchall()
        restarts, span = job_restarts(conn, job)
    if not checkpoints and not restarts:
        print(f"job {job}: no checkpoints and no restarts to draw")
        return EXIT_NOTHING
    draw(job, checkpoints, pruned, restarts, cost(restarts, span).as_json(), args.out)
    print(
        f"job {job}: {len(checkpoints)} checkpoint(s), {len(restarts)} restart record(s) "
        f"drawn to {args.out}"
    )
    return EXIT_OK


def draw(
    job: str,
    checkpoints: list[tuple[Any, ...]],
    pruned: list[tuple[Any, ...]],
    restarts: list[Any],
    costs: dict[str, Any],
    out: Path,
) -> None:
    """The picture (matplotlib, headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5.5), dpi=110)
    gone = {int(step) for step, _ in pruned}
    for label, marker, color, rows in (
        ("complete", "o", "tab:green", [c for c in checkpoints if c[2] and c[0] not in gone]),
        ("incomplete", "x", "tab:orange", [c for c in checkpoints if not c[2]]),
        ("pruned", "s", "tab:gray", [c for c in checkpoints if c[0] in gone]),
    ):
        if rows:
            ax.scatter(
                [r[1] for r in rows],
                [r[0] for r in rows],
                marker=marker,
                color=color,
                label=f"checkpoint {label}",
                zorder=3,
            )
    for r in restarts:
        resumed = r.resumed_step if r.resumed_step is not None else 0
        ax.axvline(r.restarted_at, color="tab:red", alpha=0.5, linestyle="--")
        if r.newest_saved_step is not None and r.newest_saved_step > resumed:
            ax.vlines(
                r.restarted_at,
                resumed,
                r.newest_saved_step,
                color="tab:red",
                linewidth=4,
                alpha=0.6,
            )
        since = r.resumed_reported_at if r.resumed_step is not None else None
        if since is not None and since < r.restarted_at:
            ax.axvspan(since, r.restarted_at, color="tab:red", alpha=0.08)
        text = f"attempt {r.run_attempt}: " + (
            "from scratch" if r.resumed_step is None else f"from step {r.resumed_step}"
        )
        if r.steps_lost:
            text += f", {r.steps_lost} steps lost"
        if r.skipped_total:
            text += f", {r.skipped_total} skipped"
        ax.annotate(
            text,
            (r.restarted_at, resumed),
            rotation=90,
            fontsize=8,
            va="bottom",
            ha="right",
            color="tab:red",
        )
    ratio = costs["effective_training_time_ratio"]
    ax.set_title(
        f"job {job}: {costs['restarts']} restart(s), {costs['steps_lost']} steps redone, "
        f"effective training time ratio {'n/a' if ratio is None else f'{ratio:.3f}'}"
    )
    ax.set_xlabel("time (UTC)")
    ax.set_ylabel("step")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(out, format="png")
    plt.close(fig)

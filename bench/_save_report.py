"""How ``python -m bench save_overhead`` checks and prints a run: every report drained and
checked against the files, the disk's own fsync and hash time, the table's row, the step plot
and the raw steps beside it."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import _plot
from bench._save_runs import REPORTING, SaveRun
from trainer_client.storage.durable import fsync_path, sha256_files


def _sha256sum(paths: Sequence[Path]) -> tuple[dict[Path, str], float]:
    start = time.perf_counter()
    done = subprocess.run(
        ["sha256sum", *map(str, paths)], capture_output=True, text=True, check=True
    )
    seconds = time.perf_counter() - start
    return {Path(line[66:]): line[:64] for line in done.stdout.splitlines()}, seconds


def check_reports(run: SaveRun, bodies: list[dict[str, Any]]) -> str:
    """'ok' when every saved step was reported once with its files' bytes, and the digests of
    those still on disk (the ``--keep`` last) are the files'."""
    if run.mode not in REPORTING:
        return "-" if not bodies else f"{len(bodies)} unexpected"
    steps = sorted(b["step"] for b in bodies)
    if steps != sorted([*run.files, *run.removed]):
        return f"steps {steps} != saved {sorted([*run.files, *run.removed])}"
    digests: dict[Path, str] = {}
    if run.mode == "finish+sha":
        digests, _ = _sha256sum([p for ps in run.files.values() for p in ps])
    for body in bodies:
        if body["step"] in run.removed:  # rotated away: its size was taken before
            if body["bytes"] != run.removed[body["step"]]:
                return f"step {body['step']}: bytes {body['bytes']}"
            continue
        files = run.files[body["step"]]
        if body["bytes"] != sum(p.stat().st_size for p in files):
            return f"step {body['step']}: bytes {body['bytes']}"
        if run.mode == "finish+sha":
            got = body.get("file_sha256") or {files[0].name: body["sha256"]}
            base = Path(body["uri"].removeprefix("file://"))
            for p in files:
                name = p.relative_to(base).as_posix() if base.is_dir() else p.name
                if got.get(name) != digests[p]:
                    return f"step {body['step']}: digest of {p.name}"
    return "ok"


def disk_own_s(paths: Sequence[Path], checksums: bool) -> tuple[float, float]:
    """(fsync s, hash s) of the same bytes with nothing else in the way: fresh copies of
    ``paths`` written to the page cache, fsync'd, then hashed on every core (cache warm)."""
    copies = [p.with_name(f".own-{p.name}") for p in paths]
    try:
        for src, dst in zip(paths, copies, strict=True):
            shutil.copyfile(src, dst)
        start = time.perf_counter()
        for c in copies:
            fsync_path(c)
        synced = time.perf_counter() - start
        start = time.perf_counter()
        if checksums:
            sha256_files(copies, threads=os.cpu_count() or 1)
        return synced, time.perf_counter() - start
    finally:
        for c in copies:
            c.unlink(missing_ok=True)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def line(run: SaveRun, reports: str) -> str:
    """One row of the table."""
    ratio = max((o / f for o, f in zip(run.ours_s, run.framework_s, strict=False)), default=0.0)
    step = run.step_ratio()
    own = "-" if run.own_s is None else f"{run.own_s:.2f}"
    latency = "-" if not run.own_s else f"{median(run.finish_s) / run.own_s:.1f}x"
    phases = " / ".join(
        f"{median([p.get(k, 0.0) for p in run.phases]):.2f}" for k in ("durable", "hash")
    )
    own_phases = " / ".join(f"{x:.2f}" for x in run.own_phases)
    return (
        f"| {run.framework} | {run.ckpt_bytes / 1e9:.2f} | {run.mode} | "
        f"{median(run.framework_s):.2f} | {1000 * median(run.ours_s):.1f} / "
        f"{1000 * max(run.ours_s, default=0.0):.1f} | {100 * ratio:.2f} % | "
        f"{median(run.finish_s):.2f} | {phases or '-'} | {own} | {own_phases} | {latency} | "
        f"{step or '-'} | "
        f"{median([s for s, _ in run.steps[2:]]) * 1000:.1f} | {reports} |"
    )


HEADER = (
    "| framework | GB | mode | framework's save s (median) | ours on the training thread ms"
    " (median / max) | ours / framework (max) | finish s (median) | of which durable / hash s |"
    " disk's own s | of which fsync / hash s | finish / own |"
    " step busy / idle [95 % interval] (busy/idle steps in cycles) | step ms (median) |"
    " reports |"
)


def plot_step_times(series: Sequence[tuple[str, Sequence[tuple[float, bool]]]], path: Path) -> Path:
    """One panel per run: each training step's time in order, red while the save was being
    written back (by the finisher, or by the kernel in a control), blue while it was not, with
    the two medians as lines."""
    if not series:
        raise ValueError("plot_step_times: no runs to draw")
    fig, axes = _plot.figure("Training step time during and outside a write-back", len(series))
    for ax, (label, steps) in zip(axes, series, strict=True):
        for busy, colour, name in (
            (False, _plot.PIPELINE, "idle"),
            (True, _plot.DIRECT, "finishing (control: the kernel writing back)"),
        ):
            chosen = [(i, 1000 * s) for i, (s, b) in enumerate(steps) if b is busy]
            if not chosen:
                continue
            xs, ys = zip(*chosen, strict=True)
            ax.plot(xs, ys, ".", markersize=2, color=colour, label=name)
            median = sorted(ys)[len(ys) // 2]
            ax.axhline(median, color=colour, linewidth=1, linestyle="--")
        ax.set_yscale("log")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step")
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("step time (ms, log scale)")
    axes[0].legend(fontsize=7, markerscale=4)
    return _plot.save(fig, path)


def write_steps(rows: Sequence[SaveRun], directory: Path, tuning: dict[str, Any]) -> None:
    """Every step of every run so far, to redraw or to look at the cycles again without a rerun
    (rewritten after each run: a run cut short keeps the ones before)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "save_overhead-steps.json").write_text(
        json.dumps(
            [
                {"framework": r.framework, "gb": r.ckpt_bytes / 1e9, "mode": r.mode,
                 "tuning": tuning, "steps": r.steps, "traces": r.traces,
                 "dirty_at_save": r.dirty_at_save}
                for r in rows
            ]
        )
    )  # fmt: skip


def plots(rows: Sequence[SaveRun], directory: Path) -> None:
    """Draw every run that has busy and idle windows (a finish, or a control's write-back)."""
    chosen = [r for r in rows if r.step_ratio() is not None]
    if chosen:
        path = plot_step_times(
            [(f"{r.framework}, {r.ckpt_bytes / 1e9:.1f} GB, {r.mode}", r.steps) for r in chosen],
            directory / "save_overhead-steps.png",
        )
        print(f"plot: {path}")

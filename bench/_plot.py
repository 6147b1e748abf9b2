"""The benchmarks' figures as PNGs (``python -m bench NAME ... --plot DIR``), drawn from the
result objects the benches return, never by hand.

matplotlib is an optional extra (``pip install 'ckpt-pipeline[plot]'``); it is imported only when
a plot is drawn, and through :class:`matplotlib.figure.Figure` with the Agg canvas: no pyplot, no
display, no global state, so a headless machine draws the same PNG.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.fanin import FaninRow
    from bench.intake import IntakeRow
    from bench.lag import LagCurve
    from bench.read_paths import Pass
    from bench.writer_throughput import Throughput

_PIPELINE, _DIRECT, _FLOOR = "tab:blue", "tab:red", "tab:gray"


def require() -> None:
    """Fail before a long run, not after it, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'ckpt-pipeline[plot]'") from None


def _figure(title: str, panels: int = 1) -> tuple[Any, list[Any]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    FigureCanvasAgg(fig)  # PNG through Agg whatever the environment's backend
    fig.suptitle(title, fontsize=11)
    axes = [fig.add_subplot(1, panels, i + 1) for i in range(panels)]
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    return fig, axes


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def plot_fanin(rows: Sequence[FaninRow], path: Path) -> Path:
    """Left: seconds until every row is in vs ranks, the pipeline beside the SQS emulator's own
    floor for the same messages (and the direct write where it got every row in). Right: the
    share of the rows each design got into the database."""
    fig, (time_ax, rows_ax) = _figure("Fan-in: N ranks reporting at each checkpoint barrier", 2)
    ns = [r.pipeline.ranks for r in rows]
    done = [(r.pipeline.ranks, r.pipeline.all_rows_s) for r in rows if r.pipeline.all_rows_s]
    if done:  # a run that never had every row in is left out (its row says "never")
        time_ax.plot(*zip(*done, strict=True), "o-", color=_PIPELINE, label="pipeline")
    time_ax.plot(ns, [r.floor_s for r in rows], "s--", color=_FLOOR,
                 label="SQS emulator alone,\nsame messages (floor)")  # fmt: skip
    rows_ax.plot(ns, [100 * r.pipeline.rows / r.pipeline.expected for r in rows], "o-",
                 color=_PIPELINE, label="pipeline")  # fmt: skip
    direct = [(r.pipeline.ranks, r.direct, r.direct_rows) for r in rows if r.direct is not None]
    if direct:
        whole = [(n, d.elapsed_s) for n, d, got in direct if got == d.attempted]
        if whole:
            label = "direct write (seed),\nwhere every row got in"
            time_ax.plot(*zip(*whole, strict=True), "x-", color=_DIRECT, label=label)
        rows_ax.plot([n for n, _, _ in direct], [100 * got / d.attempted for _, d, got in direct],
                     "x-", color=_DIRECT, label="direct write (seed)")  # fmt: skip
    time_ax.set_ylabel("seconds from the first barrier to every row in")
    rows_ax.set_ylabel("rows in the database (%)")
    rows_ax.set_ylim(0, 105)
    for ax in (time_ax, rows_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("ranks")
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_intake(rows: Sequence[IntakeRow], path: Path) -> Path:
    """Seconds from the first barrier to every row in vs ranks: every rank's own FIFO message
    beside reports packed per node, measured back to back."""
    fig, (ax,) = _figure(
        f"Intake: {rows[0].per_rank.checkpoints} checkpoints of N ranks, 2 writers, measured here"
    )
    ns = [r.per_rank.ranks for r in rows]
    for label, runs, style, colour in (
        ("per-rank FIFO messages", [r.per_rank for r in rows], "o-", _DIRECT),
        (f"packed per node ({rows[0].pack} reports)", [r.packed for r in rows], "s-", _PIPELINE),
    ):
        done = [(run.ranks, run.all_rows_s) for run in runs if run.all_rows_s is not None]
        if done:  # a run that never had every row in is left out
            ax.plot(*zip(*done, strict=True), style, color=colour, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("ranks")
    ax.set_ylabel("seconds from the first barrier to every row in")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_lag(curve: LagCurve, path: Path) -> Path:
    """Lag p50 and p99 vs offered rate, the p99 goal, and the emulator's bare ceiling."""
    from bench.lag import HELD_P99_S

    fig, (ax,) = _figure(
        f"End-to-end lag, report() to commit: {curve.ranks} ranks, open loop, {curve.emulator}"
    )
    phases = sorted(curve.phases, key=lambda p: p.target_rate)
    for q, style in ((0.5, "o-"), (0.99, "s-")):
        pts = [(p.target_rate, 1000 * v) for p in phases if (v := p.pct(q)) is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), style, label=f"p{round(100 * q)}")
    ax.axhline(1000 * HELD_P99_S, color=_DIRECT, linestyle=":", label="p99 goal")
    ceiling = f"{curve.emulator} alone: bare ceiling ({curve.ceiling_per_s:.0f} msg/s)"
    ax.axvline(curve.ceiling_per_s, color=_FLOOR, linestyle="--", label=ceiling)
    ax.set_yscale("log")
    ax.set_xlabel("offered rate (reports/s, all ranks)")
    ax.set_ylabel("lag (ms)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_writer(t: Throughput, path: Path) -> Path:
    """Rows/s of each write method, the writer beside COPY at the same granularity."""
    from bench.writer_throughput import COPY_10, NAIVE

    fig, (ax,) = _figure(f"Writer throughput, one connection ({t.rows} rows, best of {t.rounds})")
    names = list(t.rates)
    colours = [_PIPELINE if n.startswith("writer") else _DIRECT if n == NAIVE else _FLOOR
               for n in names]  # fmt: skip
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
    return _save(fig, path)


def plot_read_paths(passes: Sequence[Pass], path: Path) -> Path:
    """Requests (left) and seconds (right) to verify one checkpoint vs its shards, by listing and
    by HEAD per object (log-log; sampled HEAD passes are scaled to the whole checkpoint)."""
    fig, (req_ax, sec_ax) = _figure("Verifying one checkpoint on S3 (moto): listing vs HEAD", 2)
    for how, colour, label in (
        ("listing", _PIPELINE, "by listing"),
        ("head", _DIRECT, "HEAD each"),
    ):
        mine = sorted((p for p in passes if p.verify_by == how), key=lambda p: p.shards)
        xs = [p.shards for p in mine]
        req_ax.plot(xs, [p.requests for p in mine], "o-", color=colour, label=label)
        sec_ax.plot(xs, [p.seconds for p in mine], "o-", color=colour, label=label)
    for ax, name in ((req_ax, "S3 requests"), (sec_ax, "seconds")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("shards (objects) in the checkpoint")
        ax.set_ylabel(name)
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_step_times(series: Sequence[tuple[str, Sequence[tuple[float, bool]]]], path: Path) -> Path:
    """One panel per run: each training step's time in order, red while the finisher worked on
    a checkpoint, blue while it did not, with the two medians as lines."""
    if not series:
        raise ValueError("plot_step_times: no runs to draw")
    fig, axes = _figure("Training step time during and outside a finish", len(series))
    for ax, (label, steps) in zip(axes, series, strict=True):
        for busy, colour, name in ((False, _PIPELINE, "no finish"), (True, _DIRECT, "finishing")):
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
    return _save(fig, path)

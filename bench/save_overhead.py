"""What reporting a checkpoint costs the training loop: the framework's save beside ours.

Method and figures: BENCHMARKS.md §8 (``--done-check``: the HF Trainer at 1.3 GB, its goal).
The checkpoints (the ``--keep`` newest) go to a work dir of its own (``bench._work_dir``),
removed when the bench ends, fails or is stopped by SIGTERM or SIGINT; after a SIGKILL the next
run removes it, and the moto server's process group is left to kill.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._harness import cli, drain_bodies, fresh_queue, machine, moto_sqs, parse, table
from bench._probe import summary
from bench._save_lightning import run_lightning
from bench._save_report import HEADER, check_reports, disk_own_s, line, median, plots, write_steps
from bench._save_runs import (
    MAX_STEPS,
    MODES,
    REPORTING,
    Plan,
    Runner,
    SaveRun,
    control_watch,
    end_step,
    end_watch,
    instrument,
    reporter,
    run_hf,
    step_clock,
)  # fmt: skip
from bench._steps import relative_ratio, step_ratio
from bench._work_dir import work_root
from bench._writeback import CONTROLS

FRAMEWORKS = ("hf", "lightning", "lightning-async", "plain")
DONE_GB, DONE_MAX_S, DONE_SHARE = 1.3, 0.020, 0.01


def run_plain(
    size: int, mode: str, out: Path, queue_url: str, *, device: str, plan: Plan, workers: int
) -> SaveRun:
    """A plain loop: a small model trains; a ``size``-byte state is saved with
    ``atomic_torch_save_async`` (``none``: ``torch.save`` and a rename) every ``plan.every``
    steps or by the cadence."""
    import torch

    from trainer_client.torch_integration import atomic_torch_save_async

    run = SaveRun("plain", mode, device)
    rep = reporter(
        queue_url, out / "spool", f"bench-plain-{mode.replace('+', '-')}-{size}", plan.tuning
    )
    instrument(rep, run)
    cadence = plan.clock()
    watch = control_watch(mode)
    clock = step_clock(run, watch, lambda: rep)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)]).to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    state = {"blob": torch.randn(size // 4)}
    data = torch.utils.data.TensorDataset(torch.randn(8192, 512))
    steps = MAX_STEPS if cadence is not None else plan.every * (plan.saves + 1)
    sampler = torch.utils.data.RandomSampler(data, replacement=True, num_samples=64 * steps)
    loader = iter(
        torch.utils.data.DataLoader(data, batch_size=64, sampler=sampler, num_workers=workers)
    )
    for step in range(1, steps + 1):
        clock.begin()
        (batch,) = next(loader)
        model(batch.to(device)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        action = end_step(clock, cadence, device)
        if cadence is not None:
            if action == "stop":
                break
            if action != "save":
                continue
        elif step % plan.every or step > plan.every * plan.saves:
            continue
        path = out / "plain" / f"step-{step}.pt"
        plan.rotate(run, rep)
        start = time.perf_counter()
        if mode not in REPORTING:
            tmp = path.with_name(f".{path.name}.tmp")
            path.parent.mkdir(parents=True, exist_ok=True)
            with tmp.open("wb") as f:
                torch.save(state, f)
            tmp.replace(path)
            if watch is not None:
                watch.saved([path])
        else:
            atomic_torch_save_async(
                rep, state, path, checksums=mode == "finish+sha", step=step, epoch=0,
                uri=path.resolve().as_uri(),
            )  # fmt: skip
        total = time.perf_counter() - start
        ours = run.finish_call_s[-1] if mode in REPORTING else 0.0
        run.framework_s.append(total - ours)
        run.ours_s.append(ours)
        run.files[step] = [path]
    rep.close(timeout=600)
    end_watch(run, watch)
    run.ckpt_bytes = path.stat().st_size
    return run


def _tuning(text: str) -> tuple[str, Any]:
    key, _, raw = text.partition("=")
    if not key or not raw:
        raise argparse.ArgumentTypeError(f"--tuning {text!r}: expected KEY=VALUE")
    try:
        return key, json.loads(raw)
    except ValueError:
        return key, raw


def _parser() -> argparse.ArgumentParser:
    p = cli(__doc__, plot="save_overhead-steps.png and every step to save_overhead-steps.json")
    p.add_argument("--sizes-gb", type=float, nargs="+", default=[0.1, 1.0])
    p.add_argument("--frameworks", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    # The controls are asked for by name: `control` waits ~30 s for the kernel at every save.
    p.add_argument("--modes", nargs="+", choices=MODES, default=["none", *REPORTING])
    p.add_argument("--saves", type=int, default=8, help="saves (cycles) per run")
    p.add_argument("--keep", type=int, default=3,
                   help="checkpoints kept on disk, the oldest removed before a save (0: all); the"
                   " removed ones' reports are checked for their step and bytes, the kept ones'"
                   " digests too")  # fmt: skip
    p.add_argument("--workers", type=int, default=2, help="data loader worker processes")
    p.add_argument("--min-idle", type=int, default=50, help="idle steps at least between two saves")
    p.add_argument("--tuning", type=_tuning, action="append", default=[], metavar="KEY=VALUE",
                   help="a reporter knob (JSON), e.g. finisher_priority=idle")  # fmt: skip
    p.add_argument("--model", choices=["ballast", "sized", "gpt2-medium"], default="ballast",
                   help="ballast: a small model + a buffer of the size (short steps, many"
                   " per window); sized: a model of the size; gpt2-medium: HF only,"
                   " ~4.25 GB")  # fmt: skip
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--work-dir", type=Path, default=None, help="checkpoints go here (deleted)")
    p.add_argument("--done-check", action="store_true", help="HF GPT-2 at 1.3 GB, checksums on/off")
    return p


def _runner(framework: str) -> Runner:
    return {"hf": run_hf, "plain": run_plain}.get(framework, run_lightning)


def _plan(args: argparse.Namespace) -> Plan:
    if args.done_check:  # the case: a GPT-2 of the size, a save every 2 steps
        return Plan(saves=3, every=2, model="sized", tuning=dict(args.tuning))
    return Plan(saves=args.saves, cadence=True, min_idle=args.min_idle, model=args.model,
                tuning=dict(args.tuning), keep=args.keep)  # fmt: skip


def _one(
    args: argparse.Namespace, sqs: Any, framework: str, gb: float, mode: str, root: Path
) -> tuple[SaveRun, str]:
    """One run, its reports checked, the disk's own time for its bytes, its row printed."""
    out = root / f"{framework}-{gb}-{mode}"
    shutil.rmtree(out, ignore_errors=True)
    queue = fresh_queue(sqs, "so")
    extra: dict[str, Any] = {}
    if "lightning" in framework:
        extra["asynchronous"] = framework == "lightning-async"
    load = os.getloadavg()[0]
    try:
        run = _runner(framework)(
            int(gb * 1e9), mode, out, queue, device=args.device, plan=_plan(args),
            workers=args.workers, **extra,
        )  # fmt: skip
        reports = check_reports(run, drain_bodies(sqs, queue))
        if mode in REPORTING:
            synced, hashed = disk_own_s(run.files[max(run.files)], mode == "finish+sha")
            run.own_s, run.own_phases = synced + hashed, (synced, hashed)
    finally:  # also on SIGTERM/SIGINT (main turns them into SystemExit/KeyboardInterrupt)
        shutil.rmtree(out, ignore_errors=True)
    print(f"{line(run, reports)}  load {load:.2f} -> {os.getloadavg()[0]:.2f}", flush=True)
    dirty = f"; left dirty by the save (median MB): {median(run.dirty_at_save) / 1e6:.0f}"
    rotated = (
        f"; {len(run.removed)} of {len(run.removed) + len(run.files)} checkpoints rotated away"
    )
    mean = step_ratio(run.steps, centre=statistics.fmean)
    print(
        f"  step ratio of the means (throughput): {mean or '-'};"
        f" {summary(run.steps, run.traces)}{dirty if run.dirty_at_save else ''}"
        f"{rotated if run.removed else ''}",
        flush=True,
    )
    return run, reports


def main(argv: Sequence[str] | None = None) -> int:
    """Run the grid (or the done check), print the table; 1 on a wrong report or a missed goal."""
    p = _parser()
    args = parse(p, argv)
    if args.keep < 0:
        p.error(f"--keep: {args.keep} is negative (0 keeps every checkpoint)")
    if "lightning-async" in args.frameworks and set(args.modes) & set(CONTROLS):
        # Its save returns before the file exists: there is nothing yet for the kernel to write.
        p.error("--modes control/control-now: not with --frameworks lightning-async")
    if args.done_check:
        args.sizes_gb, args.frameworks, args.modes = [DONE_GB], ["hf"], ["finish", "finish+sha"]
    with work_root(args.work_dir) as root:
        return _main(args, root)


def _main(args: argparse.Namespace, root: Path) -> int:
    print(
        f"# save_overhead on {machine()}, device {args.device}, {_plan(args)},"
        f" {args.workers} data loader workers, work dir {root}"
    )
    table(HEADER)
    rows, failed = [], False
    cells: dict[tuple[str, float], list[SaveRun]] = {}
    with moto_sqs() as (_, sqs):
        for gb in args.sizes_gb:
            for framework in args.frameworks:
                for mode in args.modes:
                    run, reports = _one(args, sqs, framework, gb, mode, root)
                    rows.append(run)
                    cells.setdefault((framework, gb), []).append(run)
                    failed |= reports not in ("ok", "-")
                    if args.plot is not None:
                        write_steps(rows, args.plot, dict(args.tuning))
    for (framework, gb), runs in cells.items():
        for control in (r for r in runs if r.mode in CONTROLS):
            for run in (r for r in runs if r.mode in REPORTING):
                median = relative_ratio(run.steps, control.steps)
                mean = relative_ratio(run.steps, control.steps, centre=statistics.fmean)
                print(
                    f"{framework} {gb} GB, step ratio {run.mode} / {control.mode}:"
                    f" {median or '-'}; of the means: {mean or '-'}"
                )
    if args.done_check:
        worst = max(o for r in rows for o in r.ours_s)
        share = max(o / f for r in rows for o, f in zip(r.ours_s, r.framework_s, strict=True))
        verdict = "met" if worst <= DONE_MAX_S and share <= DONE_SHARE else "MISSED"
        # A save beyond max_finishing waits for the finisher by design (back-pressure): said
        # apart, since it is the finisher's throughput, not the training thread's own cost.
        waits = sum(r.bound_waits for r in rows)
        print(
            f"done check: on_save max {1000 * worst:.1f} ms (goal <= {1000 * DONE_MAX_S:.0f} ms),"
            f" worst ours / Trainer's save {100 * share:.2f} % (goal <= 1 %): {verdict};"
            f" saves that waited at the max_finishing bound: {waits}"
        )
        failed |= verdict != "met"
    if args.plot is not None:
        plots(rows, args.plot)
    return 1 if failed else 0

"""Spawned worker processes around one cross-process barrier whose last party is the parent.

The benches' simulated ranks (bench/_ranks.py) and the intake's sender processes
(bench/_intake_senders.py) both start a few processes (spawned: the parent runs threads), release
them at a barrier, and read one result per process from a queue; the lifecycle is written here.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from collections.abc import Callable, Iterator
from typing import Any


class BarrierProcesses:
    """``count`` processes running ``target(*process_args(barrier, results, i))``."""

    def __init__(
        self, name: str, count: int, target: Callable[..., None],
        process_args: Callable[[Any, Any, int], tuple[Any, ...]],
        *, barrier_timeout_s: float, join_s: float,
    ) -> None:  # fmt: skip
        ctx = multiprocessing.get_context("spawn")
        self._barrier_timeout_s = barrier_timeout_s
        self._join_s = join_s
        self._barrier = ctx.Barrier(count + 1)
        self._results: Any = ctx.Queue()
        self._processes = [
            ctx.Process(
                target=target,
                args=process_args(self._barrier, self._results, i),
                name=f"{name}-{i}",
            )
            for i in range(count)
        ]

    def __enter__(self) -> BarrierProcesses:
        for proc in self._processes:
            proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._barrier.abort()
        for proc in self._processes:
            proc.join(self._join_s)
            if proc.is_alive():
                proc.kill()
                proc.join()

    def release(self) -> float:
        """Wait until every process is at the barrier, then release them; the release time."""
        self._barrier.wait(self._barrier_timeout_s)
        return time.monotonic()

    def _collect(self, timeout_s: float) -> Iterator[Any]:
        """One item per process, fewer if a process died or ``timeout_s`` passed."""
        got = 0
        deadline = time.monotonic() + timeout_s
        while got < len(self._processes):
            try:
                item = self._results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                if time.monotonic() > deadline or not any(p.is_alive() for p in self._processes):
                    return
                continue
            got += 1
            yield item

"""Python's cyclic garbage collector paused around a burst of allocations (one helper, two users:
the verification's expectations and the shard rows' decode, 100,000 of each at the largest)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def cycle_collection_paused() -> Iterator[None]:
    """The cyclic collector off for the block (back on after it, if it was on).

    Why: building a few container objects per shard for 100,000 shards sets the collector off
    hundreds of times, and each of its older-generation passes walks every object alive: about
    half the CPU of decoding a 100,000-shard checkpoint's rows and of validating its pins
    (BENCHMARKS.md, "Read paths at 100,000 shards"). What the blocks build forms no cycle, so
    there is nothing for the collector to free; reference counting frees as usual. The switch is
    the process's: another thread's allocations go uncollected for the block too (tenths of a
    second), and a thread that turns the collector off meanwhile has it turned back on at the
    block's end.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()

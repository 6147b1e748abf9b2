"""The restart's collectives: fixed-size tensors whose size does not grow with the number of ranks.

What rank 0 needs from every rank is a few sums, minima and maxima (:func:`summarize`): the
reports left unsent and the first rank holding some, the newest attempt a spool recorded, the
first rank that already reported, and the (step, attempt) of the reports SQS accepted during the
restart's flush (at most :data:`SLOTS` of them, newest first, found by rounds of MAX).

The wait for those reports (:func:`wait_written`) runs in rounds every rank takes part in: rank 0
reads the shard rows and broadcasts, per slot, the ranges of ranks whose row is missing (at most
:data:`RANGES` ranges; more are merged over their smallest gaps, a superset: a rank in a merged
gap counts as missing, so the wait can run longer, never end early); each rank checks its own
reports against them, and an all-reduce SUM counts those still missing. A gather of every rank's
reports would be exact with no ranges but grows with the ranks on every rank (at 100,000 ranks
tens of MB each); a bitmap of ranks grows as N/8.

The decision reaches every rank once as one uint8 tensor after a one-int64 length header
(:func:`broadcast_bytes`), in a compact encoding (:mod:`.wire_decision`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from trainer_client.restart.decide import POLL_S, InFlight, written_rows

# In-flight (step, attempt) pairs waited for: the newest first; a spool's older ones do not change
# which checkpoint is newest once these are written.
SLOTS = 4
# Ranges of missing ranks rank 0 names per slot and round.
RANGES = 16
# The bytes of a rank's send error that reach rank 0 (the refusal quotes its first line).
NOTE_BYTES = 512
_HOWS = ("restart", "store", "process")
# began packs (rank << 34 | attempt << 2 | how): an attempt takes 31 bits, a rank up to 2**29.
_ATTEMPT_SHIFT, _RANK_SHIFT = 2, 34
_NEVER = 2**62


def collective_device(dist: Any) -> Any:
    import torch

    backend = str(dist.get_backend())
    if "gloo" in backend or backend == "mpi" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def all_reduce_ints(dist: Any, values: list[int], op: str) -> list[int]:
    """``values`` reduced over every rank (``op``: "sum", "min" or "max"): one int64 tensor of
    ``len(values)`` elements, the same few bytes per rank at any world size."""
    if dist is None:
        return values
    import torch

    tensor = torch.tensor(values, dtype=torch.int64, device=collective_device(dist))
    ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
    dist.all_reduce(tensor, op=ops[op])
    return [int(v) for v in tensor.tolist()]


@dataclass(frozen=True)
class Summary:
    """What rank 0 knows of every rank at the restart."""

    # The first rank that already reports as a launch, and as which.
    began: tuple[int, str] | None
    recorded_attempt: int | None
    # Reports left unsent after the flush, over every rank; the first rank holding some, its error.
    unsent: int
    unsent_rank: int | None
    send_error: str | None
    # Reports SQS accepted in the flush, over every rank, and their (step, attempt), newest first.
    waited: int
    slots: tuple[tuple[int, int], ...]


def _began_code(rank: int, began: tuple[int, str] | None) -> int:
    if began is None:
        return _NEVER
    attempt, how = began
    code = _HOWS.index(how) if how in _HOWS else len(_HOWS)
    return rank << _RANK_SHIFT | attempt << _ATTEMPT_SHIFT | code


def _began_text(code: int) -> tuple[int, str] | None:
    if code >= _NEVER:
        return None
    how = code & 3
    attempt = (code >> _ATTEMPT_SHIFT) & (2**32 - 1)
    name = _HOWS[how] if how < len(_HOWS) else "another launch"
    return code >> _RANK_SHIFT, f"attempt {attempt} ({name})"


def summarize(
    dist: Any,
    *,
    rank: int,
    in_flight: Collection[tuple[int, int]],
    recorded_attempt: int | None,
    unsent: int,
    send_error: str | None,
    began: tuple[int, str] | None,
) -> Summary:
    """Every rank's state at the restart, reduced (a collective: every rank calls it; without
    ``dist`` this rank's own)."""
    keys = sorted(set(in_flight), reverse=True)
    if dist is None:
        return Summary(
            _began_text(_began_code(rank, began)),
            recorded_attempt,
            unsent,
            rank if unsent else None,
            send_error,
            len(in_flight),
            tuple(keys),
        )
    world = int(dist.get_world_size())
    total_unsent, waited = all_reduce_ints(dist, [unsent, len(in_flight)], "sum")
    first_began, first_unsent = all_reduce_ints(
        dist, [_began_code(rank, began), rank if unsent else world], "min"
    )
    (recorded,) = all_reduce_ints(
        dist, [-1 if recorded_attempt is None else recorded_attempt], "max"
    )
    error = None
    if total_unsent:
        note = (send_error or "").encode()[:NOTE_BYTES] if rank == first_unsent else None
        error = _broadcast_note(dist, note, first_unsent) or None
    return Summary(
        _began_text(first_began),
        None if recorded < 0 else recorded,
        total_unsent,
        first_unsent if total_unsent else None,
        error,
        waited,
        _slots(dist, keys) if waited else (),
    )


def _slots(dist: Any, keys: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The newest :data:`SLOTS` (step, attempt) pairs of every rank's, by rounds of MAX."""
    found: list[tuple[int, int]] = []
    while len(found) < SLOTS:
        below = [k for k in keys if not found or k < found[-1]]
        (step,) = all_reduce_ints(dist, [max((s for s, _ in below), default=-1)], "max")
        if step < 0:
            break
        (attempt,) = all_reduce_ints(
            dist, [max((a for s, a in below if s == step), default=-1)], "max"
        )
        found.append((step, attempt))
    return tuple(found)


def _broadcast_note(dist: Any, note: bytes | None, src: int) -> str:
    import torch

    buffer = torch.zeros(NOTE_BYTES, dtype=torch.uint8, device=collective_device(dist))
    if note:
        buffer[: len(note)] = torch.frombuffer(bytearray(note), dtype=torch.uint8)
    dist.broadcast(buffer, src=src)
    # An error's text holds no NUL: the padding is what follows it.
    return bytes(buffer.cpu().tolist()).rstrip(b"\0").decode(errors="replace")


def broadcast_bytes(dist: Any, data: bytes | None, *, src: int = 0) -> bytes:
    """``data`` from ``src`` on every rank: a one-int64 length header, then one uint8 tensor."""
    import torch

    device = collective_device(dist)
    header = torch.tensor([0 if data is None else len(data)], dtype=torch.int64, device=device)
    dist.broadcast(header, src=src)
    size = int(header.item())
    if data is not None:
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        payload = torch.empty(size, dtype=torch.uint8, device=device)
    dist.broadcast(payload, src=src)
    return data if data is not None else payload.cpu().numpy().tobytes()


def ranges(missing: Sequence[int], limit: int = RANGES) -> list[tuple[int, int]]:
    """Sorted ranks as at most ``limit`` inclusive ranges, merged over the smallest gaps when
    there are more (pure)."""
    runs: list[list[int]] = []
    for rank in sorted(set(missing)):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    while len(runs) > limit:
        gap = min(range(len(runs) - 1), key=lambda i: runs[i + 1][0] - runs[i][1])
        runs[gap][1] = runs.pop(gap + 1)[1]
    return [(first, last) for first, last in runs]


# Rank 0's poll: per slot, the ranks whose report of it is not written (or all, while settling).
Poll = Callable[[], list[list[int]]]


def poll_rows(conn: Any, job_id: str, slots: Sequence[tuple[int, int]], dist: Any) -> Poll:
    """Rank 0's poll: per slot, the ranks whose report of it is not in the database (every rank
    of a step counted whole but not yet marked complete)."""
    world = int(dist.get_world_size())
    steps = sorted({step for step, _ in slots})

    def poll() -> list[list[int]]:
        written, settling = written_rows(conn, job_id, steps)
        return [
            list(range(world))
            if step in settling
            else [r for r in range(world) if written.get((step, r), -1) < attempt]
            for step, attempt in slots
        ]

    return poll


def wait_written(
    dist: Any,
    *,
    rank: int,
    slots: Sequence[tuple[int, int]],
    mine: Collection[tuple[int, int]],
    poll: Poll | None,
    deadline: float,
) -> tuple[int, InFlight | None]:
    """Rounds until no rank's accepted report of a slot is missing from the database, or the
    deadline (rank 0 polls; a collective: every rank calls it). Returns how many are missing
    and the first, as (step, attempt, rank)."""
    import torch

    device = collective_device(dist)
    world = int(dist.get_world_size())
    width = 1 + len(slots) * RANGES * 2
    while True:
        table = torch.full((width,), -1, dtype=torch.int64, device=device)
        if rank == 0:
            final = poll is None or time.monotonic() >= deadline
            try:
                missing = poll() if poll is not None else [[] for _ in slots]
            except Exception:  # the decision that follows fails on the same connection and says why
                missing, final = [[] for _ in slots], True
            table[0] = int(final)
            for i, ranks_missing in enumerate(missing):
                for j, (first, last) in enumerate(ranges(ranks_missing)):
                    at = 1 + (i * RANGES + j) * 2
                    table[at], table[at + 1] = first, last
        dist.broadcast(table, src=0)
        named = table.cpu().tolist()
        own = [_named(named, i, rank) and slot in mine for i, slot in enumerate(slots)]
        counts = all_reduce_ints(dist, [int(x) for x in own], "sum")
        if not sum(counts) or named[0]:
            break
        if rank == 0:
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
    if not sum(counts):
        return 0, None
    firsts = all_reduce_ints(dist, [rank if x else world for x in own], "min")
    step, attempt, who = min(
        (s, a, firsts[i]) for i, (s, a) in enumerate(slots) if counts[i] and firsts[i] < world
    )
    return sum(counts), (step, attempt, who)


def _named(table: Sequence[int], slot: int, rank: int) -> bool:
    for j in range(RANGES):
        at = 1 + (slot * RANGES + j) * 2
        if table[at] >= 0 and table[at] <= rank <= table[at + 1]:
            return True
    return False


def all_succeeded(dist: Any, *, rank: int, failed: bool) -> tuple[int, int] | None:
    """Whether every rank's step succeeded (a collective): None, or (how many failed, the first
    that failed): a SUM and a MIN of two integers instead of gathering every rank's error."""
    if dist is None:
        return (1, rank) if failed else None
    world = int(dist.get_world_size())
    (count,) = all_reduce_ints(dist, [int(failed)], "sum")
    if not count:
        return None
    (first,) = all_reduce_ints(dist, [rank if failed else world], "min")
    return count, first

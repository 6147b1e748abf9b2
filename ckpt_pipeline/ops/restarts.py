"""A job's restarts (``training_job_restarts``, migration 0017) and what preemption cost it.

What preemption cost (docs/DESIGN.md, "Restart records"): a restart *i* that resumed from a
checkpoint first reported at ``c_i`` and trained again at ``r_i`` (its record's time, taken once
the ranks restored) lost the wall time ``[c_i, r_i]``: the work after that checkpoint, redone, the
downtime before the relaunch, and the restart itself. One that started from scratch lost
``[start, r_i]``. With the job's wall time ``W`` from its first record (its first launch's, or its
first checkpoint) to its last (a checkpoint or a restart), the **effective training time ratio**
is ``1 - |union of the lost intervals| / W``: the share of wall time that made progress that was
kept, the figure large-scale training reports use (Llama 3's "effective training time").
Pure over the rows read here, so it is tested without a database.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

_RESTARTS = """
SELECT r.run_attempt, r.launch_id, r.world_size, r.resumed_step, r.resumed_run_attempt,
       r.skipped, r.skipped_total, r.waited_reports, r.unwritten_reports, r.unsent_reports,
       r.deadline_cut, r.decided_s, r.restored_s, r.fetched_bytes, r.max_node_fetched_bytes,
       r.nodes_fetched, r.source, r.newest_saved_step, r.loop_restarts, r.loop_after,
       r.restarted_at,
       (SELECT c.first_reported_at FROM training_checkpoints c
        WHERE c.job_id = r.job_id AND c.step = r.resumed_step) AS resumed_reported_at
FROM training_job_restarts r
WHERE r.job_id = %(job_id)s
ORDER BY r.restarted_at, r.run_attempt
"""
_SPAN = """
SELECT min(first_reported_at), max(first_reported_at) FROM training_checkpoints
WHERE job_id = %(job_id)s
"""


@dataclass(frozen=True)
class Restart:
    """One restart record, with the time its resumed checkpoint was first reported."""

    run_attempt: int
    launch_id: str
    world_size: int
    resumed_step: int | None
    resumed_run_attempt: int | None
    skipped: list[dict[str, Any]]
    skipped_total: int
    waited_reports: int
    unwritten_reports: int
    unsent_reports: int
    deadline_cut: bool
    decided_s: float
    restored_s: float | None
    fetched_bytes: int
    max_node_fetched_bytes: int
    nodes_fetched: int
    source: str | None
    newest_saved_step: int | None
    loop_restarts: int
    loop_after: int
    restarted_at: datetime
    resumed_reported_at: datetime | None

    @property
    def in_loop(self) -> bool:
        """The ``loop_after``-th restart or later in a row from one checkpoint."""
        return self.resumed_step is not None and self.loop_restarts + 1 >= self.loop_after

    @property
    def steps_lost(self) -> int | None:
        """Steps saved and not resumed from (the newest saved one - the one resumed from)."""
        if self.newest_saved_step is None:
            return None
        return max(0, self.newest_saved_step - (self.resumed_step or 0))

    def as_json(self) -> dict[str, Any]:
        value = {k: getattr(self, k) for k in self.__dataclass_fields__}
        value["restarted_at"] = self.restarted_at.isoformat()
        value["resumed_reported_at"] = (
            None if self.resumed_reported_at is None else self.resumed_reported_at.isoformat()
        )
        value["steps_lost"] = self.steps_lost
        value["in_loop"] = self.in_loop
        return value


@dataclass(frozen=True)
class Cost:
    """What the job's restarts cost: wall time, the part lost, the effective ratio."""

    restarts: int
    wall_s: float
    lost_s: float
    restarting_s: float
    steps_lost: int

    @property
    def effective_ratio(self) -> float | None:
        """1 - lost / wall (None without any wall time)."""
        if self.wall_s <= 0:
            return None
        return max(0.0, min(1.0, 1.0 - self.lost_s / self.wall_s))

    def as_json(self) -> dict[str, Any]:
        return {
            "restarts": self.restarts,
            "wall_s": round(self.wall_s, 3),
            "lost_s": round(self.lost_s, 3),
            "restarting_s": round(self.restarting_s, 3),
            "steps_lost": self.steps_lost,
            "effective_training_time_ratio": self.effective_ratio,
        }


def job_restarts(conn: Any, job_id: str) -> tuple[list[Restart], tuple[datetime, datetime] | None]:
    """The job's restarts, oldest first, and the span of its checkpoints' first reports."""
    rows = conn.execute(_RESTARTS, {"job_id": job_id}).fetchall()
    restarts = [Restart(*row) for row in rows]
    first, last = conn.execute(_SPAN, {"job_id": job_id}).fetchone() or (None, None)
    return restarts, (None if first is None or last is None else (first, last))


def cost(restarts: Sequence[Restart], span: tuple[datetime, datetime] | None) -> Cost:
    """What the restarts cost (the module docstring's formula), pure."""
    moments = [r.restarted_at for r in restarts] + (list(span) if span is not None else [])
    if not moments:
        return Cost(0, 0.0, 0.0, 0.0, 0)
    start, end = min(moments), max(moments)
    intervals = []
    for r in restarts:
        since = r.resumed_reported_at if r.resumed_step is not None else start
        if since is not None and r.restarted_at > since:
            intervals.append((since, r.restarted_at))
    lost = 0.0
    reach: datetime | None = None
    for begin, finish in sorted(intervals):
        if reach is not None and begin < reach:
            begin = reach
        if finish > begin:
            lost += (finish - begin).total_seconds()
            reach = finish if reach is None else max(reach, finish)
    # A job's first launch sends a record too (from scratch, at its start): not a restart.
    real = [r for r in restarts if r.resumed_step is not None or r.steps_lost]
    return Cost(
        restarts=len(real),
        wall_s=(end - start).total_seconds(),
        lost_s=lost,
        restarting_s=sum(r.restored_s or r.decided_s for r in restarts),
        steps_lost=sum(r.steps_lost or 0 for r in real),
    )

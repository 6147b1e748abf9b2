"""The restart's record (``ckpt.restart.v1``): built by rank 0 from its decision and from what
every rank tells it in fixed-size collectives (sums and maxima of a few integers, whatever the
number of ranks), then sent through the reporter like a report (docs/DESIGN.md, "Restart
records")."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ckpt_contract.restart import MAX_SKIPPED, RestartRecord
from trainer_client.config import ReporterConfig
from trainer_client.restart.decide import Decision
from trainer_client.restart.wire import all_reduce_ints


@dataclass(frozen=True)
class FetchTotals:
    """Bytes the ranks fetched from the store, summed and maxed, and how many ranks fetched."""

    total: int
    most: int
    fetchers: int


def fetch_totals(dist: Any, fetched_bytes: int) -> FetchTotals:
    """What the ranks fetched, over every rank (a collective: every rank calls it)."""
    total, fetchers = all_reduce_ints(dist, [fetched_bytes, 1 if fetched_bytes else 0], "sum")
    (most,) = all_reduce_ints(dist, [fetched_bytes], "max")
    return FetchTotals(total, most, fetchers)


def restart_record(
    cfg: ReporterConfig,
    decision: Decision,
    summary: Any,
    totals: FetchTotals,
    spooled_step: int | None,
    decided_s: float,
    restored_s: float,
    source: str | None,
    loop_after: int,
) -> RestartRecord:
    """Rank 0's record of this restart (``summary``: wire.Summary, every rank's state)."""
    launch = decision.launch
    assert launch is not None
    point = decision.point
    newest = [
        s
        for s in (
            spooled_step,
            decision.newest_step,
            None if decision.store_newer is None else decision.store_newer[0],
            None if point is None else point.step,
        )
        if s is not None
    ]
    return RestartRecord.model_validate(
        {
            "schema": "ckpt.restart.v1",
            "job_id": cfg.job_id,
            "run_attempt": launch.run_attempt,
            "launch_id": launch.launch_id,
            "world_size": cfg.world_size,
            "resumed_step": None if point is None else point.step,
            "resumed_run_attempt": None if point is None else point.run_attempt,
            "resumed_world_size": None if point is None else point.world_size,
            "skipped": list(decision.skipped[:MAX_SKIPPED]),
            "skipped_total": len(decision.skipped),
            "waited_reports": summary.waited,
            "unwritten_reports": decision.unwritten_reports,
            "unsent_reports": summary.unsent,
            "deadline_cut": bool(decision.unwritten),
            "decided_s": round(decided_s, 6),
            "restored_s": None if point is None else round(restored_s, 6),
            "fetched_bytes": totals.total,
            "max_node_fetched_bytes": totals.most,
            "nodes_fetched": totals.fetchers,
            "source": source,
            "newest_saved_step": max(newest, default=None),
            "loop_restarts": len(decision.same_step_restarts),
            "loop_after": loop_after,
            "created_at": datetime.now(UTC),
        },
        strict=False,
    )

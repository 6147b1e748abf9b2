"""The best complete checkpoint of a job by a metric, read from the pipeline's database.

A checkpoint's value of a metric is defined once, in the database (``ckpt_checkpoint_values``,
migration 0009), and read the same way by this helper, ``ckpt-pipeline checkpoints --best`` and
``ckpt-pipeline prune --keep-best``:

* ``loss`` is each shard's ``loss``; any other name is a key of each shard's ``metrics``;
* the value is the mean over the shard rows of the checkpoint's current (newest) attempt that
  carry the metric; shards without it are left out; a checkpoint none of whose shards carries it
  has no value and is never best;
* only complete checkpoints are ranked; ``mode="min"`` takes the smallest value, ``"max"`` the
  largest; equal values go to the newer step (it trained longer).

Then the storage check of ``latest_complete_checkpoint``
(:func:`trainer_client.restart.lookup.verified_point`): a best checkpoint whose files are
gone is skipped, with a warning, for the next best one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ckpt_contract.message import MAX_METRIC_NAME_CHARS, MODES, Mode, is_metric_name
from trainer_client.exceptions import ResumeError
from trainer_client.restart.lookup import (
    ResumePoint,
    first_verified,
    read_snapshot,
)
from trainer_client.restart.read_db import check_inputs, import_psycopg
from trainer_client.restart.shard_rows import (
    MANIFEST_CHUNKS,
    MANIFEST_COLUMNS,
    SHARD_AGGREGATES,
)
from trainer_client.restart.walk import Candidate, candidate, reads_manifests
from trainer_client.storage.verify import VERIFY_MAX_WORKERS, VerifyBy

# Ranked in the database among complete_checkpoints (the one definition of "complete", migration
# 0010); the direction is one of two fixed texts, never a caller's string.
_RANKED = """
SELECT v.step, v.run_attempt, v.value
FROM ckpt_checkpoint_values(%(job_id)s, %(metric)s) v
JOIN complete_checkpoints c
  ON c.job_id = %(job_id)s AND c.step = v.step AND c.run_attempt = v.run_attempt
ORDER BY v.value {direction}, v.step DESC
"""
_DIRECTION: dict[Mode, str] = {"min": "ASC", "max": "DESC"}

# One ranked checkpoint and its manifest's rows, or (a role that may not read the manifests)
# its shard rows aggregated: as the resume walk reads them (walk.py's _LATEST_COMPLETE and
# _LATEST_AGGREGATED; candidate() reads the shard rows where it has no manifest).
_ONE = """
WHERE c.job_id = %(job_id)s AND c.step = %(step)s AND c.run_attempt = %(run_attempt)s
"""
_SHARDS = (
    f"SELECT c.step, c.epoch, c.run_attempt, c.world_size, {MANIFEST_COLUMNS}"
    "\nFROM complete_checkpoints c" + MANIFEST_CHUNKS + _ONE
)
_SHARDS_AGGREGATED = (
    "SELECT c.step, c.epoch, c.run_attempt, c.world_size, a.*\nFROM complete_checkpoints c"
    + SHARD_AGGREGATES
    + _ONE
)


@dataclass(frozen=True)
class BestCheckpoint(ResumePoint):
    """A :class:`ResumePoint` with the metric it is best by and its value."""

    metric: str = field(kw_only=True)
    mode: Mode = field(kw_only=True)
    value: float = field(kw_only=True)


def _check_metric(metric: Any) -> str:
    """``metric`` if it can name a value (``loss`` or a metrics key of the contract)."""
    if not is_metric_name(metric):
        raise ResumeError(
            "metric",
            f"must be loss or a metrics key: 1-{MAX_METRIC_NAME_CHARS} printable characters",
        )
    return metric


def best_complete_checkpoint(
    job_id: str,
    *,
    metric: str = "loss",
    mode: Mode = "min",
    database_url: str,
    check_files: bool = True,
    deep: bool = False,
    s3_client: Any = None,
    max_workers: int = VERIFY_MAX_WORKERS,
    verify_by: VerifyBy = "listing",
) -> BestCheckpoint | None:
    """The job's best complete checkpoint by ``metric`` (module docstring), or None if no
    complete checkpoint has a value of it (or none whose objects are as reported).

    ``check_files``, ``deep``, ``s3_client``, ``max_workers``: as ``latest_complete_checkpoint``
    (raises ``VerifyError`` when the store cannot be asked)."""
    check_inputs(job_id, database_url)
    _check_metric(metric)
    if mode not in MODES:
        raise ResumeError("mode", "must be min or max")
    psycopg = import_psycopg()
    values: dict[tuple[int, int], float] = {}
    with read_snapshot(database_url) as conn:
        # One snapshot for the ranking and the shards (as the resume helper).
        try:
            ranked = conn.execute(
                _RANKED.format(direction=_DIRECTION[mode]), {"job_id": job_id, "metric": metric}
            ).fetchall()
        except psycopg.errors.UndefinedFunction:
            raise ResumeError(
                "database_url", "no checkpoint values function: run ckpt-pipeline migrate"
            ) from None

        def walk() -> Iterator[Candidate]:
            manifest = reads_manifests(conn)
            for step, attempt, value in ranked:
                values[(step, attempt)] = float(value)
                key = {"job_id": job_id, "step": step, "run_attempt": attempt}
                rows = conn.execute(_SHARDS if manifest else _SHARDS_AGGREGATED, key).fetchall()
                if rows:
                    yield candidate(conn, job_id, rows, manifest=manifest)

        found = first_verified(
            job_id,
            walk(),
            check_files=check_files,
            deep=deep,
            s3_client=s3_client,
            max_workers=max_workers,
            verify_by=verify_by,
        )
    if found is None:
        return None
    point = found.point
    value = values[(point.step, point.run_attempt)]
    return BestCheckpoint(**vars(point), metric=metric, mode=mode, value=value)

"""What the database must hold after a fault scenario, and the check that it holds exactly that.

The model is the contract's rule, written independently of the writer's SQL: per shard the
newest ``run_attempt`` wins; a checkpoint belongs to the newest attempt seen for its step, and is
complete when that attempt's shards number ``world_size``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import psycopg

from tests.lambda_writer.helpers import values_not_kept

ShardKey = tuple[str, int, int]
CheckpointKey = tuple[str, int]


@dataclass(frozen=True)
class SentReport:
    """One valid report a scenario put into the pipeline (its identity and what must be stored)."""

    job_id: str
    step: int
    rank: int
    run_attempt: int
    world_size: int
    uri: str

    @property
    def key(self) -> ShardKey:
        return (self.job_id, self.step, self.rank)


@dataclass(frozen=True)
class ExpectedShard:
    run_attempt: int
    uri: str


@dataclass(frozen=True)
class ExpectedCheckpoint:
    run_attempt: int
    world_size: int
    shards_present: int
    is_complete: bool


@dataclass(frozen=True)
class ExpectedState:
    """The exact contents of both tables."""

    shards: dict[ShardKey, ExpectedShard]
    checkpoints: dict[CheckpointKey, ExpectedCheckpoint]


def expected_state(reports: Iterable[SentReport]) -> ExpectedState:
    """The rows that ``reports`` (in any order, any number of times each) must leave behind."""
    newest: dict[ShardKey, SentReport] = {}
    for report in reports:
        held = newest.get(report.key)
        if held is not None and held.run_attempt == report.run_attempt and held != report:
            # Two bodies with one identity are a client bug (the first written stays); the
            # scenarios never send that, so the model refuses to guess.
            raise ValueError(f"conflicting reports for one identity: {held} vs {report}")
        if held is None or report.run_attempt > held.run_attempt:
            newest[report.key] = report
    by_checkpoint: dict[CheckpointKey, list[SentReport]] = {}
    for report in newest.values():
        by_checkpoint.setdefault((report.job_id, report.step), []).append(report)
    checkpoints: dict[CheckpointKey, ExpectedCheckpoint] = {}
    for key, reported in by_checkpoint.items():
        attempt = max(s.run_attempt for s in reported)
        current = [s for s in reported if s.run_attempt == attempt]
        world_size = max(s.world_size for s in current)
        checkpoints[key] = ExpectedCheckpoint(
            run_attempt=attempt,
            world_size=world_size,
            shards_present=len(current),
            is_complete=len(current) >= world_size,
        )
    shards = {k: ExpectedShard(r.run_attempt, r.uri) for k, r in newest.items()}
    return ExpectedState(shards=shards, checkpoints=checkpoints)


@dataclass
class DatabaseCheck:
    """What the tables held, compared with the model; ``problems`` empty means exact."""

    rows_expected: int
    rows_found: int
    duplicates: int
    checkpoints_expected: int
    checkpoints_found: int
    complete_found: int
    problems: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.problems


_MAX_LISTED = 8


def _differences(
    label: str, expected: dict[object, object], found: dict[object, object]
) -> list[str]:
    problems: list[str] = []
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    wrong = [k for k in expected if k in found and found[k] != expected[k]]
    if missing:
        problems.append(f"{len(missing)} {label} missing, e.g. {missing[:_MAX_LISTED]}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected {label}, e.g. {unexpected[:_MAX_LISTED]}")
    for key in wrong[:_MAX_LISTED]:
        problems.append(f"{label} {key}: expected {expected[key]}, found {found[key]}")
    if len(wrong) > _MAX_LISTED:
        problems.append(f"... {len(wrong) - _MAX_LISTED} more wrong {label}")
    return problems


def check_database(database_url: str, expected: ExpectedState) -> DatabaseCheck:
    """Read both tables whole (the test database holds only this scenario) and compare."""
    with psycopg.connect(database_url, application_name="ckpt-e2e-check") as conn:
        shard_rows = conn.execute(
            "SELECT job_id, step, rank, run_attempt, uri FROM training_checkpoint_shards"
        ).fetchall()
        checkpoint_rows = conn.execute(
            "SELECT job_id, step, run_attempt, world_size, shards_present, is_complete"
            " FROM training_checkpoint_progress"
        ).fetchall()
    # The primary keys make a second row per identity impossible; counted anyway, because
    # "exactly once" is the claim and a schema change must not silently drop the guarantee.
    shard_keys = [(r[0], int(r[1]), int(r[2])) for r in shard_rows]
    checkpoint_keys = [(r[0], int(r[1])) for r in checkpoint_rows]
    duplicates = (len(shard_keys) - len(set(shard_keys))) + (
        len(checkpoint_keys) - len(set(checkpoint_keys))
    )
    found_shards: dict[object, object] = {
        (r[0], int(r[1]), int(r[2])): ExpectedShard(int(r[3]), str(r[4])) for r in shard_rows
    }
    found_checkpoints: dict[object, object] = {
        (r[0], int(r[1])): ExpectedCheckpoint(int(r[2]), int(r[3]), int(r[4]), bool(r[5]))
        for r in checkpoint_rows
    }
    check = DatabaseCheck(
        rows_expected=len(expected.shards),
        rows_found=len(shard_rows),
        duplicates=duplicates,
        checkpoints_expected=len(expected.checkpoints),
        checkpoints_found=len(checkpoint_rows),
        complete_found=sum(1 for r in checkpoint_rows if r[5]),
    )
    if duplicates:
        check.problems.append(f"{duplicates} duplicate rows")
    wanted_shards: dict[object, object] = dict(expected.shards.items())
    wanted_checkpoints: dict[object, object] = dict(expected.checkpoints.items())
    check.problems += _differences("shard rows", wanted_shards, found_shards)
    check.problems += _differences("checkpoints", wanted_checkpoints, found_checkpoints)
    # The values the writer keeps per checkpoint (migration 0012) against its shard rows' sums.
    for job, step, attempt, kept, recounted in values_not_kept(database_url):
        check.problems.append(
            f"values of {job} step {step} attempt {attempt}: kept {kept},"
            f" the shard rows' {recounted}"
        )
    return check

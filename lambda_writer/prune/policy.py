"""What a retention policy removes from one job's checkpoints (pure: rows in, a plan out).

One definition for every reader: ``ckpt-pipeline prune``, the scheduled prune's Lambda
(``lambda_writer.prune.handler``) and the CDK context's rules (``ckpt_stack.context``).
The same function plans the dry run and, again under the checkpoints' locks, the apply
(``lambda_writer.prune.executor``), so what the dry run prints is what an unchanged database loses.

The rules (docs/DESIGN.md, "Retention: what a policy keeps"):

* Nothing is removed from a job with no complete checkpoint, and nothing newer than its latest
  complete checkpoint (in progress: it may still complete).
* Kept: the latest complete checkpoint; the resume target and the best checkpoint the helpers
  name (``latest_complete_checkpoint``/``best_complete_checkpoint``, which skip checkpoints whose
  files are gone, so they can be older than the database's); the ``keep_last`` newest complete;
  the ``keep_best`` best complete by ``metric``; complete checkpoints whose step is a multiple of
  ``keep_every``.
* Removed (only with ``keep_last``): every other checkpoint up to the latest complete one,
  complete or not (an incomplete one older than the latest complete was abandoned).
* With ``superseded``: the shard rows of attempts older than a kept checkpoint's current one
  (never counted; up to the latest complete checkpoint).

What is kept is decided by small policies composed (``lambda_writer.prune.preservation``):
:meth:`RetentionPolicy.preservation` builds them from the options, :func:`plan_job` removes the
rest.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ckpt_contract.message import (
    JOB_ID_PATTERN,
    MAX_METRIC_NAME_CHARS,
    MODES,
    Mode,
    is_metric_name,
)
from lambda_writer.prune.exceptions import PolicyError
from lambda_writer.prune.preservation import (
    AnyOf,
    BestN,
    EveryNSteps,
    InProgress,
    LatestComplete,
    LatestN,
    PreservationPolicy,
    Protected,
    kept_steps,
)
from lambda_writer.prune.records import CheckpointRow

# CheckpointRow: importable from here as before (its home is records.py).
__all__ = [
    "CheckpointRow",
    "JobPlan",
    "Removal",
    "RetentionPolicy",
    "check_job_id",
    "check_metric",
    "plan_job",
]


@dataclass(frozen=True)
class RetentionPolicy:
    """What to keep; validated on construction (errors name the option and the rule)."""

    keep_last: int | None = None
    keep_best: int = 0
    metric: str | None = None
    mode: Mode = "min"
    keep_every: int | None = None
    superseded: bool = False

    def __post_init__(self) -> None:
        if self.keep_last is not None and (
            not isinstance(self.keep_last, int) or self.keep_last < 1
        ):
            raise PolicyError("--keep-last", "must be at least 1 (the latest complete is kept)")
        if self.keep_last is None and not self.superseded:
            raise PolicyError(
                "--keep-last", "is required unless --superseded alone is pruned (give one or both)"
            )
        if not isinstance(self.keep_best, int) or self.keep_best < 0:
            raise PolicyError("--keep-best", "must be 0 or more")
        if self.keep_best and self.keep_last is None:
            raise PolicyError("--keep-best", "needs --keep-last (it protects checkpoints from it)")
        if self.keep_best and self.metric is None:
            raise PolicyError("--metric", "is required with --keep-best (loss or a metrics key)")
        if self.metric is not None:
            check_metric(self.metric)
            if not self.keep_best:
                raise PolicyError("--metric", "is only used with --keep-best K (K >= 1)")
        if self.mode not in MODES:
            raise PolicyError("--mode", "must be min or max")
        if self.keep_every is not None:
            if not isinstance(self.keep_every, int) or self.keep_every < 1:
                raise PolicyError("--keep-every", "must be at least 1 (a step interval)")
            if self.keep_last is None:
                raise PolicyError("--keep-every", "needs --keep-last (it protects checkpoints)")

    def preservation(self, protected: Mapping[int, str]) -> PreservationPolicy:
        """What this policy keeps, as one composition of small policies (``preservation``):
        always the latest complete checkpoint, ``protected`` and those in progress; with
        ``keep_last``, its newest, ``keep_best``'s best and ``keep_every``'s multiples too."""
        keep: list[PreservationPolicy] = [LatestComplete(), Protected(protected), InProgress()]
        if self.keep_last is not None:
            keep.append(LatestN(self.keep_last))
            if self.keep_best and self.metric is not None:
                keep.append(BestN(self.keep_best, self.metric, self.mode))
            if self.keep_every is not None:
                keep.append(EveryNSteps(self.keep_every))
        return AnyOf(tuple(keep))

    def to_json(self) -> str:
        """The policy as the scheduled prune's function reads it (``PRUNE_POLICY``)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> RetentionPolicy:
        """The policy :meth:`to_json` wrote; a PolicyError names what is wrong."""
        try:
            value = json.loads(text)
        except ValueError:
            raise PolicyError("policy", "must be a JSON object") from None
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(value, dict) or set(value) - names:
            raise PolicyError("policy", f"must be a JSON object with keys among {sorted(names)}")
        return cls(**value)


def check_metric(metric: str) -> str:
    """``metric`` if it can name a value (``loss`` or a metrics key), else a PolicyError."""
    if not is_metric_name(metric):
        raise PolicyError(
            "--metric",
            f"must be loss or a metrics key: 1-{MAX_METRIC_NAME_CHARS} printable characters",
        )
    return metric


def check_job_id(job_id: str) -> str:
    """``job_id`` if the contract allows it, else a PolicyError naming ``--job``."""
    if not isinstance(job_id, str) or not re.match(JOB_ID_PATTERN, job_id):
        raise PolicyError("--job", "must be 1-128 chars of [A-Za-z0-9._:-]")
    return job_id


@dataclass(frozen=True)
class Removal:
    """A checkpoint (or its superseded shard rows) to remove, as the plan saw it."""

    step: int
    run_attempt: int
    world_size: int
    is_complete: bool
    shard_rows: int
    value: float | None = None


@dataclass(frozen=True)
class JobPlan:
    """What the policy removes from one job, and why each kept checkpoint stays."""

    job_id: str
    latest_complete: int | None
    remove: tuple[Removal, ...]
    superseded: tuple[Removal, ...]
    kept: dict[int, tuple[str, ...]]

    @property
    def is_empty(self) -> bool:
        return not self.remove and not self.superseded


def plan_job(
    job_id: str,
    states: list[CheckpointRow],
    policy: RetentionPolicy,
    *,
    protected: dict[int, str] | None = None,
) -> JobPlan:
    """The plan for one job. ``protected``: steps kept whatever the policy says, with the reason
    (the resume target and the best checkpoint as the storage-verifying helpers name them)."""
    by_step = sorted(states, key=lambda s: s.step)
    complete = [s for s in by_step if s.is_complete]
    if not complete:
        return JobPlan(job_id, None, (), (), {})
    latest = complete[-1].step
    kept = kept_steps(policy.preservation(protected or {}), by_step)
    remove: list[Removal] = []
    if policy.keep_last is not None:
        remove = [_removal(s, s.shard_rows) for s in by_step if s.step not in kept]
    superseded: list[Removal] = []
    if policy.superseded:
        gone = {r.step for r in remove}
        superseded = [
            _removal(s, s.superseded_rows)
            for s in by_step
            if s.step not in gone and s.step <= latest and s.superseded_rows > 0
        ]
    return JobPlan(
        job_id,
        latest,
        tuple(remove),
        tuple(superseded),
        dict(sorted(kept.items())),
    )


def _removal(state: CheckpointRow, rows: int) -> Removal:
    return Removal(
        state.step,
        state.run_attempt,
        state.world_size,
        state.is_complete,
        rows,
        state.value,
    )

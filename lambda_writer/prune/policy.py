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
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass

from ckpt_contract.message import (
    JOB_ID_PATTERN,
    MAX_METRIC_NAME_CHARS,
    MODES,
    Mode,
    is_metric_name,
)
from lambda_writer.prune.exceptions import PolicyError


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
class CheckpointRow:
    """One checkpoint of a job as retention reads it (``training_checkpoints``, its shard counts
    and, with a metric, its value): what ``checkpoints`` lists and what the planner plans over.
    The planner reads neither ``epoch`` nor ``shards_present``."""

    step: int
    run_attempt: int
    world_size: int
    is_complete: bool
    shard_rows: int
    superseded_rows: int = 0
    value: float | None = None
    epoch: int = 0
    shards_present: int = 0


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


def ranked(states: list[CheckpointRow], mode: Mode) -> list[CheckpointRow]:
    """Complete checkpoints with a value, best first; ties go to the newer step."""
    valued = [s for s in states if s.is_complete and s.value is not None]
    sign = 1.0 if mode == "min" else -1.0
    return sorted(valued, key=lambda s: (sign * (s.value or 0.0), -s.step))


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
    kept: dict[int, list[str]] = {}

    def keep(step: int, reason: str) -> None:
        reasons = kept.setdefault(step, [])
        if reason not in reasons:
            reasons.append(reason)

    keep(latest, "latest complete")
    for step, reason in (protected or {}).items():
        keep(step, reason)
    for s in by_step:
        if s.step > latest:
            keep(s.step, "in progress")
    remove: list[Removal] = []
    if policy.keep_last is not None:
        for s in complete[-policy.keep_last :]:
            keep(s.step, "keep-last")
        if policy.keep_best and policy.metric is not None:
            for s in ranked(by_step, policy.mode)[: policy.keep_best]:
                keep(s.step, f"best {policy.metric}")
        if policy.keep_every is not None:
            for s in complete:
                if s.step % policy.keep_every == 0:
                    keep(s.step, "keep-every")
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
        {step: tuple(reasons) for step, reasons in sorted(kept.items())},
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

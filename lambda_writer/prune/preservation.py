"""Retention as small policies over one job's checkpoints: which to keep, and why.

Modelled on orbax's ``preservation_policy`` (``LatestN``, ``EveryNSteps``, ``BestN``,
``AnyPreservationPolicy``/``AllPreservationPolicy``): each policy reads one job's
:class:`~lambda_writer.prune.records.CheckpointRow` list, oldest step first, and names the steps
it keeps with the reason the plan shows. :func:`lambda_writer.prune.policy.plan_job` keeps what
the composition :meth:`RetentionPolicy.preservation
<lambda_writer.prune.policy.RetentionPolicy.preservation>` builds from the options keeps.

Pure: rows in, ``(step, reason)`` pairs out. Every leaf validates its own field on construction
(a ``PolicyError`` naming ``Policy.field`` and the rule); the options' own rules, named by the
option (``--keep-last``), are ``RetentionPolicy``'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ckpt_contract.message import MODES, Mode
from lambda_writer.prune.exceptions import PolicyError
from lambda_writer.prune.records import CheckpointRow

# What a policy keeps: the step and why, in the order the policy decided.
Kept = Iterator[tuple[int, str]]


class PreservationPolicy(Protocol):
    """Names the checkpoints of one job that it keeps, each with the reason."""

    def keeps(self, rows: Sequence[CheckpointRow]) -> Kept:
        """``(step, reason)`` for every checkpoint kept; ``rows`` are sorted by step."""
        ...


def kept_steps(
    policy: PreservationPolicy, rows: Sequence[CheckpointRow]
) -> dict[int, tuple[str, ...]]:
    """{step: its reasons, in the order given, each once} for what ``policy`` keeps."""
    kept: dict[int, list[str]] = {}
    for step, reason in policy.keeps(rows):
        reasons = kept.setdefault(step, [])
        if reason not in reasons:
            reasons.append(reason)
    return {step: tuple(reasons) for step, reasons in kept.items()}


def _complete(rows: Sequence[CheckpointRow]) -> list[CheckpointRow]:
    return [r for r in rows if r.is_complete]


def _at_least_one(policy: str, name: str, value: object) -> None:
    if not isinstance(value, int) or value < 1:
        raise PolicyError(f"{policy}.{name}", "must be an integer of at least 1")


@dataclass(frozen=True)
class LatestComplete:
    """The newest complete checkpoint: what a resume reads, never removed."""

    def keeps(self, rows: Sequence[CheckpointRow]) -> Kept:
        complete = _complete(rows)
        if complete:
            yield complete[-1].step, "latest complete"


@dataclass(frozen=True)
class InProgress:
    """Every checkpoint newer than the latest complete one: it may still complete."""

    def keeps(self, rows: Sequence[CheckpointRow]) -> Kept:
        complete = _complete(rows)
        if complete:
            latest = complete[-1].step
            yield from ((r.step, "in progress") for r in rows if r.step > latest)


@dataclass(frozen=True)
class Protected:
    """Steps kept whatever else decides, with their reasons (the resume target and the best
    checkpoint as the storage-verifying helpers name them)."""

    steps: Mapping[int, str] = field(default_factory=dict)

    def keeps(self, rows: Sequence[CheckpointRow]) -> Kept:
        yield from self.steps.items()


@dataclass(frozen=True)
class LatestN:
    """The ``n`` newest complete checkpoints (``--keep-last``)."""

    n: int
    reason: str = "keep-last"

    def __post_init__(self) -> None:
        _at_least_one("LatestN", "n", self.n)

    def keeps(self, rows: Sequence[CheckpointRow]) -> Kept:
        yield from ((r.step, self.reason) for r in _complete(rows)[-self.n :])


@dataclass(frozen=True)
class EveryNSteps:
    """Complete checkpoints whose step is a multiple of ``interval`` (``--keep-every``)."""

    interval: int
    reason: str = "keep-every"

    def __post_init__(self) -> None:
        _at_least_one("EveryNSteps", "interval", self.interval)

    def keeps(self, rows: Sequence[CheckpointRow]) -> Kept:
        yield from ((r.step, self.reason) for r in _complete(rows) if r.step % self.interval == 0)


@dataclass(frozen=True)
class BestN:
    """The ``n`` best complete checkpoints by their value of ``metric`` (``--keep-best``);
    rows without a value are never among them, ties go to the newer step."""

    n: int
    metric: str
    mode: Mode = "min"

    def __post_init__(self) -> None:
        _at_least_one("BestN", "n", self.n)
        if self.mode not in MODES:
            raise PolicyError("BestN.mode", "must be min or max")

    def keeps(self, rows: Sequence[CheckpointRow]) -> Kept:
        yield from ((r.step, f"best {self.metric}") for r in ranked(rows, self.mode)[: self.n])


def ranked(rows: Sequence[CheckpointRow], mode: Mode) -> list[CheckpointRow]:
    """Complete checkpoints with a value, best first; ties go to the newer step."""
    valued = [r for r in rows if r.is_complete and r.value is not None]
    sign = 1.0 if mode == "min" else -1.0
    return sorted(valued, key=lambda r: (sign * (r.value or 0.0), -r.step))


@dataclass(frozen=True)
class AnyOf:
    """Keeps what any of ``policies`` keeps, with every reason, in the policies' order."""

    policies: tuple[PreservationPolicy, ...]

    def keeps(self, rows: Sequence[CheckpointRow]) -> Kept:
        for policy in self.policies:
            yield from policy.keeps(rows)


@dataclass(frozen=True)
class AllOf:
    """Keeps what every one of ``policies`` keeps (none when empty); the reasons joined by
    `` and `` in the policies' order."""

    policies: tuple[PreservationPolicy, ...]

    def keeps(self, rows: Sequence[CheckpointRow]) -> Kept:
        if not self.policies:
            return
        each = [kept_steps(p, rows) for p in self.policies]
        for step in each[0]:
            if all(step in kept for kept in each[1:]):
                yield step, " and ".join(reason for kept in each for reason in kept[step])

"""Retention's small policies (pure): each alone, composed, and the options' composition deciding
exactly what the planner decided before it was built from them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lambda_writer.prune.exceptions import PolicyError
from lambda_writer.prune.policy import RetentionPolicy, plan_job
from lambda_writer.prune.preservation import (
    AllOf,
    AnyOf,
    BestN,
    EveryNSteps,
    InProgress,
    LatestComplete,
    LatestN,
    Protected,
    kept_steps,
    ranked,
)
from lambda_writer.prune.records import CheckpointRow


def cp(step: int, *, complete: bool = True, value: float | None = None) -> CheckpointRow:
    return CheckpointRow(step, 0, 2, complete, 2, 0, value)


ROWS = [
    cp(1, value=0.5),
    cp(2, complete=False),
    cp(3, value=0.1),
    cp(4, value=0.9),
    cp(6),
    cp(7, complete=False),
]


def test_each_leaf_keeps_its_checkpoints_with_its_reason() -> None:
    # GIVEN one job's rows, oldest first; WHEN each policy alone reads them; THEN it names these.
    assert kept_steps(LatestComplete(), ROWS) == {6: ("latest complete",)}
    assert kept_steps(InProgress(), ROWS) == {7: ("in progress",)}
    assert kept_steps(LatestN(2), ROWS) == {4: ("keep-last",), 6: ("keep-last",)}
    assert kept_steps(EveryNSteps(3), ROWS) == {3: ("keep-every",), 6: ("keep-every",)}
    assert kept_steps(BestN(1, "loss"), ROWS) == {3: ("best loss",)}
    assert kept_steps(BestN(1, "acc", "max"), ROWS) == {4: ("best acc",)}
    assert kept_steps(Protected({2: "resume target"}), ROWS) == {2: ("resume target",)}


def test_a_job_without_a_complete_checkpoint_keeps_nothing_by_recency() -> None:
    rows = [cp(1, complete=False), cp(2, complete=False)]
    for policy in (LatestComplete(), InProgress(), LatestN(3), EveryNSteps(1), BestN(1, "loss")):
        assert kept_steps(policy, rows) == {}


def test_any_of_is_the_union_with_every_reason_in_the_policies_order() -> None:
    policy = AnyOf((LatestN(1), EveryNSteps(2), LatestComplete()))
    assert kept_steps(policy, ROWS) == {
        6: ("keep-last", "keep-every", "latest complete"),
        4: ("keep-every",),
    }
    assert kept_steps(AnyOf(()), ROWS) == {}


def test_all_of_is_the_intersection_with_the_reasons_joined() -> None:
    policy = AllOf((LatestN(3), EveryNSteps(2)))
    assert kept_steps(policy, ROWS) == {
        4: ("keep-last and keep-every",),
        6: ("keep-last and keep-every",),
    }
    assert kept_steps(AllOf(()), ROWS) == {}
    # Nested: what the best two by loss and the newest three share, or the latest complete.
    nested = AnyOf((AllOf((BestN(2, "loss"), LatestN(3))), LatestComplete()))
    assert set(kept_steps(nested, ROWS)) == {3, 6}


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: LatestN(0), "LatestN.n"),
        (lambda: EveryNSteps(0), "EveryNSteps.interval"),
        (lambda: BestN(0, "loss"), "BestN.n"),
        (lambda: BestN(1, "loss", "median"), "BestN.mode"),  # type: ignore[arg-type]
    ],
)
def test_a_leaf_refuses_a_bad_field_naming_it_and_the_rule(build: object, name: str) -> None:
    with pytest.raises(PolicyError) as caught:
        build()  # type: ignore[operator]
    assert caught.value.name == name and caught.value.rule


def test_the_options_build_the_composition_they_name() -> None:
    policy = RetentionPolicy(keep_last=2, keep_best=1, metric="loss", mode="max", keep_every=5)
    assert policy.preservation({9: "resume target"}) == AnyOf(
        (
            LatestComplete(),
            Protected({9: "resume target"}),
            InProgress(),
            LatestN(2),
            BestN(1, "loss", "max"),
            EveryNSteps(5),
        )
    )
    # Superseded rows alone: nothing removed, so only what is never removed is named.
    only = RetentionPolicy(superseded=True).preservation({})
    assert only == AnyOf((LatestComplete(), Protected({}), InProgress()))


# --- The composition decides what the planner decided before it (its code, kept here) ----------
def _planner_before(
    states: list[CheckpointRow], policy: RetentionPolicy, protected: dict[int, str]
) -> tuple[list[int], dict[int, tuple[str, ...]]]:
    """plan_job's removals and reasons as written before the policies (commit 936383e)."""
    by_step = sorted(states, key=lambda s: s.step)
    complete = [s for s in by_step if s.is_complete]
    if not complete:
        return [], {}
    latest = complete[-1].step
    kept: dict[int, list[str]] = {}

    def keep(step: int, reason: str) -> None:
        reasons = kept.setdefault(step, [])
        if reason not in reasons:
            reasons.append(reason)

    keep(latest, "latest complete")
    for step, reason in protected.items():
        keep(step, reason)
    for s in by_step:
        if s.step > latest:
            keep(s.step, "in progress")
    remove: list[int] = []
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
        remove = [s.step for s in by_step if s.step not in kept]
    return remove, {step: tuple(r) for step, r in sorted(kept.items())}


_rows = st.lists(
    st.builds(
        cp,
        st.integers(0, 40),
        complete=st.booleans(),
        value=st.none() | st.sampled_from([0.1, 0.5, 0.5, 2.0]),
    ),
    max_size=14,
    unique_by=lambda r: r.step,
)


@st.composite
def _policies(draw: st.DrawFn) -> RetentionPolicy:
    keep_last = draw(st.none() | st.integers(1, 5))
    superseded = keep_last is None or draw(st.booleans())
    if keep_last is None:
        return RetentionPolicy(superseded=superseded)
    keep_best = draw(st.integers(0, 3))
    return RetentionPolicy(
        keep_last=keep_last,
        keep_best=keep_best,
        metric="loss" if keep_best else None,
        mode=draw(st.sampled_from(["min", "max"])),
        keep_every=draw(st.none() | st.integers(1, 6)),
        superseded=superseded,
    )


@given(
    _rows,
    _policies(),
    st.dictionaries(st.integers(0, 45), st.sampled_from(["resume target", "best loss"])),
)
def test_the_options_composition_decides_as_the_planner_did(
    rows: list[CheckpointRow], policy: RetentionPolicy, protected: dict[int, str]
) -> None:
    plan = plan_job("j", rows, policy, protected=protected)
    remove, kept = _planner_before(rows, policy, protected)
    assert [r.step for r in plan.remove] == remove
    assert plan.kept == kept

"""bench.capacity's drains on the real server: every layout leaves the rows it must, and the CPU
it reports is CPU that was spent (a tiny checkpoint: not a measurement)."""

from __future__ import annotations

import pytest

from bench import capacity
from bench._cpu import machine_cpu_s
from tests.conftest import ADMIN_URL


@pytest.mark.slow
def test_every_layout_writes_the_checkpoint_and_pays_the_round_trip() -> None:
    # GIVEN checkpoints of 30 and 60 ranks WHEN drained with a 2 ms simulated round trip
    cases = capacity.measure_all(ADMIN_URL, [30, 60], 1, rtt_ms=2.0)
    # THEN each N has its three drains, each verified by measure_drain itself
    assert [c.ranks for c in cases] == [30, 60]
    for case, batches in zip(cases, (3, 6), strict=True):
        assert (case.one.writers, case.shared.writers, case.disjoint.writers) == (1, 2, 2)
        assert len(case.paired) == 1
        assert case.relative == case.disjoint.seconds / case.shared.seconds
        for d in (case.one, case.shared, case.disjoint):
            # AND every batch took at least the round trip (a sleep never ends early)
            assert len(d.batch_ms) == batches and min(d.batch_ms) >= 2.0
            assert d.client_cpu_s > 0 and d.backend_cpu_s > 0
            assert d.machine_busy_s >= 0 and d.machine_steal_s >= 0
    # AND the verdicts print
    assert capacity.verdicts(cases) in (True, False)


def test_machine_cpu_counters_only_grow() -> None:
    busy0, steal0 = machine_cpu_s()
    sum(i * i for i in range(300_000))
    busy1, steal1 = machine_cpu_s()
    assert busy1 >= busy0 and steal1 >= steal0

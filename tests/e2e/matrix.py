"""The fault matrix's rows, collected over the session and printed as one Markdown table."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from tests.e2e.oracle import DatabaseCheck

# The key of a row in a test report's user_properties.
PROPERTY = "fault_matrix_row"

COLUMNS = (
    "scenario",
    "reports sent",
    "rows expected",
    "rows found",
    "duplicates",
    "in DLQ",
    "replayed",
    "DB exact",
)


@dataclass(frozen=True)
class FaultRow:
    """One scenario's figures; ``figures`` are the scenario-specific extras (kills, seed, …)."""

    scenario: str
    reports_sent: int
    rows_expected: int
    rows_found: int
    duplicates: int
    in_dlq: int
    replayed: int
    exact: bool
    figures: dict[str, object] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        scenario: str,
        *,
        reports_sent: int,
        check: DatabaseCheck,
        in_dlq: int = 0,
        replayed: int = 0,
        **figures: object,
    ) -> FaultRow:
        return cls(
            scenario=scenario,
            reports_sent=reports_sent,
            rows_expected=check.rows_expected,
            rows_found=check.rows_found,
            duplicates=check.duplicates,
            in_dlq=in_dlq,
            replayed=replayed,
            exact=check.exact,
            figures=figures,
        )

    def to_dict(self) -> dict[str, object]:
        """Plain values only (the figures as their text): a test report carries it from an
        xdist worker to the run's controller, which prints the table."""
        return {
            **{k: v for k, v in vars(self).items() if k != "figures"},
            "figures": {k: str(v) for k, v in self.figures.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FaultRow:
        return cls(**data)

    def cells(self) -> list[str]:
        return [
            self.scenario,
            str(self.reports_sent),
            str(self.rows_expected),
            str(self.rows_found),
            str(self.duplicates),
            str(self.in_dlq),
            str(self.replayed),
            "yes" if self.exact else "NO",
        ]

    def figures_line(self) -> str:
        extras = ", ".join(f"{k}={v}" for k, v in self.figures.items())
        return f"{self.scenario}: {extras}" if extras else self.scenario


def _scenario_key(scenario: str) -> tuple[int, str]:
    label = scenario.split(" ", 1)[0]
    digits = "".join(ch for ch in label if ch.isdigit())
    return (int(digits) if digits else 1_000_000, scenario)


class FaultMatrix:
    """Rows recorded by the scenarios (thread-safe: scenarios may record from helper threads).

    A test's matrix also puts each row into its report's ``user_properties`` (``sink``), under
    :data:`PROPERTY`: the controller's matrix collects them from the reports, whichever process
    (xdist worker) ran the test.
    """

    def __init__(self, sink: list[tuple[str, object]] | None = None) -> None:
        self._lock = threading.Lock()
        self._rows: list[FaultRow] = []
        self._sink = sink

    def record(self, row: FaultRow) -> FaultRow:
        """Add ``row`` and print its figures (shown with ``-s`` or on failure)."""
        with self._lock:
            self._rows.append(row)
            if self._sink is not None:
                self._sink.append((PROPERTY, row.to_dict()))
        print(f"fault matrix | {' | '.join(row.cells())}")
        print(f"  figures: {row.figures_line()}")
        return row

    def record_quietly(self, row: FaultRow) -> None:
        """Add ``row`` without printing it (the controller, collecting the workers' rows)."""
        with self._lock:
            self._rows.append(row)

    @property
    def rows(self) -> list[FaultRow]:
        """The rows in scenario order ("1 …", "2a …", …), whatever order the tests ran in."""
        with self._lock:
            return sorted(self._rows, key=lambda r: _scenario_key(r.scenario))

    def table(self) -> str:
        """The rows as a Markdown table, in scenario order."""
        rows = [list(COLUMNS), *(r.cells() for r in self.rows)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]

        def line(cells: list[str]) -> str:
            return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

        rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        return "\n".join([line(rows[0]), rule, *(line(r) for r in rows[1:])])

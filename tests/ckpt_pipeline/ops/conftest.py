"""Operator-tool fixtures: the local pipeline of the end-to-end suite (for reconcile's backfill)."""

from __future__ import annotations

from tests.e2e.conftest import pipeline_factory

__all__ = ["pipeline_factory"]

"""A logger adapter that puts the job and rank in every line."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any


class JobRankAdapter(logging.LoggerAdapter[logging.Logger]):
    """Prefixes ``[job=… rank=…]`` and adds ``job_id``/``rank`` as record attributes."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        """Add the job/rank prefix; keeps %-style arguments lazy."""
        extra = dict(self.extra or {})
        kwargs["extra"] = {**extra, **kwargs.get("extra", {})}
        return f"[job={extra.get('job_id')} rank={extra.get('rank')}] {msg}", kwargs


def adapter(name: str, job_id: str, rank: int) -> JobRankAdapter:
    """The adapter for one reporter's module logger."""
    return JobRankAdapter(logging.getLogger(name), {"job_id": job_id, "rank": rank})

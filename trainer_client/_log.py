"""A logger adapter that puts the job and rank in every line."""

from __future__ import annotations

import logging
import sys
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


def _handled(logger: logging.Logger, level: int) -> bool:
    """Whether a handler other than a NullHandler would emit ``level`` from ``logger``."""
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if not isinstance(handler, logging.NullHandler) and level >= handler.level:
                return True
        if not current.propagate:
            return False
        current = current.parent
    return False


def warn_visibly(
    log: logging.LoggerAdapter[logging.Logger] | logging.Logger, msg: str, *args: Any
) -> None:
    """Log a warning the user must see; with logging unconfigured, also write it to stderr.

    The library's loggers carry only a NullHandler (the caller configures logging), which also
    keeps Python's last-resort handler away: a warning that reports are left unsent would reach
    nobody. A logger the user silenced (its level above WARNING) stays silent. ``log`` is a
    module's logger or its job/rank adapter (whose prefix the line keeps).
    """
    log.warning(msg, *args)
    logger = log.logger if isinstance(log, logging.LoggerAdapter) else log
    if logger.isEnabledFor(logging.WARNING) and not _handled(logger, logging.WARNING):
        text = msg % args if args else msg
        if isinstance(log, logging.LoggerAdapter):
            text, _ = log.process(text, {})
        sys.stderr.write(f"WARNING trainer_client: {text}\n")


def say(log: logging.Logger, level: int, msg: str, *args: Any) -> None:
    """Log a line the user must see (a restart's decision, its warnings); with logging
    unconfigured, also write it to stderr, as torchrun prints its rendezvous block.

    A logger the user silenced below ``level`` stays silent; a configured handler gets the
    record once, with no second copy on stderr.
    """
    log.log(level, msg, *args)
    if _not_silenced(log, level) and not _handled(log, level):
        sys.stderr.write(f"ckpt-pipeline: {msg % args}\n")
        sys.stderr.flush()


def _not_silenced(logger: logging.Logger, level: int) -> bool:
    """Whether the user left ``level`` on for ``logger``: the nearest level set on it or a parent
    below the root decides (the root's default WARNING is not a choice the user made)."""
    current: logging.Logger | None = logger
    while current is not None and current.parent is not None:
        if current.level != logging.NOTSET:
            return level >= current.level
        current = current.parent
    return True

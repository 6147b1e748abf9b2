"""The disk gate: the sender thread steps aside while a ``report()`` is in progress.

``report()`` spends most of its time in ``os.fsync``, which releases the GIL. A sender thread
that takes the GIL then (botocore's pure-Python request building, signing, response parsing:
~2.8 ms of CPU per single-entry send) keeps it until its next blocking call or until CPython's
switch interval (5 ms) forces a hand-over, and on a loaded machine the holder may itself be
descheduled meanwhile: ``report()`` returns from the disk and then waits for the sender.

So ``report()`` closes the gate for its whole duration, and the sender checks it at
checkpoints: its own loop, and botocore's events on the SQS client (before-call,
request-created, before-sign, before-send, before-parse, needs-retry, after-call, ...). At a
closed gate the sender waits on a condition, which releases the GIL, so when ``fsync`` returns
the GIL is free. The most ``report()`` can still lose is what is left of one stretch between two
checkpoints, if the sender was in it when the disk call began.

``report()`` never waits for the sender: it only counts itself in and out under a lock that the
sender holds for a few bytecodes at a time (never across I/O or a wait), and the sender waits at
most ``max_wait_s`` per checkpoint, so reports back to back cannot starve it for long.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# Default bound on one wait at a checkpoint: far above one report()'s disk time on a local
# disk (~0.2-5 ms), short beside the pipeline's lag budget; with reports back to back the
# sender still passes a checkpoint at least this often.
DEFAULT_MAX_WAIT_S = 0.05
# While reports come back to back, how often a checkpoint looks again (sleeping in between).
_BACK_TO_BACK_POLL_S = 0.005

# botocore events of one SQS call, in the order they are emitted (provide-client-params,
# before-parameter-build, before-endpoint-resolution, before-call, request-created,
# choose-signer, before-sign, before-send, [HTTP], before-parse, response-received,
# needs-retry, after-call): checkpoints between the CPU-heavy stretches. Handlers that return
# None leave botocore's first_non_none_response logic untouched.
CHECKPOINT_EVENTS = (
    "provide-client-params.sqs",
    "before-endpoint-resolution.sqs",
    "before-call.sqs",
    "request-created.sqs",
    "before-sign.sqs",
    "before-send.sqs",
    "before-parse.sqs",
    "response-received.sqs",
    "needs-retry.sqs",
    "after-call.sqs",
)


class DiskGate:
    """Closed while a ``report()`` is in progress; the sender waits at checkpoints while closed."""

    def __init__(self, *, max_wait_s: float = DEFAULT_MAX_WAIT_S) -> None:
        self.max_wait_s = max_wait_s
        self._cond = threading.Condition(threading.Lock())
        # report() calls in progress (several threads may report at once). Written under _cond;
        # the sender's fast path reads it without the lock (an int read is atomic).
        self._inside = 0
        self._parked = 0

    @contextmanager
    def closed(self) -> Iterator[None]:
        """Hold the gate closed for a ``report()``: validation, write and fsync."""
        with self._cond:
            self._inside += 1
        try:
            yield
        finally:
            with self._cond:
                self._inside -= 1
                if not self._inside and self._parked:
                    self._cond.notify_all()

    @property
    def is_closed(self) -> bool:
        """True while some ``report()`` is in progress."""
        return self._inside > 0

    @property
    def parked(self) -> int:
        """Threads waiting at a checkpoint right now."""
        return self._parked

    def checkpoint(self) -> None:
        """Wait (GIL released) while the gate is closed, at most ``max_wait_s``."""
        if not self._inside:
            return
        deadline = time.monotonic() + self.max_wait_s
        with self._cond:
            self._parked += 1
        try:
            with self._cond:
                if self._inside:  # checked under the lock: an opening in between is not lost
                    # Woken by the report() that opens the gate (or by the bound).
                    self._cond.wait(self.max_wait_s)
            # Woken, yet a report() is in again: reports are coming back to back. Being woken
            # by each of them would make this thread take the GIL at the next report's write
            # only to park again (a bench A/B: burst p99 0.5-0.9 ms this way, 0.6-2.4 ms woken
            # each time), so look only every few ms until the bound.
            while self._inside:
                rest = deadline - time.monotonic()
                if rest <= 0:
                    return
                time.sleep(min(rest, _BACK_TO_BACK_POLL_S))
        finally:
            with self._cond:
                self._parked -= 1


_local = threading.local()


def bind_to_current_thread(gate: DiskGate) -> None:
    """Make ``gate`` the one this thread's botocore checkpoints honour (the sender's thread)."""
    _local.gate = gate


def _checkpoint(**_: Any) -> None:
    # One handler per event for every reporter sharing a client: each sender thread honours
    # only its own gate, and any other thread calling the client passes straight through.
    gate: DiskGate | None = getattr(_local, "gate", None)
    if gate is not None:
        gate.checkpoint()


def install_checkpoints(client: Any) -> bool:
    """Register the checkpoints on a botocore client's events; False if it has none (a fake)."""
    events = getattr(getattr(client, "meta", None), "events", None)
    if events is None or not hasattr(events, "register_first"):
        return False
    for event in CHECKPOINT_EVENTS:
        # unique_id: a client shared by several reporters gets each handler once.
        events.register_first(event, _checkpoint, unique_id=f"trainer_client.gate:{event}")
    return True

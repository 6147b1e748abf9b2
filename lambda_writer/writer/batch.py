"""One batch of SQS records → poison to the DLQ, valid reports to PostgreSQL, failures to retry.

Failure rules (FIFO):

* Poison (undecodable, invalid, unknown schema) is sent to the DLQ and acknowledged. If that send
  fails, or no ``DLQ_URL`` is configured, it is reported as a failure (logged at ERROR) and
  reaches the DLQ through the queue's maxReceiveCount — never dropped.
* A ``ckpt.pack.v1`` message (a node's reports in one message) is expanded into its reports,
  each classified on its own as ``<messageId>#<index>``: a bad member is parked by itself and its
  neighbours are written; the message is reported failed only when one of its reports is neither
  written nor parked.
* A failed record blocks the later records of its message group in the batch: they are reported
  as unprocessed, so order within a group is kept (AWS: for FIFO, stop at the first failure and
  return all failed and unprocessed messages; Powertools' ``skip_group_on_error`` does the same
  per group). Other groups proceed.
* Transient database failure (the typed :class:`TransientWriteError`): the transaction rolled
  back, so every record of the write is reported. A reused connection found broken (the proxy's
  idle client timeout, a failover, a terminated backend) is re-opened and the batch retried once.
* Permanent database rejection (:class:`PermanentWriteError`: a constraint or data error a
  validated report can still hit, e.g. a run_attempt beyond int4): the batch is retried one record
  per transaction — no savepoints, so nothing new to reason about for the proxy — and each record
  the database refuses is sent to the DLQ as poison.
* A job belongs to the principal of its first report's SenderId (migration 0015, checked in the
  batch's own transaction): a report of it from another principal is such a refusal
  (``ForeignSender``, "foreign sender: …" naming the job and both principals), isolated and
  parked like any other. A replay is judged by the original sender its envelope carries when,
  and only when, the replay principal sent it (:func:`~lambda_writer.writer.records.sent_by`).
  In the stricter mode (``JOB_PREFIXES``) a report whose job id is outside its principal's
  prefixes is poison of the same class, before any write.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import psycopg

from lambda_writer.shared.connection import Connection, ConnectionHolder, redact
from lambda_writer.shared.exceptions import TransientWriteError
from lambda_writer.shared.settings import WriterSettings
from lambda_writer.writer.exceptions import PermanentWriteError
from lambda_writer.writer.planning import plan_batch
from lambda_writer.writer.records import (
    Poison,
    SqsMessage,
    ValidReport,
    ValidRestart,
    expand,
    poison_from,
    sent_by,
    within_prefixes,
)
from lambda_writer.writer.repository import (
    LAUNCH_CONFLICT,
    RecordFate,
    WriteOutcome,
    record_fates,
    write_batch,
)

if TYPE_CHECKING:
    # Imported when poison is first seen (_dead_letter): a batch of valid reports never needs
    # the DLQ's entry building, and the handler's import test keeps it out of the import.
    from lambda_writer.writer.dlq import DeadLetterQueue

_log = logging.getLogger(__name__)

# A record that changed no shard row: its row already holds the same or a newer run_attempt
# (SQS redelivery, a re-send after the dedup window, a late spool, a replay of the DLQ).
_UNCHANGED = "record unchanged: its shard row already holds this or a newer attempt"


class LogSink(Protocol):
    """What the writer logs to: a ``logging.Logger`` or Powertools' ``Logger`` (JSON)."""

    def info(self, msg: object, *args: object, extra: Mapping[str, object] | None = ...) -> None:
        """Log at INFO."""

    def warning(self, msg: object, *args: object, extra: Mapping[str, object] | None = ...) -> None:
        """Log at WARNING."""

    def error(self, msg: object, *args: object, extra: Mapping[str, object] | None = ...) -> None:
        """Log at ERROR."""


@dataclass
class BatchResult:
    """What happened to one batch; ``failed`` holds the messageIds to retry, in delivery order."""

    failed: list[str] = field(default_factory=list)
    written: int = 0
    rows_changed: int = 0
    noop_replays: int = 0
    poison: int = 0
    poison_unsent: int = 0
    transient_failures: int = 0
    # Restart records written (ckpt.restart.v1), those of a restart loop, and the slowest
    # restart's seconds to training again (the metrics the stack's dashboard and alarm read).
    restarts: int = 0
    restart_loops: int = 0
    restart_seconds: float | None = None

    def batch_response(self) -> dict[str, list[dict[str, str]]]:
        """The partial batch response (ReportBatchItemFailures) Lambda expects for this batch."""
        return {"batchItemFailures": [{"itemIdentifier": mid} for mid in self.failed]}

    def add(self, outcome: WriteOutcome) -> None:
        self.written += outcome.records
        self.rows_changed += outcome.shard_rows_changed
        self.noop_replays += outcome.noop_replays


class CheckpointWriter:
    """The execution environment's writer: its one DB connection and its DLQ sender."""

    def __init__(
        self,
        settings: WriterSettings,
        *,
        connection: ConnectionHolder | None = None,
        dlq: DeadLetterQueue | None = None,
        logger: LogSink | None = None,
    ) -> None:
        self.settings = settings
        self.connection = connection or ConnectionHolder(settings)
        self._dlq = dlq
        self._log: LogSink = logger or _log

    def process(self, messages: Sequence[SqsMessage]) -> BatchResult:
        """Handle one batch; never raises for a record-level or database failure."""
        result = BatchResult()
        # A pack's members are reports of their own ("<messageId>#<i>"); the partial batch
        # response names the message, failed when any of its reports is neither written nor
        # parked (its retry rewrites the others idempotently).
        owner: dict[str, str] = {}
        classified: list[ValidReport | ValidRestart | Poison] = []
        replay_principal = self.settings.replay_principal_id
        prefixes = self.settings.job_prefixes
        for m in messages:
            judged = sent_by(m, replay_principal)
            for item in [judged] if isinstance(judged, Poison) else expand(judged):
                owner[item.message.message_id] = m.message_id
                if prefixes is not None and isinstance(item, ValidReport | ValidRestart):
                    item = within_prefixes(item, prefixes)
                classified.append(item)
        poisons = [c for c in classified if isinstance(c, Poison)]
        failed = self._dead_letter(poisons, result)

        blocked: set[str] = set()
        to_write: list[ValidReport] = []
        restarts: list[ValidRestart] = []
        for item in classified:
            msg = item.message
            if msg.message_id in failed:
                blocked.add(msg.group_id)
            elif isinstance(item, ValidReport | ValidRestart):
                if msg.group_id in blocked:
                    failed.add(msg.message_id)
                elif isinstance(item, ValidReport):
                    to_write.append(item)
                else:
                    restarts.append(item)

        try:
            outcome = self._write(to_write)
            result.add(outcome)
            self._log_outcome(to_write, outcome)
        except TransientWriteError as exc:
            self._log.warning(
                "batch not written, all its records will be retried: %s",
                exc,
                extra={"records": len(to_write)},
            )
            result.transient_failures += len(to_write)
            failed.update(v.message.message_id for v in to_write)
        except PermanentWriteError as exc:
            self._log.warning("batch refused by the database, isolating records: %s", exc)
            failed |= self._isolate(to_write, result)

        failed |= self._write_restarts(restarts, result)
        failed_messages = {owner.get(mid, mid) for mid in failed}
        result.failed = [m.message_id for m in messages if m.message_id in failed_messages]
        return result

    def _write(self, reports: Sequence[ValidReport]) -> WriteOutcome:
        plan = plan_batch(reports)
        if not plan.shards:
            return WriteOutcome(0, 0, 0)
        if plan.launch_conflict:
            raise PermanentWriteError(
                LAUNCH_CONFLICT, "two launches report one run_attempt in this batch"
            )
        conn, reused = self._connect()
        try:
            return write_batch(conn, plan)
        except TransientWriteError:
            if not (conn.broken or conn.closed):
                raise  # e.g. a statement timeout: the connection itself is fine
            self.connection.discard()
            if not reused:
                raise
            # A connection that idled in a warm environment was closed under us; that says
            # nothing about the database, so retry once on a fresh one.
            self._log.info("reused connection was broken; reconnecting once")
            conn, _ = self._connect()
            try:
                return write_batch(conn, plan)
            except TransientWriteError:
                if conn.broken or conn.closed:
                    self.connection.discard()
                raise

    def _write_restarts(self, restarts: Sequence[ValidRestart], result: BatchResult) -> set[str]:
        """Write the batch's restart records (their own groups, rare); the messageIds to retry."""
        if not restarts:
            return set()
        from lambda_writer.writer.restarts import write_restarts

        try:
            conn, _ = self._connect()
            write_restarts(conn, restarts)
        except TransientWriteError as exc:
            self._log.warning("restart records not written, retrying them: %s", exc)
            result.transient_failures += len(restarts)
            return {r.message.message_id for r in restarts}
        except PermanentWriteError:
            failed: set[str] = set()
            for valid in restarts:  # one per transaction: park only what the database refuses
                try:
                    write_restarts(self._connect()[0], [valid])
                except TransientWriteError:
                    failed.add(valid.message.message_id)
                except PermanentWriteError as exc:
                    failed |= self._dead_letter([poison_from(valid.message, exc)], result)
            return failed
        for valid in restarts:
            r = valid.record
            result.restarts += 1
            result.restart_loops += int(r.in_loop)
            seconds = r.restored_s if r.restored_s is not None else r.decided_s
            result.restart_seconds = max(result.restart_seconds or 0.0, seconds)
            self._log.info(
                "restart recorded",
                extra={
                    "messageId": valid.message.message_id,
                    "job_id": r.job_id,
                    "run_attempt": r.run_attempt,
                    "resumed_step": r.resumed_step,
                },
            )
        return set()

    def _log_outcome(self, written: Sequence[ValidReport], outcome: WriteOutcome) -> None:
        """One line per record: "written" only for a record whose row it changed; "unchanged"
        for a replay or an older attempt; "dropped" on a prune's tombstone."""
        fates: list[RecordFate] | None = [RecordFate(False, True)] * len(written)
        if outcome.noop_replays:
            # Rare (a re-send, a replay, a late spool, a backfill of a pruned step): one more
            # query then. The outcome counts rows, not which record moved which.
            try:
                fates = record_fates(self._connect()[0], written)
            except (psycopg.Error, TransientWriteError):
                fates = None  # the write committed; only the log line is less precise
        nothing_changed = outcome.shard_rows_changed == 0
        for i, valid in enumerate(written):
            fate = None if fates is None else fates[i]
            if fate is not None and fate.dropped:
                message = "record dropped: the checkpoint was pruned (tombstone)"
            elif nothing_changed or (fate is not None and not fate.landed):
                # A record whose row holds it "landed", but in a batch that changed rows it
                # may be its own redelivery (its first batch committed, its delete did not):
                # "written" then, the one case the row cannot tell apart.
                message = _UNCHANGED
            elif fate is None:
                message = "record written or unchanged (the check after the batch failed)"
            else:
                message = "record written"
            self._log.info(message, extra=_fields(valid))

    def _connect(self) -> tuple[Connection, bool]:
        try:
            return self.connection.get()
        except psycopg.Error as exc:
            self.connection.discard()
            # libpq's message names host/port/user, never the password; redact() is the guard
            # should a future message echo a DSN.
            message = redact(f"cannot connect: {type(exc).__name__}: {exc}")
            raise TransientWriteError(message) from exc

    def _isolate(self, reports: Sequence[ValidReport], result: BatchResult) -> set[str]:
        failed: set[str] = set()
        blocked: set[str] = set()
        down = False
        for valid in reports:
            msg = valid.message
            if down or msg.group_id in blocked:
                failed.add(msg.message_id)
                continue
            try:
                outcome = self._write([valid])
                result.add(outcome)
                self._log_outcome([valid], outcome)
            except TransientWriteError as exc:
                self._log.warning(
                    "record not written, retrying it and the rest: %s", exc, extra=_fields(valid)
                )
                down = True
                result.transient_failures += 1
                failed.add(msg.message_id)
            except PermanentWriteError as exc:
                unsent = self._dead_letter([poison_from(msg, exc)], result)
                if unsent:
                    failed |= unsent
                    blocked.add(msg.group_id)
        return failed

    def _dead_letter(self, poisons: Sequence[Poison], result: BatchResult) -> set[str]:
        """Send poison to the DLQ; returns the messageIds that must be reported as failures."""
        if not poisons:
            return set()
        result.poison += len(poisons)
        if self.settings.dlq_url is None:
            unsent = {p.message.message_id for p in poisons}
        else:
            if self._dlq is None:
                from lambda_writer.writer.dlq import dead_letter_queue

                self._dlq = dead_letter_queue(
                    self.settings.dlq_url, region=self.settings.aws_region
                )
            unsent = self._dlq.send(poisons)
        result.poison_unsent += len(unsent)
        for p in poisons:
            sent = p.message.message_id not in unsent
            self._log.error(
                "poison record %s: %s",
                "sent to the DLQ"
                if sent
                else "NOT sent to the DLQ (no DLQ_URL or send failed); "
                "it will be retried and reach the DLQ through maxReceiveCount",
                p.reason,
                extra={
                    "messageId": p.message.message_id,
                    "error_class": p.error_class,
                    "group_id": p.message.group_id,
                    "receive_count": p.message.receive_count,
                    "sent_to_dlq": sent,
                },
            )
        return unsent


def _fields(valid: ValidReport) -> dict[str, object]:
    r = valid.report
    return {
        "messageId": valid.message.message_id,
        "job_id": r.job_id,
        "step": r.step,
        "rank": r.rank,
        "run_attempt": r.run_attempt,
    }

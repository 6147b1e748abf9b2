"""``CheckpointReporter``: validate, spool durably, return; a background thread sends to SQS."""

from __future__ import annotations

import errno
import numbers
import operator
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, NotRequired, TypedDict, Unpack

from ckpt_contract import CheckpointReport, FieldError, InvalidMessage, StoredObject, encode
from trainer_client._gate import DiskGate
from trainer_client._log import adapter
from trainer_client._wake import Waker
from trainer_client.config import ReporterConfig, Tuning, TuningKnobs, resolve_config
from trainer_client.exceptions import ReporterClosed, ReporterConfigError, SpoolUnwritable
from trainer_client.sender import Counters, Sender
from trainer_client.signals import SigtermChain
from trainer_client.spool import Spool
from trainer_client.spot import SpotPoller

DEFAULT_FLUSH_TIMEOUT_S = 30.0
_CONFIGURED_FIELDS = frozenset(
    {"schema", "schema_version", "job_id", "run_attempt", "rank", "world_size", "created_at"}
)


class ReportFields(TypedDict):
    """The arguments of ``prepare()``/``report()``, declared once so mypy checks every call.

    Fields the contract does not know go through ``extra`` only: a misspelled keyword is an
    error, never a silently stored extra field.
    """

    step: int
    epoch: int
    uri: str
    loss: NotRequired[Any]
    metrics: NotRequired[Mapping[str, Any] | None]
    bytes: NotRequired[int | None]
    sha256: NotRequired[str | None]
    # Pins of the stored objects (ckpt_contract.StoredObject or its fields as a mapping).
    objects: NotRequired[Sequence[StoredObject | Mapping[str, Any]] | None]
    extra: NotRequired[Mapping[str, Any] | None]


_REPORT_FIELDS = frozenset(ReportFields.__annotations__)
# Spelled out: with postponed annotations, Python 3.11 cannot see NotRequired in
# __required_keys__.
_REQUIRED_FIELDS = frozenset({"step", "epoch", "uri"})


@dataclass(frozen=True)
class ReporterStats:
    """A snapshot of the reporter's counters."""

    reported: int
    sent: int
    retried: int
    failed: int
    pending: int
    sender_cpu_s: float


def _number(value: Any) -> Any:
    """A 0-d tensor / numpy scalar / int as a Python float; anything else is left to validation."""
    if type(value) is float:
        # The common case, first: the hasattr() below raises and swallows an AttributeError
        # for a float, which costs ~5 us per metric on report()'s path.
        return value
    if isinstance(value, bool) or value is None:
        return value
    if hasattr(value, "item") and not isinstance(value, float | int):
        value = value.item()
    if isinstance(value, numbers.Real) and not isinstance(value, bool | float):
        return float(value)
    return value


def _integer(value: Any) -> Any:
    """A numpy integer / integer 0-d tensor as a Python int; anything else unchanged."""
    if isinstance(value, bool | int) or not hasattr(value, "__index__"):
        return value
    return operator.index(value)


def _objects(value: Any) -> dict[str, Any]:
    """``objects=`` for the contract: left out when absent (the body stays as it was), a list."""
    if value is None:
        return {}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return {"objects": list(value)}
    return {"objects": value}  # refused by validation, naming the field


def _build_client(config: ReporterConfig) -> Any:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import NoRegionError

    t = config.tuning
    botocore_config = Config(
        connect_timeout=t.connect_timeout_s,
        read_timeout=t.read_timeout_s,
        # One attempt per call: our sender owns retries and backoff, so deadlines hold.
        retries={"total_max_attempts": 1, "mode": "standard"},
        # The sender builds every entry itself from validated reports; botocore's client-side
        # walk of the request shape was CPU the sender held the GIL for on every call (SQS
        # still validates the request server-side).
        parameter_validation=False,
    )
    try:
        return boto3.session.Session().client(
            "sqs",
            region_name=config.region,
            endpoint_url=config.endpoint_url,
            config=botocore_config,
        )
    except NoRegionError:
        raise ReporterConfigError(
            "region",
            "no AWS region: set AWS_DEFAULT_REGION (or AWS_REGION) or pass region= (or use an"
            " sqs.<region> queue URL)",
        ) from None


def _check_arguments(fields: Mapping[str, Any]) -> None:
    # Unpack[ReportFields] is checked by mypy, not at run time: check the names here.
    names = fields.keys()
    if names <= _REPORT_FIELDS and names >= _REQUIRED_FIELDS:
        return
    unknown = sorted(set(fields) - _REPORT_FIELDS)
    missing = sorted(_REQUIRED_FIELDS - set(fields))
    errors = [
        FieldError(name, "unknown argument (extra fields go in extra={...})") for name in unknown
    ] + [FieldError(name, "is required") for name in missing]
    if errors:
        raise InvalidMessage(errors)


class CheckpointReporter:
    """Reports checkpoint shards to the pipeline; ``report()`` returns once the report is on disk.

    ``spool_dir`` should be durable storage that outlives the instance (EFS, the checkpoint
    volume): instance store and the root EBS volume vanish with a Spot instance, and with them
    any report not yet sent. See ``trainer_client/README.md``.
    """

    def __init__(
        self,
        queue_url: str | None = None,
        job_id: str | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        run_attempt: int | None = None,
        endpoint_url: str | None = None,
        region: str | None = None,
        sqs_client: Any = None,
        **tuning: Unpack[TuningKnobs],
    ) -> None:
        try:
            knobs = Tuning(**tuning)
        except TypeError as exc:
            raise ReporterConfigError("tuning", str(exc)) from None
        if job_id is not None and not isinstance(job_id, str):
            raise ReporterConfigError("job_id", f"must be a string, got {type(job_id).__name__}")
        self.config = resolve_config(
            queue_url=queue_url,
            job_id=job_id,
            spool_dir=spool_dir,
            rank=rank,
            world_size=world_size,
            run_attempt=run_attempt,
            endpoint_url=endpoint_url,
            region=region,
            tuning=knobs,
        )
        cfg = self.config
        self._log = adapter(__name__, cfg.job_id, cfg.rank)
        # An injected client (thread-safe in boto3) lets many simulated ranks of one process share
        # one, as the fan-in benchmark does; a real rank builds its own.
        client = sqs_client if sqs_client is not None else _build_client(cfg)
        try:
            self._spool = Spool(
                cfg.spool_dir / cfg.job_id,
                cfg.rank,
                max_bytes=knobs.max_spool_bytes,
                max_records=knobs.max_pending_records,
                compact_threshold_bytes=knobs.compact_threshold_bytes,
                log=adapter("trainer_client.spool", cfg.job_id, cfg.rank),
            )
        except (PermissionError, IsADirectoryError, NotADirectoryError) as exc:
            raise ReporterConfigError("spool_dir", f"not writable: {exc}") from None
        except SpoolUnwritable:
            raise
        except OSError as exc:
            if exc.errno == errno.EROFS:
                raise ReporterConfigError("spool_dir", f"read-only file system: {exc}") from None
            raise SpoolUnwritable(
                str(cfg.spool_dir / cfg.job_id), exc.errno or errno.EIO, str(exc)
            ) from exc
        self._counters = Counters()
        self._waker = Waker()
        self._gate = DiskGate()
        self._progress = threading.Condition()
        self._closed = False
        # Async saves whose completion will call report(): close() waits for them (bounded).
        self._saves = threading.Condition()
        self._pending_saves = 0
        self._sender = Sender(
            spool=self._spool,
            client=client,
            queue_url=cfg.queue_url,
            job_id=cfg.job_id,
            run_attempt=cfg.run_attempt,
            rank=cfg.rank,
            batch_size=knobs.batch_size,
            backoff_base_s=knobs.backoff_base_s,
            backoff_cap_s=knobs.backoff_cap_s,
            backlog_warning_interval_s=knobs.backlog_warning_interval_s,
            counters=self._counters,
            waker=self._waker,
            gate=self._gate,
            progress=self._progress,
            log=self._log,
            on_signal=self._on_sigterm,
        )
        self._sigterm = SigtermChain(self._signal_received)
        if knobs.install_signal_handler and not self._sigterm.install():
            self._log.debug("not in the main thread: no SIGTERM handler installed")
        self._spot: SpotPoller | None = None
        self._sender.start()
        if cfg.spot_poll:
            self._spot = SpotPoller(
                cfg.imds_endpoint, knobs.spot_poll_interval_s, self._spot_notice, self._log
            )
            self._spot.start()
        self._log.debug("reporter started: spool %s, queue %s", self._spool.path, cfg.queue_url)

    # -- the training loop's API -------------------------------------------------------------

    def prepare(self, **fields: Unpack[ReportFields]) -> CheckpointReport:
        """Build and validate a report without spooling it; raises ``InvalidMessage``."""
        return self._build(fields)[0]

    def _build(self, fields: Mapping[str, Any]) -> tuple[CheckpointReport, str]:
        """The validated report and its encoded body (encoded once: report() spools that)."""
        _check_arguments(fields)
        cfg = self.config
        extra = fields.get("extra") or {}
        if not isinstance(extra, Mapping):
            raise InvalidMessage([FieldError("extra", "must be a mapping of field name to value")])
        reserved = sorted((_CONFIGURED_FIELDS | _REPORT_FIELDS).intersection(extra))
        if reserved:
            raise InvalidMessage(
                [FieldError(name, "is not an extra field (set it directly)") for name in reserved]
            )
        metrics = fields.get("metrics") or {}
        if not isinstance(metrics, Mapping):
            raise InvalidMessage(
                [FieldError("metrics", "must be a mapping of metric name to number")]
            )
        report = CheckpointReport.create(
            **{str(k): v for k, v in extra.items()},
            job_id=cfg.job_id,
            run_attempt=cfg.run_attempt,
            rank=cfg.rank,
            world_size=cfg.world_size,
            step=_integer(fields["step"]),
            epoch=_integer(fields["epoch"]),
            uri=fields["uri"],
            loss=_number(fields.get("loss")),
            metrics={k: _number(v) for k, v in metrics.items()},
            bytes=_integer(fields.get("bytes")),
            sha256=fields.get("sha256"),
            **_objects(fields.get("objects")),
            created_at=datetime.now(UTC),
        )
        return report, encode(report)  # raises MessageTooLarge / InvalidMessage at the call

    def report(self, **fields: Unpack[ReportFields]) -> CheckpointReport:
        """Validate and durably spool one shard's report (fsync'd), then return; sent in background.

        Raises ``InvalidMessage`` for bad arguments (nothing spooled), ``SpoolFull`` at the hard
        bound, ``SpoolUnwritable`` when the disk refuses (full, I/O error; nothing spooled),
        ``ReporterClosed`` after close(). Never raises because SQS is unreachable.
        """
        if self._closed:
            raise ReporterClosed("report() after close()")
        # The sender steps aside (GIL released) until this report is on disk; closing the gate
        # never waits for it (see _gate.py).
        with self._gate.closed():
            report, body = self._build(fields)
            # With the step, kept in memory beside the record: the sender derives the SQS ids
            # from it (not here: ~60 us after an idle pause) and need not parse the body back.
            self._spool.append(body, step=report.step)
        self._counters.reported += 1
        self._waker.wake()
        return report

    def flush(self, timeout: float = DEFAULT_FLUSH_TIMEOUT_S) -> bool:
        """Wait until everything reported so far is acknowledged by SQS; False at the deadline."""
        target = self._spool.last_seq
        deadline = time.monotonic() + timeout
        self._sender.add_flush_waiter(1)
        self._sender.urgent = True
        self._waker.wake()
        try:
            with self._progress:
                while True:
                    oldest = self._spool.oldest_pending_seq()
                    if oldest is None or oldest > target:
                        return not self._sender.rejected_any
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self._sender.is_alive():
                        return False
                    self._progress.wait(min(remaining, 0.5))
        finally:
            self._sender.add_flush_waiter(-1)

    def close(self, timeout: float | None = None) -> bool:
        """Wait for pending async-save reports and flush, together for at most ``timeout``
        (default close_timeout_s); stop; leave the rest on disk for the next start."""
        if self._closed:
            return self.pending == 0
        budget = self.config.tuning.close_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + budget
        with self._saves:
            # A checkpoint saved after the training loop ended must still be reported.
            self._saves.wait_for(
                lambda: self._pending_saves == 0, timeout=max(0.0, deadline - time.monotonic())
            )
            saves_left = self._pending_saves
        flushed = self.flush(max(0.0, deadline - time.monotonic()))
        self._closed = True
        if self._spot is not None:
            self._spot.stop()
        self._sender.stopping = True
        self._waker.wake()
        # Bounded: a send in progress ends within the botocore timeouts; the thread is a daemon.
        self._sender.join(timeout=1.0)
        self._sigterm.uninstall()
        if self._sender.signal_pending:
            # A SIGTERM arrived while closing, too late for the sender to handle it: deliver it
            # again now that the previous handler is back, so it is never swallowed.
            self._sender.signal_pending = False
            self._sigterm.resend()
        if saves_left:
            self._log.warning("closing with %s async save(s) still unfinished", saves_left)
        left = self._spool.pending_count
        if left:
            self._log.warning(
                "closing with %s report(s) unsent; kept in %s for the next start",
                left,
                self._spool.path,
            )
        self._spool.close()
        # Always: a sender still in a send (a daemon) only ever waits on the Event, which a
        # closed pipe does not affect; keeping the pipe and its watcher would leak them.
        self._waker.close()
        return flushed and not saves_left

    def save_started(self) -> None:
        """An async save will call report() when it completes (see ``report_when_saved``)."""
        with self._saves:
            self._pending_saves += 1

    def save_finished(self) -> None:
        """The async save announced by :meth:`save_started` completed (reported or not)."""
        with self._saves:
            self._pending_saves -= 1
            self._saves.notify_all()

    def __enter__(self) -> CheckpointReporter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.close()
        except Exception:
            if exc is None:
                raise
            # Never hide the training loop's own exception behind a shutdown problem.
            self._log.exception("error while closing the reporter")

    # -- health --------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Reports on disk not yet acknowledged by SQS."""
        return self._spool.pending_count

    @property
    def last_error(self) -> BaseException | None:
        """The latest send failure; None again after a fully successful send."""
        return self._sender.last_error

    @property
    def stats(self) -> ReporterStats:
        """Counters: reported, sent, retried (entries re-tried), failed (rejected), pending."""
        c = self._counters
        return ReporterStats(c.reported, c.sent, c.retried, c.failed, self.pending, c.sender_cpu_s)

    @property
    def spool_path(self) -> str:
        """The spool file of this job and rank."""
        return str(self._spool.path)

    @property
    def spot_interruption(self) -> dict[str, Any] | None:
        """The EC2 Spot instance-action document once a notice arrived (checkpoint soon!)."""
        return self._spot.notice if self._spot is not None else None

    # -- preemption ----------------------------------------------------------------------------

    def _signal_received(self) -> None:
        # Runs inside the SIGTERM handler: plain attribute writes and one write(2) only.
        self._sender.signal_pending = True
        self._sender.urgent = True
        self._waker.wake_from_signal()

    def _on_sigterm(self) -> None:
        # Called on the sender thread; the flushing waits on yet another thread so that the
        # sender keeps sending meanwhile.
        threading.Thread(
            target=self._flush_then_chain, name="ckpt-sigterm-flush", daemon=True
        ).start()

    def _flush_then_chain(self) -> None:
        timeout = self.config.tuning.signal_flush_timeout_s
        start = time.monotonic()
        flushed = self.flush(timeout)
        self._log.warning(
            "SIGTERM: %s in %.2f s (%s pending); passing the signal on",
            "flushed" if flushed else "flush deadline reached",
            time.monotonic() - start,
            self.pending,
        )
        self._sigterm.resend()

    def _spot_notice(self, notice: dict[str, Any]) -> None:
        self._sender.urgent = True
        self._waker.wake()
        threading.Thread(target=self.flush, name="ckpt-spot-flush", daemon=True).start()

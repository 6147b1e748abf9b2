"""Errors of the trainer client; invalid reports raise ``ckpt_contract.InvalidMessage`` instead."""

from __future__ import annotations


class ReporterError(Exception):
    """Root of the trainer client's own errors."""


class ReporterConfigError(ReporterError, ValueError):
    """Missing or invalid configuration, raised at construction; names the argument/env var."""

    def __init__(self, name: str, rule: str) -> None:
        self.name = name
        self.rule = rule
        super().__init__(f"{name}: {rule}")


class SpoolLocked(ReporterError):
    """Another live process (or reporter) already owns the spool of this job and rank."""


class SpoolFull(ReporterError):
    """The spool reached its hard bound (max_spool_bytes / max_pending_records); not spooled.

    Only raised after SQS has been unreachable for long enough to fill the bound: dropping the
    report silently or blocking the training step would both be worse than telling the caller.
    """


class SpoolUnwritable(ReporterError, OSError):
    """The spool cannot make a report durable: disk full, I/O error, read-only file system.

    Distinct from :class:`SpoolFull` (the configured bound): this is the disk refusing. Nothing
    was spooled by the call that raised it; ``.filename`` is the path and ``.errno`` the cause.
    """

    def __init__(self, path: str, err: int, detail: str) -> None:
        OSError.__init__(self, err, f"cannot make the report durable: {detail}", path)


class ReporterClosed(ReporterError):
    """``report()`` was called after ``close()``."""


class EntryRejected(ReporterError):
    """SQS refused one entry of a batch; ``sender_fault`` says whose fault it was."""

    def __init__(self, seq: int, code: str, message: str, *, sender_fault: bool) -> None:
        self.seq, self.code, self.sender_fault = seq, code, sender_fault
        super().__init__(f"record {seq}: {code}: {message} (SenderFault={sender_fault})")


class DropCheckpoint(Exception):
    """Raised by a post-step: this checkpoint must never be reported (its record is removed)."""


class FinishDeferred(Exception):
    """Raised to stop finishing a job now and leave it on disk for the next start."""


class JobRecordInvalid(ValueError):
    """A finish job's record on disk cannot be read back (torn by a crash or by hand, another
    client version): moved aside with a warning at the next start."""


class RelayUnavailable(ConnectionError):
    """The relay refused, timed out, hung up or answered with an error."""


class IntegrationError(ReporterError):
    """Root of the integrations' errors; ``name`` is the argument/setting, ``rule`` the cause."""

    def __init__(self, name: str, rule: str) -> None:
        self.name = name
        self.rule = rule
        super().__init__(f"{name}: {rule}")


class ExtraMissing(IntegrationError):
    """An integration needs a package the base install does not have; names the extra.

    Not an ``ImportError``: that type's own ``name`` attribute (the module) would clash.
    """


class ResumeError(IntegrationError):
    """The database could not answer which checkpoint to resume from (bad input, unreachable,
    not migrated, or stored URIs that name no common checkpoint location)."""


class LayoutError(ValueError):
    """A file the layout rules (``trainer_client.storage.layouts``) cannot attribute to exactly one
    rank (model
    parallelism, a layout they do not know): the checkpoint is not reported rather than reported
    wrongly."""

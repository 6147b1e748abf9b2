"""``replay-dlq --discard REASON``: poison that must go, recorded in the database before it goes.

Each discarded message becomes a ``ckpt_dlq_discards`` row (migration 0015): the body, the
writer's reason, the original sender, the operator's database user and the reason given. The
rows of one receive batch commit in one transaction; only then does the replay delete the
messages from the DLQ (``ckpt_pipeline.ops.replay``). The row's key is the message's first DLQ
deduplication id, so a re-run after a crash between the commit and the delete records it once.
"""

from __future__ import annotations

import psycopg

from ckpt_contract import dlq as envelope
from ckpt_pipeline.exceptions import ConfigError, PipelineError
from ckpt_pipeline.ops.replay_plan import DlqMessage
from lambda_writer import connect_url

RECORD = """
INSERT INTO ckpt_dlq_discards (dlq_id, dlq_message_id, original_message_id, group_id, job_id,
    sender_id, error_class, error_message, body, reason)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (dlq_id) DO NOTHING
"""


class DiscardNotRecorded(PipelineError):
    """The discard rows did not commit: the messages stay in the DLQ."""


def check_discard_reason(value: str) -> str:
    """``--discard``'s reason: required, one line (it is what the audit row says)."""
    text = " ".join(value.split())
    if not text:
        raise ConfigError("--discard", "must say why the messages are discarded")
    return text


class DiscardRecorder:
    """Records discarded DLQ messages with one reason, one transaction per call."""

    def __init__(self, database_url: str, reason: str) -> None:
        self.database_url = database_url
        self.reason = reason

    def __call__(self, messages: list[DlqMessage]) -> None:
        """Record ``messages``; raises :class:`DiscardNotRecorded` if the rows did not commit."""
        rows = [
            (
                m.identity_dedup_id,
                m.message_id,
                m.string_attribute(envelope.ORIGINAL_MESSAGE_ID),
                m.group_id,
                m.job_id,
                m.original_sender_id,
                m.error_class,
                m.string_attribute(envelope.ERROR_MESSAGE),
                m.body,
                self.reason,
            )
            for m in messages
        ]
        try:
            with connect_url(self.database_url) as conn, conn.transaction():
                conn.cursor().executemany(RECORD, rows)
        except psycopg.Error as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DiscardNotRecorded(f"database: {first}") from exc

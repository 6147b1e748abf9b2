"""The DLQ envelope: how the writer marks a poison message it moves to the FIFO DLQ.

The body and the group are the original message's, unchanged; the message attributes below say
why, and the deduplication id is derived from the original messageId, so a retried send of the
same poison record is dropped by SQS instead of duplicated. The writer writes this envelope
(``lambda_writer.writer.dlq``) and the operator's replay reads it
(``ckpt_pipeline.ops.replay_plan``): both take the names from here.
"""

from __future__ import annotations

import hashlib

# String: the error's class (``InvalidMessage``, a psycopg error's name...).
ERROR_CLASS = "ErrorClass"
# String: what was wrong, one line, cut at MAX_ERROR_MESSAGE_CHARS.
ERROR_MESSAGE = "ErrorMessage"
# String: the messageId the record had in the main queue.
ORIGINAL_MESSAGE_ID = "OriginalMessageId"
# Number: how many times the main queue had delivered it.
RECEIVE_COUNT = "ReceiveCount"
# String, when known: its first receive in the main queue (ISO 8601, UTC).
FIRST_SEEN_AT = "FirstSeenAt"
# String, when known: the main queue's ARN.
SOURCE_QUEUE_ARN = "SourceQueueArn"

# String, when known: the SenderId of the message's original sender (SQS's SenderId of the
# report, or, for a replay the writer accepted, the original it carried). The replay keeps it on
# the message it re-sends; the writer applies it only when the replay principal sent that message.
ORIGINAL_SENDER_ID = "OriginalSenderId"

# Every attribute the writer may put on a DLQ message.
WRITER_ATTRIBUTES = frozenset(
    {
        ERROR_CLASS,
        ERROR_MESSAGE,
        ORIGINAL_MESSAGE_ID,
        RECEIVE_COUNT,
        FIRST_SEEN_AT,
        SOURCE_QUEUE_ARN,
        ORIGINAL_SENDER_ID,
    }
)
MAX_ERROR_CLASS_CHARS = 256
MAX_ERROR_MESSAGE_CHARS = 1024


def dlq_dedup_id(message_id: str) -> str:
    """Deterministic MessageDeduplicationId of the DLQ copy of ``message_id`` (64 hex chars)."""
    return hashlib.sha256(f"ckpt-dlq|{message_id}".encode()).hexdigest()

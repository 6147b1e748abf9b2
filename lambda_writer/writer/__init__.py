"""The writer function: one batch of SQS records into PostgreSQL, poison to the DLQ."""

"""Lambda writer: drains the SQS FIFO queue of checkpoint reports into PostgreSQL."""

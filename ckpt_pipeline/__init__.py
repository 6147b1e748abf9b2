"""Operator tooling: the ``ckpt-pipeline`` CLI, the local event source, demo, status, DLQ replay."""

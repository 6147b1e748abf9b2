"""Retention: the policy and its plan, the executor, the reads; the scheduled prune's handler.

``ckpt-pipeline prune`` and the scheduled prune function both run this one package.
"""

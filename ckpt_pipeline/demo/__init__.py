"""The demo: a torchrun job through the local pipeline, and the direct-write design it replaces."""

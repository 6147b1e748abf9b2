"""The integrations' ``upload_to=`` option: the finisher's S3 upload step, asked for every save."""

from __future__ import annotations

from collections.abc import Sequence

from trainer_client.finish_job import PostStepCall
from trainer_client.integrations.exceptions import IntegrationError
from trainer_client.post_step import PostStep
from trainer_client.storage.s3_pins import split_s3_uri


def with_upload(
    upload_to: str | None,
    post: Sequence[PostStepCall],
    post_steps: Sequence[PostStep],
    *,
    upload: PostStep | None = None,
) -> tuple[tuple[PostStepCall, ...], tuple[PostStep, ...]]:
    """``post``/``post_steps`` with the upload last (after the caller's own steps), or as given.

    ``upload`` replaces the default ``S3Upload()`` (its client, part size, concurrency).
    """
    if upload_to is None:
        return tuple(post), tuple(post_steps)
    try:
        split_s3_uri(upload_to.rstrip("/") + "/x")
    except ValueError:
        raise IntegrationError("upload_to", "must be s3://bucket[/prefix]") from None
    from trainer_client.storage.s3_finish import STEP_NAME, S3Upload

    steps = tuple(post_steps)
    if not any(s.name == STEP_NAME for s in steps):
        steps += (upload or S3Upload(),)
    return (*post, PostStepCall(STEP_NAME, {"prefix": upload_to})), steps


def waiting(post: Sequence[PostStepCall]) -> tuple[PostStepCall, ...]:
    """``post`` for a rank that reports a file another rank uploads: it waits for the object."""
    from trainer_client.storage.s3_finish import STEP_NAME

    return tuple(
        PostStepCall(c.name, {**c.params, "wait": True}) if c.name == STEP_NAME else c for c in post
    )

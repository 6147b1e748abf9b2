"""The integrations' ``upload_to=`` option: the finisher's S3 upload step, asked for every save."""

from __future__ import annotations

from collections.abc import Sequence

from trainer_client.exceptions import IntegrationError
from trainer_client.finish.finish_job import PostStepCall
from trainer_client.finish.post_step import PostStep
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
    params: dict[str, object] = {"prefix": upload_to}
    step = next(s for s in steps if s.name == STEP_NAME)
    if isinstance(step, S3Upload) and step.settings.spread_prefixes:
        # Recorded in each finish job beside the prefix: where its files go, whoever finishes
        # it (the next start, ``ckpt-pipeline spool send`` with a default S3Upload).
        params["spread_prefixes"] = step.settings.spread_prefixes
    return (*post, PostStepCall(STEP_NAME, params)), steps


def waiting(post: Sequence[PostStepCall]) -> tuple[PostStepCall, ...]:
    """``post`` for a rank that reports a file another rank uploads: it waits for the object."""
    from trainer_client.storage.s3_finish import STEP_NAME

    return tuple(
        PostStepCall(c.name, {**c.params, "wait": True}) if c.name == STEP_NAME else c for c in post
    )


def check_upload(post: Sequence[PostStepCall], post_steps: Sequence[PostStep]) -> None:
    """Refuse to start, in one line naming ``upload_to``, when its bucket is missing or its
    prefix cannot be written (:func:`trainer_client.storage.s3_upload.check_writable`): else
    every checkpoint would be saved, then held by an upload that can never succeed."""
    from trainer_client.storage.exceptions import UploadError
    from trainer_client.storage.s3_finish import STEP_NAME, S3Upload
    from trainer_client.storage.s3_upload import check_writable

    step = next((s for s in post_steps if s.name == STEP_NAME), None)
    if not isinstance(step, S3Upload):
        return  # a post-step of the caller's own: its own business
    prefixes = {
        str(c.params["prefix"]) for c in post if c.name == STEP_NAME and "prefix" in c.params
    }
    for prefix in sorted(prefixes):
        try:
            check_writable(step.client, prefix, spread_prefixes=step.settings.spread_prefixes)
        except UploadError as exc:
            raise IntegrationError(
                "upload_to", f"{prefix}: {exc.rule} ({exc.uri}); nothing was trained"
            ) from None

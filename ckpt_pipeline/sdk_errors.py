"""The SDKs' errors as one line that names the service and the setting, and an exit code.

Every command's failure reaches the user through :func:`explain`: a botocore error (S3 or SQS,
told apart by the operation that failed, or by :func:`calling` where the command knows) or a
psycopg error (PostgreSQL, ``DATABASE_URL``) becomes ``SERVICE (SETTING): what went wrong`` and
one of the exit codes below (defined in :mod:`ckpt_pipeline.exit_codes`). Neither SDK is
imported unless an error is being explained, so a base install without them still gets its one
line.

Exit codes (the CLI's, stated in ``ckpt-pipeline --help``):
* 1 ``EXIT_FAILED`` — a service answered with an error or could not be reached;
* 2 ``EXIT_CONFIG`` — a setting or option was refused before any service was asked.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ckpt_pipeline.exceptions import PipelineError
from ckpt_pipeline.exit_codes import EXIT_CONFIG, EXIT_FAILED

S3 = "S3"
SQS = "SQS"
POSTGRESQL = "PostgreSQL"

# Where each service's setting comes from when a command does not name a more precise one.
_DEFAULT_SETTING = {
    S3: "the checkpoint store",
    SQS: "the queue URL",
    POSTGRESQL: "DATABASE_URL",
}
_S3_WORDS = ("Object", "Bucket", "Multipart", "Part")


class ServiceError(PipelineError):
    """A call to S3, SQS or PostgreSQL failed; names the service, the setting and the cause."""

    def __init__(self, service: str, setting: str, detail: str, *, exit_code: int) -> None:
        self.service = service
        self.setting = setting
        self.detail = detail
        self.exit_code = exit_code
        super().__init__(f"{service} ({setting}): {detail}")


def service_of_operation(operation: str) -> str | None:
    """S3 or SQS by the API operation's name (``ListObjectsV2``, ``GetQueueAttributes``)."""
    if "Queue" in operation or "Message" in operation:
        return SQS
    if any(word in operation for word in _S3_WORDS):
        return S3
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def _botocore(exc: BaseException, service: str | None, setting: str | None) -> ServiceError | None:
    try:
        from botocore import exceptions as bc
    except ModuleNotFoundError:
        return None
    if isinstance(exc, bc.NoRegionError):
        return ServiceError("AWS", "AWS_REGION", "is not set", exit_code=EXIT_CONFIG)
    if isinstance(exc, (bc.NoCredentialsError, bc.PartialCredentialsError)):
        return ServiceError(
            "AWS",
            "credentials",
            "none found (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile or a role)",
            exit_code=EXIT_CONFIG,
        )
    if isinstance(exc, bc.ClientError):
        error = exc.response.get("Error", {})
        service = service or service_of_operation(exc.operation_name) or "AWS"
        code = error.get("Code", "error")
        message = error.get("Message") or exc.operation_name
        return ServiceError(
            service,
            setting or _DEFAULT_SETTING.get(service, "AWS"),
            f"{code}: {message}",
            exit_code=EXIT_FAILED,
        )
    if isinstance(exc, bc.ParamValidationError):
        # Refused by botocore before any request: an invalid bucket name or queue URL.
        report = " ".join(str(exc.kwargs.get("report", exc)).split())
        if service is None:
            service = S3 if "bucket" in report.lower() else "AWS"
        return ServiceError(
            service,
            setting or _DEFAULT_SETTING.get(service, "AWS"),
            f"refused before sending: {report}",
            exit_code=EXIT_CONFIG,
        )
    if isinstance(exc, bc.EndpointConnectionError):
        endpoint = exc.kwargs.get("endpoint_url", "")
        return ServiceError(
            service or "AWS",
            setting or "AWS_ENDPOINT_URL",
            f"cannot connect to {endpoint}",
            exit_code=EXIT_FAILED,
        )
    if isinstance(exc, bc.BotoCoreError):
        return ServiceError(
            service or "AWS",
            setting or _DEFAULT_SETTING.get(service or "", "AWS"),
            _first_line(exc),
            exit_code=EXIT_FAILED,
        )
    return None


def _psycopg(exc: BaseException, setting: str | None) -> ServiceError | None:
    try:
        import psycopg
    except ModuleNotFoundError:
        return None
    if not isinstance(exc, psycopg.Error):
        return None
    setting = setting or _DEFAULT_SETTING[POSTGRESQL]
    if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedFunction):
        return ServiceError(
            POSTGRESQL,
            setting,
            "the database is not migrated: run `ckpt-pipeline migrate`",
            exit_code=EXIT_FAILED,
        )
    if isinstance(exc, psycopg.OperationalError):
        return ServiceError(
            POSTGRESQL, setting, f"cannot connect: {_first_line(exc)}", exit_code=EXIT_FAILED
        )
    if isinstance(exc, psycopg.ProgrammingError) and exc.sqlstate is None:
        # libpq could not parse the connection string; its message may quote a password.
        return ServiceError(
            POSTGRESQL,
            setting,
            "libpq cannot parse it; use postgresql://user@host:5432/dbname",
            exit_code=EXIT_CONFIG,
        )
    return ServiceError(POSTGRESQL, setting, _first_line(exc), exit_code=EXIT_FAILED)


def explain(
    exc: BaseException, *, service: str | None = None, setting: str | None = None
) -> ServiceError | None:
    """``exc`` as a :class:`ServiceError` if an SDK raised it, else None."""
    if isinstance(exc, ServiceError):
        return exc
    aws = service if service != POSTGRESQL else None
    database = setting if service in (None, POSTGRESQL) else None
    return _botocore(exc, aws, setting if aws else None) or _psycopg(exc, database)


@contextmanager
def calling(service: str, setting: str) -> Iterator[None]:
    """In the block, an SDK error becomes a :class:`ServiceError` of ``service``, ``setting``."""
    try:
        yield
    except ServiceError:
        raise
    except Exception as exc:
        explained = explain(exc, service=service, setting=setting)
        if explained is None:
            raise
        raise explained from exc

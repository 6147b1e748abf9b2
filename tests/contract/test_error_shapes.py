"""One shape for "a setting broke a rule", in every package: ``.name``, ``.rule``, and a message
that says both, so a caller (or an operator reading one line) handles them all alike."""

from __future__ import annotations

import pytest

from ckpt_pipeline.exceptions import ConfigError, PipelineError
from infra.exceptions import InfraError
from infra.exceptions import SettingsError as InfraSettingsError
from lambda_writer.migrate.exceptions import MigrationError
from lambda_writer.shared.exceptions import SettingsError as WriterSettingsError
from lambda_writer.shared.exceptions import WriterError
from trainer_client.exceptions import ReporterConfigError, ReporterError

CONFIG_ERRORS = [
    (ReporterConfigError, ReporterError),
    (WriterSettingsError, WriterError),
    (ConfigError, PipelineError),
    (InfraSettingsError, InfraError),
]


@pytest.mark.parametrize(("error", "root"), CONFIG_ERRORS, ids=lambda e: e.__module__)
def test_every_configuration_error_names_the_setting_and_the_rule(
    error: type[Exception], root: type[Exception]
) -> None:
    raised = error("CKPT_QUEUE_URL", "must be an https:// SQS queue URL")  # type: ignore[call-arg]
    assert issubclass(error, root)
    assert (raised.name, raised.rule) == (  # type: ignore[attr-defined]
        "CKPT_QUEUE_URL",
        "must be an https:// SQS queue URL",
    )
    assert "CKPT_QUEUE_URL" in str(raised) and str(raised).endswith(
        ": must be an https:// SQS queue URL"
    )


def test_each_package_has_one_root_that_its_errors_share() -> None:
    # MigrationError was once outside WriterError; a handler catching WriterError missed it.
    assert issubclass(MigrationError, WriterError)

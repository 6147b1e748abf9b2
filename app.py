#!/usr/bin/env python3
"""CDK app: ``cdk synth`` / ``cdk deploy`` the checkpoint pipeline (configuration in cdk.json)."""

from __future__ import annotations

import sys

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from infra.exceptions import SettingsError
from infra.settings import load_settings
from infra.stack import CheckpointPipelineStack


def main() -> int:
    """Build and synthesize the app; a bad context value exits 1 with the key and the rule."""
    app = cdk.App()
    try:
        settings = load_settings(app.node.try_get_context, app.node.get_all_context().keys())
    except SettingsError as exc:
        print(f"ckpt-pipeline: invalid configuration: {exc}", file=sys.stderr)
        return 1
    # Env-agnostic on purpose: synth needs no credentials or lookups; cdk deploy picks the
    # account and region from the caller's AWS configuration.
    CheckpointPipelineStack(app, settings.stack_name, settings=settings)
    cdk.Aspects.of(app).add(AwsSolutionsChecks(verbose=True))
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""cdk-nag and cfn-lint pass, aws-cdk-lib reports nothing, every suppression has a reason."""

from __future__ import annotations

import json

import pytest
from cfnlint.api import ManualArgs, lint  # type: ignore[import-untyped]

from infra.alarm_topic import NO_SUBSCRIBER_WARNING
from tests.infra.conftest import Synth


def test_cdk_nag_and_cdk_annotations_are_clean(any_synth: Synth) -> None:
    assert any_synth.messages("error") == []
    # The only warning the app may emit is its own: no one subscribed to the alarms.
    warnings = [w for w in any_synth.messages("warning") if NO_SUBSCRIBER_WARNING not in w]
    assert warnings == []


def test_every_suppression_has_a_reason(any_synth: Synth) -> None:
    seen = 0
    for resource in any_synth.json["Resources"].values():
        for suppression in (
            resource.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", [])
        ):
            seen += 1
            assert suppression["id"].startswith("AwsSolutions-")
            assert len(suppression["reason"]) >= 10
    assert seen > 0


# W3005 (a DependsOn that a GetAtt already implies) is aws-cdk-lib's own output: every Function
# depends explicitly on its role, and CDK's singleton providers do the same. Harmless ordering
# information, not something this app can change.
CFN_LINT_IGNORED = ["W3005"]


@pytest.mark.parametrize("region", ["us-east-1", "eu-west-1"])
def test_cfn_lint_passes(any_synth: Synth, region: str) -> None:
    config = ManualArgs(ignore_checks=CFN_LINT_IGNORED)
    matches = lint(json.dumps(any_synth.json), regions=[region], config=config)
    assert [f"{m.rule.id} {m.path_string}: {m.message}" for m in matches] == []


def test_the_nag_harness_reports_findings() -> None:
    # GIVEN a queue without TLS enforcement, WHEN nagged the same way, THEN the finding shows up.
    import aws_cdk as cdk
    from aws_cdk import assertions
    from aws_cdk import aws_sqs as sqs
    from cdk_nag import AwsSolutionsChecks

    app = cdk.App()
    stack = cdk.Stack(app, "Control")
    sqs.Queue(stack, "Plain", enforce_ssl=False)
    cdk.Aspects.of(app).add(AwsSolutionsChecks())
    errors = assertions.Annotations.from_stack(stack).find_error("*", assertions.Match.any_value())
    assert any("AwsSolutions-SQS4" in str(e.entry.data) for e in errors)

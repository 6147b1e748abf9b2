"""Log retention for the Lambda functions aws-cdk-lib adds on its own (custom-resource providers).

The Trigger provider, the VPC's default-security-group provider and the LogRetention provider are
singleton functions that CDK creates without a log group: Lambda then creates
``/aws/lambda/<name>`` on the first invocation with no retention, so their logs are kept (and
paid for) forever. Each gets a log group of its own with a retention, by ``LoggingConfig``, which
Lambda writes to instead (https://docs.aws.amazon.com/lambda/latest/dg/monitoring-cloudwatchlogs-advanced.html).
"""

from __future__ import annotations

from typing import cast

from aws_cdk import CfnResource, Stack
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from cdk_nag import NagPackSuppression, NagSuppressions
from constructs import Construct

from infra.database_function import LAMBDA_BASIC_POLICY

_FUNCTION = "AWS::Lambda::Function"


def give_provider_functions_log_retention(stack: Stack, retention: logs.RetentionDays) -> int:
    """Point every function in ``stack`` that has no log group of its own at one with ``retention``.

    Call it last, once every construct exists; returns how many functions it changed.
    """
    changed = 0
    for construct in stack.node.find_all():
        if not isinstance(construct, CfnResource) or construct.cfn_resource_type != _FUNCTION:
            continue
        if isinstance(construct, lambda_.CfnFunction) and construct.logging_config is not None:
            continue  # an L2 Function of ours, built with its log group
        parent = cast(Construct, construct.node.scope)  # a CfnResource always has one
        log_group = logs.LogGroup(parent, f"{construct.node.id}Logs", retention=retention)
        construct.add_property_override("LoggingConfig.LogGroup", log_group.log_group_name)
        changed += 1
    _suppress_log_retention_provider(stack)
    return changed


def _suppress_log_retention_provider(stack: Stack) -> None:
    # CDK's LogRetention singleton (it sets the RDS export's retention) is framework code whose
    # role and policy aws-cdk-lib writes; the ids it gets are aws-cdk-lib's too.
    for child in stack.node.children:
        if child.node.id.startswith("LogRetention"):
            NagSuppressions.add_resource_suppressions(
                child,
                [
                    NagPackSuppression(
                        id="AwsSolutions-IAM4",
                        reason="CDK's LogRetention provider (framework code): basic execution "
                        "role only.",
                        applies_to=[LAMBDA_BASIC_POLICY],
                    ),
                    NagPackSuppression(
                        id="AwsSolutions-IAM5",
                        reason="CDK's LogRetention provider: logs:PutRetentionPolicy and "
                        "DeleteRetentionPolicy on log groups named only at deploy time.",
                        applies_to=["Resource::*"],
                    ),
                ],
                apply_to_children=True,
            )

"""The trainers' managed policy (exactly sqs:SendMessage on the queue) and the stack outputs."""

from __future__ import annotations

from tests.infra.conftest import Synth


def test_trainer_policy_is_send_only_on_the_queue(any_synth: Synth) -> None:
    policy = any_synth.only("AWS::IAM::ManagedPolicy")["Properties"]
    queue_id = next(
        key for key, value in any_synth.resources("AWS::SQS::Queue").items()
        if "RedrivePolicy" in value["Properties"]
    )  # fmt: skip
    assert policy["PolicyDocument"]["Statement"] == [
        {
            "Sid": "SendCheckpointReports",
            "Effect": "Allow",
            "Action": "sqs:SendMessage",
            "Resource": {"Fn::GetAtt": [queue_id, "Arn"]},
        }
    ]
    assert "ManagedPolicyName" not in policy  # IAM names are account-global: CloudFormation's


def test_outputs_are_exported(any_synth: Synth) -> None:
    outputs = any_synth.json["Outputs"]
    stack_name = any_synth.settings.stack_name
    for name in ("QueueUrl", "DlqUrl", "TrainerPolicyArn", "ProxyEndpoint", "AlarmTopicArn"):
        assert outputs[name]["Export"] == {"Name": f"{stack_name}-{name}"}
    assert outputs["ProxyEndpoint"]["Value"]["Fn::GetAtt"][1] == "Endpoint"
    assert "Ref" in outputs["TrainerPolicyArn"]["Value"]


def test_physical_names_are_left_to_cloudformation(any_synth: Synth) -> None:
    resources = any_synth.json["Resources"]
    for cfn_type, name_property in (
        ("AWS::SQS::Queue", "QueueName"),
        ("AWS::SNS::Topic", "TopicName"),
        ("AWS::SecretsManager::Secret", "Name"),
        ("AWS::IAM::ManagedPolicy", "ManagedPolicyName"),
        ("AWS::IAM::Policy", "PolicyName"),
        ("AWS::IAM::Role", "RoleName"),
        ("AWS::Lambda::Function", "FunctionName"),
        ("AWS::Logs::LogGroup", "LogGroupName"),
    ):
        for logical_id, resource in resources.items():
            if resource["Type"] == cfn_type and cfn_type != "AWS::IAM::Policy":
                assert name_property not in resource["Properties"], logical_id


def test_proxy_name_is_the_stacks_and_changes_with_a_replacement(
    greenfield: Synth, existing: Synth
) -> None:
    # DBProxyName is required: it carries the stack name and a hash of what replaces the proxy.
    names = [
        s.only("AWS::RDS::DBProxy")["Properties"]["DBProxyName"] for s in (greenfield, existing)
    ]
    for synth, name in zip((greenfield, existing), names, strict=True):
        assert name.startswith(f"{synth.settings.stack_name}-") and len(name) <= 60
        assert "--" not in name and not name.endswith("-")
    assert names[0] != names[1]
    dashboard = greenfield.only("AWS::CloudWatch::Dashboard")["Properties"]["DashboardName"]
    assert "AWS::Region" in str(dashboard)


def test_constructs_expose_attributes(any_synth: Synth) -> None:
    stack = any_synth.stack
    assert stack.queues.queue.fifo and stack.queues.dlq.fifo
    assert stack.writer.function.function_name
    assert stack.database.proxy.endpoint
    assert stack.trainer_access.policy.managed_policy_arn

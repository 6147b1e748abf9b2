"""The trainers' managed policy (exactly sqs:SendMessage on the queue) and the stack outputs."""

from __future__ import annotations

from tests.infra.conftest import Synth


def test_trainer_policy_is_send_only_on_the_queue(any_synth: Synth) -> None:
    policy = any_synth.only("AWS::IAM::ManagedPolicy")["Properties"]
    queue_id = next(
        key for key, value in any_synth.resources("AWS::SQS::Queue").items()
        if value["Properties"]["QueueName"].endswith("-checkpoints.fifo")
    )  # fmt: skip
    assert policy["PolicyDocument"]["Statement"] == [
        {
            "Sid": "SendCheckpointReports",
            "Effect": "Allow",
            "Action": "sqs:SendMessage",
            "Resource": {"Fn::GetAtt": [queue_id, "Arn"]},
        }
    ]
    assert policy["ManagedPolicyName"] == f"{any_synth.settings.prefix}-ckpt-trainer-send"


def test_outputs_are_exported(any_synth: Synth) -> None:
    outputs = any_synth.json["Outputs"]
    prefix = any_synth.settings.prefix
    for name in ("QueueUrl", "DlqUrl", "TrainerPolicyArn", "ProxyEndpoint"):
        assert outputs[name]["Export"] == {"Name": f"{prefix}-ckpt-{name}"}
    assert outputs["ProxyEndpoint"]["Value"]["Fn::GetAtt"][1] == "Endpoint"
    assert "Ref" in outputs["TrainerPolicyArn"]["Value"]


def test_constructs_expose_attributes(any_synth: Synth) -> None:
    stack = any_synth.stack
    assert stack.queues.queue.fifo and stack.queues.dlq.fifo
    assert stack.writer.function.function_name
    assert stack.database.proxy.endpoint
    assert stack.trainer_access.policy.managed_policy_arn

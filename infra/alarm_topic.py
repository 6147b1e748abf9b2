"""The pipeline's alarm topic and its key: where every alarm of the stack notifies."""

from __future__ import annotations

from typing import Any

from aws_cdk import Annotations, Aws, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from infra.settings import PipelineSettings

# The id of the synth-time warning that no one receives the alarms (greenfield default).
NO_SUBSCRIBER_WARNING = "ckpt-pipeline:noAlarmSubscriber"


def cloudwatch_alarms_of_this_account() -> dict[str, Any]:
    """IAM conditions: the request comes from a CloudWatch alarm of this account and region."""
    return {
        "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
        "ArnLike": {
            "aws:SourceArn": f"arn:{Aws.PARTITION}:cloudwatch:{Aws.REGION}:{Aws.ACCOUNT_ID}:alarm:*"
        },
    }


def alarm_topic(scope: Construct, settings: PipelineSettings) -> sns.Topic:
    """The topic (encrypted with its own key, TLS only, CloudWatch of this account may publish),
    subscribed by ``alarmEmail`` when set; a synth warning when nobody is."""
    # A customer key: CloudWatch alarms cannot publish to a topic encrypted with the AWS
    # managed aws/sns key, whose policy cannot grant cloudwatch.amazonaws.com
    # (https://docs.aws.amazon.com/sns/latest/dg/sns-key-management.html#compatibility-with-aws-services).
    key = kms.Key(
        scope,
        "TopicKey",
        description="Checkpoint pipeline alarm topic",
        enable_key_rotation=True,
        # SNS keeps no messages, so nothing outlives the topic that this key would still have
        # to decrypt: scheduled for deletion with the stack, not left behind (aws-cdk's
        # default for keys is RETAIN).
        removal_policy=RemovalPolicy.DESTROY,
    )
    # CloudWatch acts for whoever owns the alarm: without the source conditions, an alarm in
    # any other account could use this key and topic (confused deputy,
    # https://docs.aws.amazon.com/sns/latest/dg/sns-access-policy-use-cases.html).
    from_our_alarms = cloudwatch_alarms_of_this_account()
    key.add_to_resource_policy(
        iam.PolicyStatement(
            sid="AlarmsOfThisAccountEncrypt",
            principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            actions=["kms:Decrypt", "kms:GenerateDataKey*"],
            resources=["*"],  # in a key policy "*" is this key
            conditions=from_our_alarms,
        )
    )
    topic = sns.Topic(
        scope,
        "AlarmTopic",
        display_name="Checkpoint pipeline alarms",
        master_key=key,
        enforce_ssl=True,
    )
    # A topic policy replaces SNS's default one, which is what let the account's own services
    # publish: without this statement every alarm action fails with "not authorized to
    # perform SNS:Publish" (https://docs.aws.amazon.com/sns/latest/dg/sns-access-policy-use-cases.html).
    topic.add_to_resource_policy(
        iam.PolicyStatement(
            sid="AlarmsOfThisAccountPublish",
            principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            actions=["sns:Publish"],
            resources=[topic.topic_arn],
            conditions=from_our_alarms,
        )
    )
    if settings.alarm_email:
        topic.add_subscription(subscriptions.EmailSubscription(settings.alarm_email))
    else:
        Annotations.of(scope).add_warning_v2(
            NO_SUBSCRIBER_WARNING,
            "alarmEmail is empty: nobody is subscribed to the alarm topic, so alarms notify "
            "no one. Set -c alarmEmail=ops@example.com or subscribe to the AlarmTopicArn "
            "output.",
        )
    return topic

"""The jobs' checkpoint bucket/prefix: what the trainers and the reconcile operator may do there.

Optional (context ``checkpointBucket`` or ``createCheckpointBucket``, ``checkpointPrefix``). The
stack never creates a bucket unless asked, and never deletes one: an existing bucket is only
referred to by name; a created one is retained when the stack is deleted (checkpoints outlive
the pipeline). The grants follow the S3 calls the code makes (README, "The checkpoint bucket"):

* trainers (``trainer_client.storage.s3_upload``/``s3_finish``, the resume's verification):
PutObject
  (PutObject, CreateMultipartUpload, UploadPart, CompleteMultipartUpload), AbortMultipartUpload
  (a killed attempt's upload), GetObject/GetObjectVersion (HeadObject, the deep check, loading
  a checkpoint) on ``prefix*``; ListBucket under the prefix (so that a missing key is a 404, and
  the verification's listing) and ListBucketMultipartUploads (the upload aborts its key's open
  ones; this action takes no ``s3:prefix`` condition);
* ``ckpt-pipeline reconcile``: the same reads and listings, nothing that writes or deletes an
  object, and ``sqs:SendMessage`` on the queue for ``--backfill``.

With the trainers' uploads spread over prefixes (``checkpointSpreadPrefixes``, the client's
``UploadSettings.spread_prefixes``) each grant on ``prefix*`` also names ``??/prefix*`` (one
``?`` per hex digit of the spread), the keys the spread writes and nothing else.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from cdk_nag import NagPackSuppression, NagSuppressions, RegexAppliesTo
from constructs import Construct

from infra.settings import CheckpointStoreSettings

OBJECT_WRITE_ACTIONS = ("s3:PutObject", "s3:AbortMultipartUpload")
OBJECT_READ_ACTIONS = ("s3:GetObject", "s3:GetObjectVersion")
# Incomplete multipart uploads are billed until aborted; a killed upload is redone under a new id.
ABORT_INCOMPLETE_UPLOADS_AFTER = Duration.days(7)


class CheckpointStore(Construct):
    """``bucket`` (imported or created), the trainer ``statements`` and ``reconcile_policy``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        store: CheckpointStoreSettings,
        queue: sqs.IQueue,
    ) -> None:
        super().__init__(scope, construct_id)
        self.store = store
        if store.bucket is None:
            self.bucket: s3.IBucket = self._create_bucket()
        else:
            self.bucket = s3.Bucket.from_bucket_name(self, "Bucket", store.bucket)
        # With the trainers' spread (``checkpointSpreadPrefixes``) the objects are also at
        # ``<hex>/prefix…``: one ``?`` per hex digit matches exactly those keys.
        patterns = [f"{store.prefix}*"]
        if store.spread_width and store.prefix:
            patterns.append(f"{'?' * store.spread_width}/{store.prefix}*")
        objects = [self.bucket.arn_for_objects(p) for p in patterns]
        listing = iam.PolicyStatement(
            sid="ListCheckpointPrefix",
            actions=["s3:ListBucket"],
            resources=[self.bucket.bucket_arn],
            conditions=({"StringLike": {"s3:prefix": patterns}} if store.prefix else None),
        )
        uploads = iam.PolicyStatement(
            sid="ListOpenUploads",
            actions=["s3:ListBucketMultipartUploads"],
            resources=[self.bucket.bucket_arn],
        )
        self.trainer_statements = [
            iam.PolicyStatement(
                sid="WriteAndReadCheckpoints",
                actions=[*OBJECT_WRITE_ACTIONS, *OBJECT_READ_ACTIONS],
                resources=objects,
            ),
            listing,
            uploads,
        ]
        self.reconcile_policy = iam.ManagedPolicy(
            self,
            "ReconcilePolicy",
            description="ckpt-pipeline reconcile: read and list the checkpoint prefix, backfill",
            statements=[
                iam.PolicyStatement(
                    sid="ReadCheckpoints", actions=list(OBJECT_READ_ACTIONS), resources=objects
                ),
                listing,
                uploads,
                iam.PolicyStatement(
                    sid="BackfillReports",
                    actions=["sqs:SendMessage"],
                    resources=[queue.queue_arn],
                ),
            ],
        )
        suppress_prefix_wildcard(self.reconcile_policy)

    def _noncurrent_rule(self) -> list[s3.LifecycleRule]:
        """Versioning keeps every overwritten or deleted version until a rule removes it
        (https://docs.aws.amazon.com/AmazonS3/latest/userguide/lifecycle-configuration-examples.html,
        "Removing noncurrent versions"): S3 deletes them ``noncurrent_days`` after they stop being
        current (checkpointNoncurrentDays; 0 keeps them forever)."""
        days = self.store.noncurrent_days
        if days is None:
            return []
        return [
            s3.LifecycleRule(
                id="ExpireNoncurrentVersions",
                noncurrent_version_expiration=Duration.days(days),
            )
        ]

    def _create_bucket(self) -> s3.Bucket:
        bucket = s3.Bucket(
            self,
            "Bucket",
            # Versioned: a pinned VersionId tells a later write to a reported key apart.
            versioned=True,
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            enforce_ssl=True,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="AbortIncompleteUploads",
                    abort_incomplete_multipart_upload_after=ABORT_INCOMPLETE_UPLOADS_AFTER,
                ),
                *self._noncurrent_rule(),
            ],
            # Never deleted with the stack: the checkpoints are the jobs', not the pipeline's.
            removal_policy=RemovalPolicy.RETAIN,
        )
        NagSuppressions.add_resource_suppressions(
            bucket,
            [
                NagPackSuppression(
                    id="AwsSolutions-S1",
                    reason="Server access logs need a second bucket whose retention is the "
                    "account's policy; object-level auditing belongs to CloudTrail data events, "
                    "which the account configures (README, 'The checkpoint bucket').",
                )
            ],
        )
        return bucket


def suppress_prefix_wildcard(policy: iam.ManagedPolicy) -> None:
    """cdk-nag's IAM5 for the one wildcard these policies use: the objects under the prefix."""
    NagSuppressions.add_resource_suppressions(
        policy,
        [
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="Checkpoint objects are named by the jobs (step, rank, file): access is "
                "scoped to the configured bucket and key prefix, the narrowest resource S3 "
                "offers for keys not known in advance.",
                # The objects under the prefix of an imported bucket, or of the created one.
                applies_to=[
                    RegexAppliesTo(
                        regex=r"/^Resource::(arn:<AWS::Partition>:s3:::[^\/]+\/"
                        r"|<CheckpointStoreBucket[0-9A-Za-z]+\.Arn>\/)[^*]*\*$/g"
                    )
                ],
            )
        ],
    )

"""The optional checkpoint bucket/prefix: context rules, least-privilege grants, no bucket made or
deleted unless asked, cdk-nag and cfn-lint clean (real synth)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cfnlint.api import ManualArgs, lint  # type: ignore[import-untyped]

from infra.alarm_topic import NO_SUBSCRIBER_WARNING
from infra.exceptions import SettingsError
from infra.settings import CheckpointStoreSettings, load_settings
from tests.infra.conftest import DEFAULT_CONTEXT, EXISTING_CONTEXT, Synth, synthesize
from tests.infra.test_compliance import CFN_LINT_IGNORED

EXISTING_BUCKET = {"checkpointBucket": "ml-checkpoints", "checkpointPrefix": "team-a/runs"}


@pytest.fixture(scope="module")
def existing_bucket(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The team's stack with the seed's bucket, ``ml-checkpoints``, under one prefix."""
    return synthesize({**EXISTING_CONTEXT, **EXISTING_BUCKET}, tmp_path_factory.mktemp("eb"))


@pytest.fixture(scope="module")
def created_bucket(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """Greenfield, the stack asked to create the bucket (whole bucket, no prefix)."""
    return synthesize({"createCheckpointBucket": "true"}, tmp_path_factory.mktemp("cb"))


def _statements(synth: Synth, description_part: str) -> list[dict[str, Any]]:
    policies = [
        p["Properties"]
        for p in synth.resources("AWS::IAM::ManagedPolicy").values()
        if description_part in p["Properties"]["Description"]
    ]
    assert len(policies) == 1, policies
    return list(policies[0]["PolicyDocument"]["Statement"])


def _arn(*parts: str) -> dict[str, Any]:
    return {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, *parts]]}


def test_the_context_rules_name_the_key() -> None:
    def load(**overrides: Any) -> CheckpointStoreSettings | None:
        return load_settings({**DEFAULT_CONTEXT, **overrides}.get).checkpoint_store

    assert load() is None
    assert load(**EXISTING_BUCKET) == CheckpointStoreSettings("ml-checkpoints", "team-a/runs/")
    assert load(createCheckpointBucket="true") == CheckpointStoreSettings(None, "", 30)
    assert load(createCheckpointBucket="true", checkpointNoncurrentDays="7") == (
        CheckpointStoreSettings(None, "", 7)
    )
    # 0: noncurrent versions are kept forever (no rule)
    assert load(createCheckpointBucket="true", checkpointNoncurrentDays=0) == (
        CheckpointStoreSettings(None, "", None)
    )
    spread = load(**EXISTING_BUCKET, checkpointSpreadPrefixes="4096")
    assert spread == CheckpointStoreSettings("ml-checkpoints", "team-a/runs/", spread_prefixes=4096)
    assert spread.spread_width == 3
    for overrides, key, rule in (
        (
            {**EXISTING_BUCKET, "checkpointSpreadPrefixes": "100"},
            "checkpointSpreadPrefixes",
            "must be 0 or 16, 256, 4096 or 65536",
        ),
        ({"checkpointPrefix": "x/"}, "checkpointPrefix", "only used with checkpointBucket"),
        (
            {"checkpointBucket": "b-1", "createCheckpointBucket": True},
            "checkpointBucket",
            "conflicts with createCheckpointBucket",
        ),
        ({"checkpointBucket": "Bad_Bucket"}, "checkpointBucket", "must be an S3 bucket name"),
        ({"checkpointBucket": "a..b"}, "checkpointBucket", "must be an S3 bucket name"),
        (
            {"checkpointBucket": "ok-b", "checkpointPrefix": "/abs"},
            "checkpointPrefix",
            "no leading",
        ),
        ({"checkpointBucket": "ok-b", "checkpointPrefix": "a*"}, "checkpointPrefix", "no '*'"),
        (
            {"checkpointBucket": "ok-b", "checkpointNoncurrentDays": "7"},
            "checkpointNoncurrentDays",
            "only used with createCheckpointBucket=true",
        ),
        (
            {"createCheckpointBucket": True, "checkpointNoncurrentDays": "-1"},
            "checkpointNoncurrentDays",
            "between 0 and 36500",
        ),
    ):
        with pytest.raises(SettingsError) as caught:
            load(**overrides)
        assert caught.value.name == key and rule in caught.value.rule, caught.value


def test_no_bucket_configured_means_no_s3_anywhere(any_synth: Synth) -> None:
    assert any_synth.resources("AWS::S3::Bucket") == {}
    assert "s3:" not in json.dumps(any_synth.json["Resources"])
    assert "ReconcilePolicyArn" not in any_synth.json["Outputs"]


def test_an_existing_bucket_is_referred_to_never_created(existing_bucket: Synth) -> None:
    assert existing_bucket.resources("AWS::S3::Bucket") == {}
    bucket = _arn(":s3:::ml-checkpoints")
    objects = _arn(":s3:::ml-checkpoints/team-a/runs/*")
    listing = {
        "Sid": "ListCheckpointPrefix",
        "Effect": "Allow",
        "Action": "s3:ListBucket",
        "Resource": bucket,
        "Condition": {"StringLike": {"s3:prefix": ["team-a/runs/*"]}},
    }
    uploads = {
        "Sid": "ListOpenUploads",
        "Effect": "Allow",
        "Action": "s3:ListBucketMultipartUploads",
        "Resource": bucket,
    }
    trainer = _statements(existing_bucket, "Send checkpoint reports")
    assert trainer[1:] == [
        {
            "Sid": "WriteAndReadCheckpoints",
            "Effect": "Allow",
            # (minimizePolicies sorts the actions)
            "Action": [
                "s3:AbortMultipartUpload",
                "s3:GetObject",
                "s3:GetObjectVersion",
                "s3:PutObject",
            ],
            "Resource": objects,
        },
        listing,
        uploads,
    ]
    reconcile = _statements(existing_bucket, "ckpt-pipeline reconcile")
    assert reconcile[0] == {
        "Sid": "ReadCheckpoints",
        "Effect": "Allow",
        "Action": ["s3:GetObject", "s3:GetObjectVersion"],
        "Resource": objects,
    }
    assert reconcile[1:3] == [listing, uploads]
    assert reconcile[3]["Action"] == "sqs:SendMessage"
    # Reconcile never writes or deletes an object.
    assert not any("Put" in str(s["Action"]) or "Delete" in str(s["Action"]) for s in reconcile)
    outputs = existing_bucket.json["Outputs"]
    assert outputs["CheckpointBucketName"]["Value"] == "ml-checkpoints"
    assert "Ref" in outputs["ReconcilePolicyArn"]["Value"]


def test_a_bucket_is_created_only_when_asked_and_is_never_deleted(created_bucket: Synth) -> None:
    (logical_id, bucket), *_ = created_bucket.resources("AWS::S3::Bucket").items()
    assert len(created_bucket.resources("AWS::S3::Bucket")) == 1
    assert bucket["DeletionPolicy"] == bucket["UpdateReplacePolicy"] == "Retain"
    props = bucket["Properties"]
    assert "BucketName" not in props  # CloudFormation names it (account-global names)
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert props["LifecycleConfiguration"]["Rules"] == [
        {
            "Id": "AbortIncompleteUploads",
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 7},
            "Status": "Enabled",
        },
        # Every overwrite or prune keeps a noncurrent version: removed after the default 30 days
        # (checkpointNoncurrentDays), not kept forever (issue 45).
        {
            "Id": "ExpireNoncurrentVersions",
            "NoncurrentVersionExpiration": {"NoncurrentDays": 30},
            "Status": "Enabled",
        },
    ]
    # The whole bucket (no prefix): listing needs no condition.
    trainer = _statements(created_bucket, "Send checkpoint reports")
    assert trainer[2] == {
        "Sid": "ListCheckpointPrefix",
        "Effect": "Allow",
        "Action": "s3:ListBucket",
        "Resource": {"Fn::GetAtt": [logical_id, "Arn"]},
    }
    assert "Delete" not in json.dumps(trainer)


@pytest.mark.slow  # synthesizes (request.getfixturevalue)
@pytest.mark.parametrize("which", ["existing_bucket", "created_bucket"])
def test_cdk_nag_and_cfn_lint_stay_clean(which: str, request: pytest.FixtureRequest) -> None:
    synth: Synth = request.getfixturevalue(which)
    assert synth.messages("error") == []
    assert [w for w in synth.messages("warning") if NO_SUBSCRIBER_WARNING not in w] == []
    matches = lint(
        json.dumps(synth.json),
        regions=["eu-west-1"],
        config=ManualArgs(ignore_checks=CFN_LINT_IGNORED),
    )
    assert [f"{m.rule.id} {m.path_string}: {m.message}" for m in matches] == []


def test_the_trainer_grants_cover_the_clients_s3_calls() -> None:
    # Every S3 operation the trainer-side code calls, and the action S3 authorizes it with
    # (https://docs.aws.amazon.com/AmazonS3/latest/API/API_Operations.html; the multipart
    # operations are authorized by s3:PutObject; HeadObject by s3:GetObject).
    authorized_by = {
        "put_object": "s3:PutObject",
        "upload_fileobj": "s3:PutObject",
        "abort_multipart_upload": "s3:AbortMultipartUpload",
        "head_object": "s3:GetObject",
        "get_object": "s3:GetObject",
        "list_objects_v2": "s3:ListBucket",
        "list_multipart_uploads": "s3:ListBucketMultipartUploads",
        "get_paginator": None,
    }
    from infra.checkpoint_store import OBJECT_READ_ACTIONS, OBJECT_WRITE_ACTIONS

    granted = {*OBJECT_READ_ACTIONS, *OBJECT_WRITE_ACTIONS, "s3:ListBucket"}
    granted.add("s3:ListBucketMultipartUploads")
    root = Path(__file__).resolve().parents[2] / "trainer_client"
    used = set()
    for module in ("storage/s3_upload.py", "storage/s3_pins.py", "storage/verify.py"):
        text = (root / module).read_text()
        used |= {name for name in authorized_by if f".{name}(" in text or f'"{name}"' in text}
    assert used - set(authorized_by) == set()
    assert {authorized_by[name] for name in used} - {None} <= granted


def test_a_spread_store_grants_the_spread_keys_too(tmp_path: Path) -> None:
    from trainer_client.storage.uri import SPREAD_PREFIXES

    # GIVEN the trainers upload spread over 256 prefixes (the same counts as the client allows)
    assert {CheckpointStoreSettings("b", "p/", spread_prefixes=n).spread_width for n in
            SPREAD_PREFIXES} == {1, 2, 3, 4}  # fmt: skip
    synth = synthesize(
        {**EXISTING_CONTEXT, **EXISTING_BUCKET, "checkpointSpreadPrefixes": 256}, tmp_path
    )
    # THEN the trainer and reconcile policies cover ??/team-a/runs/* beside team-a/runs/*
    objects = [
        _arn(":s3:::ml-checkpoints/team-a/runs/*"),
        _arn(":s3:::ml-checkpoints/??/team-a/runs/*"),
    ]
    for description in ("Send checkpoint reports", "ckpt-pipeline reconcile"):
        statements = _statements(synth, description)
        granted = next(
            s for s in statements if s["Sid"] in ("WriteAndReadCheckpoints", "ReadCheckpoints")
        )
        # (minimizePolicies sorts the resources)
        assert sorted(granted["Resource"], key=json.dumps) == sorted(objects, key=json.dumps)
        listing = next(s for s in statements if s["Sid"] == "ListCheckpointPrefix")
        assert sorted(listing["Condition"]["StringLike"]["s3:prefix"]) == [
            "??/team-a/runs/*",
            "team-a/runs/*",
        ]
    # AND cdk-nag stays clean (the prefix wildcard's suppression covers the spread one)
    assert synth.messages("error") == []
    assert [w for w in synth.messages("warning") if NO_SUBSCRIBER_WARNING not in w] == []

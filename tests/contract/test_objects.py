"""Pinned objects in ``ckpt.v1``: an optional, additive field that today's readers keep."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from ckpt_contract import InvalidMessage, StoredObject, decode, encode
from tests.contract.test_message import valid_fields

DATA = b"checkpoint bytes"
SHA256_B64 = base64.b64encode(hashlib.sha256(DATA).digest()).decode()
PIN: dict[str, Any] = {
    "uri": "s3://bucket/job-1/step-100/rank-3.pt",
    "bytes": len(DATA),
    "sha256": hashlib.sha256(DATA).hexdigest(),
    "checksum_algorithm": "SHA256",
    "checksum": SHA256_B64,
    "checksum_type": "FULL_OBJECT",
    "etag": '"5d41402abc4b2a76b9719d911017c592"',
    "version_id": "3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY",
}
# The body encoding of a report as every release wrote it before pins existed (the field list of
# tests/contract/test_message.py's valid_fields, in the model's order).
LEGACY_KEYS = [
    "schema", "job_id", "run_attempt", "step", "epoch", "world_size", "rank", "uri", "loss",
    "metrics", "bytes", "sha256", "created_at",
]  # fmt: skip


def test_pins_round_trip_and_absent_pins_are_left_out_of_the_body() -> None:
    report = decode(json.dumps(valid_fields(bytes=len(DATA), objects=[PIN])))
    assert report.objects == [StoredObject(**PIN)]
    assert decode(encode(report)) == report
    partial = decode(json.dumps(valid_fields(objects=[{"uri": "file:///c/a.pt", "bytes": 1}])))
    assert json.loads(encode(partial))["objects"] == [{"uri": "file:///c/a.pt", "bytes": 1}]


def test_a_report_without_pins_encodes_exactly_as_before() -> None:
    # GIVEN a report that pins nothing WHEN encoded THEN no "objects" key: the body is the
    # previous release's, byte for byte, so its readers and dedup see nothing new.
    body = json.loads(encode(decode(json.dumps(valid_fields()))))
    assert list(body) == LEGACY_KEYS


@pytest.mark.parametrize(
    ("pin", "field", "rule"),
    [
        ({"checksum": SHA256_B64}, "objects.0", "checksum and checksum_algorithm go together"),
        ({"checksum_algorithm": "SHA256"}, "objects.0", "go together"),
        ({"checksum_algorithm": "MD5", "checksum": SHA256_B64}, "checksum_algorithm", "Input"),
        ({"checksum_algorithm": "SHA256", "checksum": "not base64!"}, "checksum", "pattern"),
        ({"checksum_type": "COMPOSITE"}, "objects.0", "checksum_type needs a checksum"),
        ({"etag": "has space"}, "etag", "pattern"),
        ({"bytes": -1}, "bytes", "greater than or equal to 0"),
        ({"md5": "x"}, "md5", "Extra inputs are not permitted"),
        ({"sha256": "AB" * 32}, "sha256", "pattern"),
    ],
)
def test_each_bad_pin_is_refused_naming_the_field(
    pin: dict[str, Any], field: str, rule: str
) -> None:
    obj = {"uri": "s3://b/k", "bytes": 1, **pin}
    with pytest.raises(InvalidMessage) as caught:
        decode(json.dumps(valid_fields(objects=[obj])))
    assert any(e.field.endswith(field) or e.field == field for e in caught.value.errors), (
        caught.value.errors
    )
    assert any(rule in e.rule for e in caught.value.errors), caught.value.errors


def test_bytes_must_be_the_objects_total_and_the_list_is_bounded() -> None:
    with pytest.raises(InvalidMessage, match=r"bytes \(5\) must be the objects' total \(16\)"):
        decode(json.dumps(valid_fields(bytes=5, objects=[PIN])))
    with pytest.raises(InvalidMessage, match="objects"):
        decode(json.dumps(valid_fields(objects=[])))


def test_an_unstorable_character_in_an_object_uri_is_refused() -> None:
    with pytest.raises(InvalidMessage, match=r"objects\.0\.uri: contains U\+0000"):
        decode(json.dumps(valid_fields(objects=[{"uri": "s3://b/\x00", "bytes": 1}])))


def test_full_object_checksum_is_known_only_when_something_says_so() -> None:
    assert StoredObject(**PIN).full_object_checksum
    single = {k: v for k, v in PIN.items() if k != "checksum_type"}
    assert StoredObject(**single).full_object_checksum  # single-part ETag, plain value
    assert not StoredObject(**{**single, "etag": '"abc-3"'}).full_object_checksum
    assert not StoredObject(**{**single, "checksum": SHA256_B64 + "-3"}).full_object_checksum
    assert not StoredObject(**{**PIN, "checksum_type": "COMPOSITE"}).full_object_checksum


def _previous_release_message_module() -> types.ModuleType:
    """ckpt_contract/message.py as the last release without pins wrote it (from git)."""
    root = Path(__file__).resolve().parents[2]
    try:
        text = subprocess.run(
            ["git", "-C", str(root), "show", f"{PREVIOUS_RELEASE}:ckpt_contract/message.py"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the previous release is not in this clone's history: {exc}")
    module = types.ModuleType("previous_message")
    sys.modules["previous_message"] = module
    try:
        exec(compile(text, "previous/message.py", "exec"), module.__dict__)
    finally:
        del sys.modules["previous_message"]
    return module


# The last commit whose contract had no "objects" field.
PREVIOUS_RELEASE = "6816343"


def test_the_previous_releases_reader_keeps_the_pins_as_an_extra_field() -> None:
    # GIVEN the body of a report with pins WHEN the previous release's decode reads it THEN it
    # is valid and the pins are kept as an unknown field (stored in the row's extra by that
    # writer), every known field unchanged.
    previous = _previous_release_message_module()
    text = encode(decode(json.dumps(valid_fields(bytes=len(DATA), objects=[PIN]))))
    old = previous.decode(text)
    assert old.extra == {"objects": [PIN]}
    assert (old.uri, old.bytes, old.step, old.rank) == (PIN["uri"], len(DATA), 100, 3)

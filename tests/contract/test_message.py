"""The ckpt.v1 contract: round-trips, identity ids and rejections that name the field."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_contract import (
    MAX_BODY_BYTES,
    CheckpointReport,
    InvalidMessage,
    MessageTooLarge,
    decode,
    dedup_id,
    encode,
    group_id,
)

JOB_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-"
job_ids = st.text(alphabet=JOB_CHARS, min_size=1, max_size=128)
finite = st.floats(allow_nan=False, allow_infinity=False)
INT64_MAX = 2**63 - 1
# Text every hop stores: no NUL (PostgreSQL), no U+FFFE/U+FFFF (SQS), no surrogates (not UTF-8).
UNSTORABLE = "\x00\ufffe\uffff"
storable_chars = st.characters(exclude_categories=["Cs"], exclude_characters=UNSTORABLE)
timestamps = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)


@st.composite
def reports(draw: st.DrawFn) -> CheckpointReport:
    world_size = draw(st.integers(1, 1_000_000))
    return CheckpointReport.create(
        job_id=draw(job_ids),
        run_attempt=draw(st.integers(0, 2**31 - 1)),
        step=draw(st.integers(0, INT64_MAX)),
        epoch=draw(st.integers(0, INT64_MAX)),
        world_size=world_size,
        rank=draw(st.integers(0, world_size - 1)),
        uri=draw(st.text(storable_chars, min_size=1, max_size=300)),
        loss=draw(st.none() | finite),
        metrics=draw(
            st.dictionaries(st.text(storable_chars, min_size=1, max_size=20), finite, max_size=8)
        ),
        bytes=draw(st.none() | st.integers(0, INT64_MAX)),
        sha256=draw(st.none() | st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)),
        created_at=draw(timestamps),
    )


def valid_fields(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "schema": "ckpt.v1",
        "job_id": "job-1",
        "run_attempt": 0,
        "step": 100,
        "epoch": 1,
        "world_size": 8,
        "rank": 3,
        "uri": "s3://bucket/job-1/step-100/rank-3.pt",
        "loss": 0.25,
        "metrics": {"acc": 0.9},
        "created_at": "2026-12-02T10:00:00.000000Z",
    }
    fields.update(overrides)
    return fields


def body(**overrides: Any) -> str:
    return json.dumps(valid_fields(**overrides))


@given(reports())
@settings(max_examples=200)
def test_encode_decode_round_trip(report: CheckpointReport) -> None:
    # GIVEN any valid report WHEN encoded and decoded THEN it is unchanged, ids included
    decoded = decode(encode(report))
    assert decoded == report
    assert decoded.dedup_id == report.dedup_id
    assert decoded.group_id == report.group_id


@given(reports())
def test_sqs_ids_fit_sqs_limits(report: CheckpointReport) -> None:
    assert len(report.dedup_id) == 64
    assert len(report.group_id) <= 128


def test_dedup_id_is_identity_not_content() -> None:
    a = decode(body(loss=0.1))
    b = decode(body(loss=0.2, uri="file:///elsewhere"))
    assert a.dedup_id == b.dedup_id
    assert decode(body(run_attempt=1)).dedup_id != a.dedup_id
    assert decode(body(step=101)).dedup_id != a.dedup_id
    assert decode(body(rank=4)).dedup_id != a.dedup_id
    # Known vector: sha256 of "job-1|0|100|3", computed outside the contract.
    known = "395d2e0451e2a460b24b573375a61e6433c7e877f845933552c8f5ed1d955dcb"
    assert a.dedup_id == dedup_id("job-1", 0, 100, 3) == known


@pytest.mark.parametrize(
    ("field", "limit"),
    [("step", INT64_MAX), ("epoch", INT64_MAX), ("bytes", INT64_MAX), ("run_attempt", 2**31 - 1)],
)
def test_integers_beyond_their_column_are_rejected_at_the_boundary(field: str, limit: int) -> None:
    assert decode(body(**{field: limit}))
    with pytest.raises(InvalidMessage) as caught:
        decode(body(**{field: limit + 1}))
    assert caught.value.fields == (field,)


@given(st.text(min_size=1, max_size=40))
def test_text_is_accepted_exactly_when_every_hop_can_store_it(text: str) -> None:
    storable = not any(c in UNSTORABLE or 0xD800 <= ord(c) <= 0xDFFF for c in text)
    for where in ("uri", "metric", "extra"):
        fields = valid_fields(created_at=datetime(2026, 12, 2, tzinfo=UTC))
        if where == "uri":
            fields["uri"] = text
        elif where == "metric":
            fields["metrics"] = {text: 1.0}
        else:
            fields["note"] = {"k": [text]}
        try:
            report = CheckpointReport.create(**fields)
        except InvalidMessage as exc:
            assert not storable, exc
            continue
        assert storable
        # What is accepted survives the wire: SQS-legal UTF-8 that decodes to the same report.
        wire = encode(report)
        wire.encode("utf-8")
        assert decode(wire) == report


@pytest.mark.parametrize(
    ("uri", "char"),
    [
        ("s3://b/\x00.pt", "U+0000"),  # all ASCII: found without the pattern
        ("s3://b/\u00e9\x00.pt", "U+0000"),
        ("s3://b/\u00e9\ufffe\x00.pt", "U+FFFE"),
        ("s3://b/\uffff.pt", "U+FFFF"),
    ],
)
def test_the_first_unstorable_character_is_named(uri: str, char: str) -> None:
    with pytest.raises(InvalidMessage) as caught:
        CheckpointReport.create(
            **valid_fields(uri=uri, created_at=datetime(2026, 12, 2, tzinfo=UTC))
        )
    assert [str(e) for e in caught.value.errors] == [
        f"uri: contains {char}, which no hop can store"
    ]


@pytest.mark.parametrize("value", [math.nan, math.inf, {1, 2}, object()])
def test_extras_must_be_finite_json(value: Any) -> None:
    with pytest.raises(InvalidMessage) as caught:
        CheckpointReport.create(
            **valid_fields(note={"deep": [value]}, created_at=datetime(2026, 12, 2, tzinfo=UTC))
        )
    assert caught.value.fields == ("note.deep.0",)


def test_group_id_is_job_and_rank() -> None:
    assert group_id("job-1", 3) == "job-1:3"


@given(st.text(alphabet=JOB_CHARS, min_size=120, max_size=128), st.integers(0, 999_999))
def test_long_job_ids_get_distinct_bounded_group_ids(job_id: str, rank: int) -> None:
    gid = group_id(job_id, rank)
    assert len(gid) <= 128
    assert gid.endswith(f":{rank}")
    assert group_id(job_id + "x" if len(job_id) < 128 else job_id[:-1], rank) != gid


def test_unknown_fields_are_kept() -> None:
    report = decode(body(optimizer={"lr": 0.1}, note="ok"))
    assert report.extra == {"optimizer": {"lr": 0.1}, "note": "ok"}
    assert json.loads(encode(report))["optimizer"] == {"lr": 0.1}


def test_timestamps_are_normalised_to_utc() -> None:
    report = decode(body(created_at="2026-12-02T12:00:00+02:00"))
    assert report.created_at == datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
    assert json.loads(encode(report))["created_at"] == "2026-12-02T10:00:00.000000Z"


@pytest.mark.parametrize(
    ("overrides", "field", "rule"),
    [
        ({"schema": "ckpt.v2"}, "schema", "'ckpt.v1'"),
        ({"job_id": ""}, "job_id", "pattern"),
        ({"job_id": "has space"}, "job_id", "pattern"),
        ({"job_id": "jöb"}, "job_id", "pattern"),
        ({"job_id": "x" * 129}, "job_id", "pattern"),
        ({"job_id": "job\n"}, "job_id", "pattern"),
        ({"job_id": "a'; DROP TABLE training_checkpoints;--"}, "job_id", "pattern"),
        ({"run_attempt": -1}, "run_attempt", "greater than or equal to 0"),
        ({"step": -5}, "step", "greater than or equal to 0"),
        ({"step": "5"}, "step", "valid integer"),
        ({"step": 5.0}, "step", "valid integer"),
        ({"rank": True}, "rank", "valid integer"),
        ({"epoch": None}, "epoch", "valid integer"),
        ({"rank": 8}, "rank", "must be < world_size (8)"),
        ({"world_size": 0, "rank": 0}, "world_size", "greater than or equal to 1"),
        ({"world_size": 1_000_001}, "world_size", "less than or equal to 1000000"),
        ({"uri": ""}, "uri", "at least 1 character"),
        ({"uri": "s3://" + "x" * 2048}, "uri", "at most 2048"),
        ({"loss": "0.5"}, "loss", "valid number"),
        ({"metrics": {"acc": "high"}}, "metrics.acc", "valid number"),
        ({"metrics": [1, 2]}, "metrics", "object"),
        ({"bytes": -1}, "bytes", "greater than or equal to 0"),
        ({"sha256": "XYZ"}, "sha256", "pattern"),
        ({"created_at": "yesterday"}, "created_at", "datetime"),
        ({"created_at": "2026-12-02T10:00:00"}, "created_at", "timezone"),
    ],
)
def test_rejections_name_field_and_rule(overrides: dict[str, Any], field: str, rule: str) -> None:
    with pytest.raises(InvalidMessage) as caught:
        decode(body(**overrides))
    assert field in caught.value.fields
    assert any(rule in e.rule for e in caught.value.errors if e.field == field), caught.value


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("where", ["loss", "metric"])
def test_non_finite_numbers_are_rejected(token: str, where: str) -> None:
    raw = body(loss=1.5) if where == "loss" else body(metrics={"m": 1.5})
    with pytest.raises(InvalidMessage) as caught:
        decode(raw.replace("1.5", token))
    assert caught.value.fields == (("loss",) if where == "loss" else ("metrics.m",))
    assert "finite" in str(caught.value)


@given(st.sampled_from([math.nan, math.inf, -math.inf]))
def test_create_rejects_non_finite_loss(value: float) -> None:
    fields = valid_fields(loss=value, created_at=datetime.now(UTC))
    with pytest.raises(InvalidMessage, match="loss"):
        CheckpointReport.create(**fields)


@pytest.mark.parametrize(
    "raw", ["", "not json", "[1, 2]", "null", '"a string"', '{"schema": "ckpt.v1"', b"\xff\xfe"]
)
def test_undecodable_bodies_are_rejected_as_a_whole(raw: str | bytes) -> None:
    with pytest.raises(InvalidMessage) as caught:
        decode(raw)
    assert caught.value.fields[0] == "<body>"


def test_missing_schema_is_rejected() -> None:
    fields = valid_fields()
    del fields["schema"]
    with pytest.raises(InvalidMessage) as caught:
        decode(json.dumps(fields))
    assert caught.value.fields == ("schema",)


def test_missing_fields_are_each_named() -> None:
    with pytest.raises(InvalidMessage) as caught:
        decode('{"schema": "ckpt.v1", "job_id": "j"}')
    assert set(caught.value.fields) >= {"run_attempt", "step", "epoch", "world_size", "rank", "uri"}


def test_oversize_is_rejected_on_encode_and_decode() -> None:
    big = {f"m{i}": float(i) for i in range(200)}
    fields = valid_fields(metrics=big, created_at=datetime.now(UTC), padding="x" * MAX_BODY_BYTES)
    report = CheckpointReport.create(**fields)
    with pytest.raises(MessageTooLarge, match="exceeds the limit"):
        encode(report)
    with pytest.raises(MessageTooLarge):
        decode(body(padding="x" * MAX_BODY_BYTES))


def test_too_many_metrics_is_rejected() -> None:
    with pytest.raises(InvalidMessage, match="metrics"):
        decode(body(metrics={f"m{i}": 1.0 for i in range(257)}))


@given(
    st.dictionaries(
        st.sampled_from(["step", "rank", "world_size", "epoch", "run_attempt", "loss"]),
        st.one_of(st.text(max_size=5), st.booleans(), st.lists(st.integers(), max_size=2)),
        min_size=1,
    )
)
def test_wrong_types_are_rejected_and_named(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidMessage) as caught:
        decode(body(**bad))
    assert set(caught.value.fields) & set(bad)


def test_create_requires_aware_datetime() -> None:
    naive = datetime(2026, 1, 1)
    with pytest.raises(InvalidMessage, match="created_at"):
        CheckpointReport.create(**valid_fields(created_at=naive))
    aware = datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=-5)))
    assert CheckpointReport.create(**valid_fields(created_at=aware)).created_at.tzinfo == UTC

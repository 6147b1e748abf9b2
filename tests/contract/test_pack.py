"""The ``ckpt.pack.v1`` body: built from encoded reports, split back into them, bounded."""

from __future__ import annotations

import json

import pytest

from ckpt_contract import InvalidMessage, MessageTooLarge, dedup_id
from ckpt_contract.pack import (
    MAX_PACK_BYTES,
    MAX_PACK_REPORTS,
    encode_pack,
    pack_dedup_id,
    pack_size,
    split_pack,
)
from tests.reports import body


def test_a_pack_splits_back_into_its_reports() -> None:
    bodies = [body(rank=r, world_size=8) for r in range(8)]
    packed = encode_pack(bodies)
    assert len(packed.encode()) == pack_size(sum(len(b.encode()) for b in bodies), 8)
    assert [json.loads(b) for b in split_pack(packed) or []] == [json.loads(b) for b in bodies]


def test_a_report_is_not_a_pack() -> None:
    assert split_pack(body()) is None
    assert split_pack("garbage") is None


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"schema":"ckpt.pack.v1","reports":7}', "reports"),
        ('{"schema":"ckpt.pack.v1","reports":[]}', "reports"),
        ('{"schema":"ckpt.pack.v1","reports":[', "<body>"),
    ],
)
def test_a_malformed_pack_names_the_field(text: str, field: str) -> None:
    with pytest.raises(InvalidMessage) as err:
        split_pack(text)
    assert err.value.fields == (field,)


def test_packs_are_bounded_by_reports_and_bytes() -> None:
    with pytest.raises(InvalidMessage, match="reports"):
        encode_pack([])
    with pytest.raises(InvalidMessage, match="reports"):
        encode_pack([body()] * (MAX_PACK_REPORTS + 1))
    big = body(extra={"note": "x" * 60_000})
    with pytest.raises(MessageTooLarge, match=str(MAX_PACK_BYTES)):
        encode_pack([big] * 5)


def test_the_pack_dedup_id_is_its_members_in_any_order() -> None:
    ids = [dedup_id("job-a", 0, 10, r) for r in range(8)]
    assert pack_dedup_id(ids) == pack_dedup_id(list(reversed(ids)))
    assert pack_dedup_id(ids) != pack_dedup_id(ids[:7])
    assert len(pack_dedup_id(ids)) <= 128

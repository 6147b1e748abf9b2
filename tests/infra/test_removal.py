"""Removal policies: what holds data outlives the stack, consistently; throwaway stacks clean up."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.infra.conftest import Synth, synthesize


def _policies(synth: Synth, cfn_type: str) -> list[tuple[str | None, str | None]]:
    return [
        (r.get("DeletionPolicy"), r.get("UpdateReplacePolicy"))
        for r in synth.resources(cfn_type).values()
    ]


def _secret(synth: Synth, *, master: bool) -> Mapping[str, Any]:
    user = synth.settings.db_master_user if master else "ckpt_writer"
    (secret,) = [
        r
        for r in synth.resources("AWS::SecretsManager::Secret").values()
        if f'"username":"{user}"' in r["Properties"]["GenerateSecretString"]["SecretStringTemplate"]
    ]
    return secret


def test_greenfield_keeps_queues_database_and_its_master_secret(greenfield: Synth) -> None:
    assert _policies(greenfield, "AWS::SQS::Queue") == [("Retain", "Retain")] * 2
    assert _policies(greenfield, "AWS::RDS::DBInstance") == [("Snapshot", "Snapshot")]
    # A snapshot cannot be opened without the master password it was taken with.
    assert _secret(greenfield, master=True)["DeletionPolicy"] == "Retain"
    # ckpt_writer's password is re-set by the next stack's migration from its own new secret.
    assert _secret(greenfield, master=False)["DeletionPolicy"] == "Delete"
    # The alarm topic's key encrypts nothing that outlives the topic.
    assert _policies(greenfield, "AWS::KMS::Key") == [("Delete", "Delete")]


def test_existing_database_stack_keeps_its_queues(existing: Synth) -> None:
    assert _policies(existing, "AWS::SQS::Queue") == [("Retain", "Retain")] * 2
    assert not existing.resources("AWS::RDS::DBInstance")
    assert _policies(existing, "AWS::KMS::Key") == [("Delete", "Delete")]


@pytest.fixture(scope="module")
def throwaway(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """Greenfield with deletion protection switched off: an environment meant to be deleted."""
    tmp: Path = tmp_path_factory.mktemp("throwaway")
    return synthesize({"dbDeletionProtection": "false"}, tmp)


def test_throwaway_stack_deletes_everything_it_made(throwaway: Synth) -> None:
    assert not throwaway.settings.retains_data
    assert _policies(throwaway, "AWS::SQS::Queue") == [("Delete", "Delete")] * 2
    assert _policies(throwaway, "AWS::RDS::DBInstance") == [("Delete", "Delete")]
    assert _secret(throwaway, master=True)["DeletionPolicy"] == "Delete"
    assert throwaway.only("AWS::RDS::DBInstance")["Properties"]["DeletionProtection"] is False

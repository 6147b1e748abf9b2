"""docs/operations.md has a procedure for every alarm the stack creates, and only for those."""

from __future__ import annotations

import re

import pytest
from aws_cdk import aws_cloudwatch as cloudwatch

from tests.infra.conftest import REPO_ROOT, Synth

RUNBOOK = REPO_ROOT / "docs" / "operations.md"
_SECTION = re.compile(r"^### `([A-Za-z]+)`\n(.*?)(?=^#)", re.MULTILINE | re.DOTALL)


def _sections() -> dict[str, str]:
    text = RUNBOOK.read_text()
    start = text.index("## Alarms: what fires and what you do")
    end = text.index("\n## ", start + 1)
    return dict(_SECTION.findall(text[start : end + 2]))


def _alarm_names(synth: Synth) -> set[str]:
    """The alarms of the synthesized template, by the name the stack gives each (the id of its
    construct, which the logical id starts from)."""
    names: set[str] = set()
    template = synth.resources("AWS::CloudWatch::Alarm")
    for construct in synth.stack.node.find_all():
        if isinstance(construct, cloudwatch.CfnAlarm):
            assert synth.stack.resolve(synth.stack.get_logical_id(construct)) in template
            parent = construct.node.scope
            assert parent is not None
            names.add(parent.node.id)
    assert len(names) == len(template)
    return names


def test_each_section_says_what_it_means_what_shows_more_and_what_to_do() -> None:
    sections = _sections()
    assert len(sections) >= 17
    for name, text in sections.items():
        for part in ("* **Means**", "* **Shows more**", "* **Do**"):
            assert part in text, f"{name}: no {part!r}"


@pytest.mark.slow  # synthesizes
def test_every_alarm_of_the_stack_has_its_procedure(greenfield: Synth, pruned: Synth) -> None:
    # The greenfield stack has the database alarms, the pruned one the pruner's: together every
    # alarm any configuration creates.
    alarms = _alarm_names(greenfield) | _alarm_names(pruned)
    assert "WriterThrottles" in alarms
    assert set(_sections()) == alarms

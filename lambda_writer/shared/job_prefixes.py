"""The stricter ownership mode: which job ids each principal may write, read once.

The stack's context ``jobPrefixesByPrincipal`` and the writer's ``JOB_PREFIXES`` hold the same
JSON object, ``{"AROA…": ["teamA-", …], …}`` (a principal is a role's or user's unique id, the
part of SQS's SenderId before ``:``); both parse it here, so the rule is written once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from lambda_writer.shared.exceptions import SettingsError

# A principal as the writer compares it (records.principal_of): a role's or user's unique id
# (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_identifiers.html#identifiers-unique-ids),
# or, on an emulator, the account id LocalStack stamps.
_PRINCIPAL = re.compile(r"^[A-Z0-9]{12,128}$")

JobPrefixes = Mapping[str, tuple[str, ...]]


def parse_job_prefixes(value: object, *, name: str) -> dict[str, tuple[str, ...]]:
    """``value`` (a JSON text or an already decoded object) as principal -> prefixes; raises
    :class:`SettingsError` naming ``name`` and the rule."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            rule = "must be a JSON object of role ids to job-id prefixes"
            raise SettingsError(name, rule) from None
    if not isinstance(value, Mapping) or not value:
        raise SettingsError(
            name, 'must be a non-empty object like {"AROA…": ["teamA-"]}, role ids to prefixes'
        )
    parsed: dict[str, tuple[str, ...]] = {}
    for principal, prefixes in value.items():
        if not isinstance(principal, str) or not _PRINCIPAL.fullmatch(principal):
            raise SettingsError(
                name,
                f"keys must be role or user unique ids (AROA…, AIDA…) without a session,"
                f" got {principal!r}",
            )
        listed = [prefixes] if isinstance(prefixes, str) else prefixes
        if (
            not isinstance(listed, list)
            or not listed
            or not all(isinstance(p, str) and p.strip() == p and p for p in listed)
        ):
            raise SettingsError(
                name, f"{principal}: must list job-id prefixes (non-empty), got {prefixes!r}"
            )
        parsed[principal] = tuple(listed)
    return parsed


def encode_job_prefixes(prefixes: JobPrefixes) -> str:
    """The compact JSON the writer's ``JOB_PREFIXES`` holds."""
    return json.dumps({k: list(v) for k, v in sorted(prefixes.items())}, separators=(",", ":"))

"""Which context keys are the app's, and the refusal of one it does not know.

The context ``cdk synth`` hands the app holds more than the app's keys: cdk.json's feature flags
(``@aws-cdk/core:checkSecretUsage``), what the CLI adds (``aws:cdk:version-reporting``,
``aws:cdk:bundling-stacks``), cached lookups (``availability-zones:account=…``) and
``acknowledged-issue-numbers``. The app's own keys are lowerCamelCase words; a key of that shape
that the app does not read is a typo (``writerReservedConcurency``) that would otherwise
synthesize the default silently, so it is refused with the nearest known key. Keys with a
namespace or hyphen (``@…``, ``…:…``, ``…/…``, ``a-b``) belong to the CDK and are left alone.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

from ckpt_stack.exceptions import ContextError

# Every key the app reads; ckpt_stack.context reads each (tests/contract/test_boundaries.py).
KNOWN_KEYS = (
    "prefix",
    "createDatabase",
    "dbName",
    "dbMasterUsername",
    "writerReservedConcurrency",
    "proxyMaxConnectionsPercent",
    "highThroughputFifo",
    "alarmEmail",
    "createVpcEndpoints",
    "wheelhouse",
    "vpcId",
    "availabilityZones",
    "privateSubnetIds",
    "dbInstanceId",
    "dbEndpoint",
    "dbPort",
    "dbSecurityGroupId",
    "dbSecretArn",
    "dbSecretKmsKeyArn",
    "dbInstanceClass",
    "dbAllocatedStorageGiB",
    "dbMultiAz",
    "dbDeletionProtection",
    "dbBackupRetentionDays",
    "checkpointBucket",
    "checkpointPrefix",
    "createCheckpointBucket",
    "checkpointNoncurrentDays",
    "checkpointSpreadPrefixes",
    "scheduledPrune",
    "pruneEveryHours",
    "pruneKeepLast",
    "pruneKeepBest",
    "pruneMetric",
    "pruneMode",
    "pruneKeepEvery",
    "pruneSuperseded",
    "replayPrincipalId",
    "jobPrefixesByPrincipal",
)
_APP_KEY_SHAPE = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")


def is_app_key(key: str) -> bool:
    """Whether ``key`` has the shape of the app's keys (not a CDK flag, lookup or CLI key)."""
    return bool(_APP_KEY_SHAPE.fullmatch(key))


def check_keys(keys: Iterable[str]) -> None:
    """Refuse the first app-shaped key that is not known, naming the nearest known key."""
    known = set(KNOWN_KEYS)
    for key in sorted(keys):
        if not is_app_key(key) or key in known:
            continue
        near = difflib.get_close_matches(key, KNOWN_KEYS, n=1, cutoff=0.6)
        if not near:
            # Case slips (dbmultiaz) score low for difflib; compare without case too.
            lower = {k.lower(): k for k in KNOWN_KEYS}
            near = [lower[key.lower()]] if key.lower() in lower else []
        hint = f"did you mean {near[0]}?" if near else "see docs/deploy.md#context-keys"
        raise ContextError(key, f"is not a context key of this app: {hint}")

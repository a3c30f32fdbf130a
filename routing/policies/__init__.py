"""Router policies, registered by name in :data:`ROUTER_POLICIES`.

Importing this package registers every policy: kvcost's own (``basic``), the
production baselines it is measured against and the 2026 anchors (``lmetric``,
``dualmap``, ``llmd_latency``).
"""

from kvcost.routing.policies import (  # noqa: F401  (importing registers the policies)
    aibrix,
    basic,
    dualmap,
    dynamo,
    llmd,
    llmd_latency,
    lmetric,
    mooncake,
    oracle,
    preble,
    sglang,
)
from kvcost.routing.policies.base import (
    DEFAULT_SEED,
    ROUTER_POLICIES,
    PolicyContext,
    RouterPolicy,
    TruthFn,
    argmin_stable,
    check_policy_params,
    make_policy,
)

__all__ = [
    "DEFAULT_SEED",
    "ROUTER_POLICIES",
    "PolicyContext",
    "RouterPolicy",
    "TruthFn",
    "argmin_stable",
    "check_policy_params",
    "make_policy",
]

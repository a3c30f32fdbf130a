"""Router policies, registered by name in :data:`ROUTER_POLICIES`.

Importing this package registers every policy: kvcost's own (``basic``) and
the production baselines it is measured against.
"""

from kvcost.routing.policies import aibrix, basic, dynamo, llmd, mooncake, oracle, preble, sglang  # noqa: F401  (importing registers the policies)
from kvcost.routing.policies.base import (
    DEFAULT_SEED,
    ROUTER_POLICIES,
    PolicyContext,
    RouterPolicy,
    TruthFn,
    argmin_stable,
    make_policy,
)

__all__ = [
    "DEFAULT_SEED",
    "ROUTER_POLICIES",
    "PolicyContext",
    "RouterPolicy",
    "TruthFn",
    "argmin_stable",
    "make_policy",
]

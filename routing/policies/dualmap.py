"""The ``dualmap`` anchor: DualMap's two-choice, SLO-aware routing (kvcost issue 13, §2).

Source: Yuan, Zuo, Wang, Chen, Tan & Yu, "DualMap: Enabling Both Cache Affinity
and Load Balancing for Distributed LLM Serving", ICLR 2026 (arXiv:2602.06502),
abstract and summary (the full text was not read); code at ASISys/DualMap. Each request is mapped to two candidate
instances by two independent hash functions of its prompt prefix, so requests
sharing a prefix share their pair (cache affinity) while distinct prefixes
spread over the cluster by "the power of two choices". SLO-aware routing then
prefers the candidate holding the prefix's cache until its expected TTFT would
exceed the TTFT SLO, and switches to the other. The paper reports up to 2.25×
effective request capacity at the same TTFT SLO.

Not modelled: the adaptive prefix length (here a fixed number of leading blocks),
hotspot-aware rebalancing (migration of queued requests between a pair) and the
dual hash ring for scaling (the fleet is fixed, so plain modular hashing over the
candidates is equivalent).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from kvcost.routing.policies.base import DEFAULT_SEED, ROUTER_POLICIES, PolicyContext, RouterPolicy

#: TTFT SLO, seconds. Unverified: the value of the paper's evaluation set-up could not be read
#: in the sources available when this was written (abstract and summaries only); 5 s is kvcost's
#: assumption. Pass ``ttft_slo_s`` to match another set-up.
DEFAULT_TTFT_SLO_S = 5.0
#: Leading full blocks of the prompt hashed to pick the pair (kvcost's choice; DualMap adapts
#: the prefix length to the workload). One block of the Mooncake traces is 512 tokens, and the
#: first block is one shared system prompt: all 12 031 requests of the conversation trace start
#: with it, so one block would send every request to the same pair; two give 7 373 distinct keys.
DEFAULT_PREFIX_BLOCKS = 2


def _hash64(salt: int, key: tuple[int, ...]) -> int:
    """A 64-bit hash of ``key`` under hash function number ``salt`` (stable across processes)."""
    payload = f"{salt}:" + ",".join(str(k) for k in key)
    return int.from_bytes(hashlib.blake2b(payload.encode(), digest_size=8).digest(), "big")


def candidate_pair(key: tuple[int, ...], n: int) -> tuple[int, int]:
    """The two candidate indices (of ``n``) of a prefix ``key``: distinct when ``n`` ≥ 2.

    The first is ``h₀(key) mod n``; the second is drawn by ``h₁`` among the other
    ``n − 1`` indices. Deterministic: the same key and ``n`` always give the same pair.

    Raises:
        ValueError: ``n`` < 1.
    """
    if n < 1:
        raise ValueError(f"n = {n}, expected at least one candidate")
    first = _hash64(0, key) % n
    if n == 1:
        return first, first
    return first, (first + 1 + _hash64(1, key) % (n - 1)) % n


def prefix_key(ctx: PolicyContext, prefix_blocks: int) -> tuple[int, ...]:
    """What is hashed: the first ``prefix_blocks`` block hashes, or the request id when the prompt
    has no full block (nothing to share, so the pair is only a load-balancing draw)."""
    hashes = ctx.request.block_hashes[:prefix_blocks]
    return tuple(hashes) if hashes else (-1, ctx.request.request_id)


@dataclass(frozen=True, slots=True)
class DualMapChoice:
    """One decision: the pair, which of it holds the cache, and which was taken (indices into ``ctx``)."""

    pair: tuple[int, int]
    holder: int | None
    chosen: int
    rule: str


@ROUTER_POLICIES.register("dualmap")
class DualMapPolicy(RouterPolicy):
    """DualMap: of the prefix's two hashed candidates, the cache holder unless its predicted TTFT breaks the SLO.

    Rule, for the pair ``(a, b)`` of :func:`candidate_pair`:

    - holder = the one with more reusable prefix tokens (none if they are equal);
    - holder's predicted TTFT ≤ ``ttft_slo_s`` → holder; above it → the other one;
    - no holder → the one with the lower predicted TTFT (the power of two choices;
      ``a`` on ties).

    Approximations:

    - The predicted TTFT is kvcost's composed prediction (``ctx.predictions.ttft_s``),
      not DualMap's own estimator.
    - Reusable prefix comes from kvcost's event-fed directory.
    - When both candidates would break the SLO the other one is still taken (the rule
      as issue 13 states it).
    - Candidates are all workers: kvcost's hot-spot skew limit (``ctx.allowed``) is not part of DualMap.

    Args:
        ttft_slo_s: TTFT SLO, seconds (> 0).
        prefix_blocks: leading full blocks hashed (≥ 1).
        seed: unused (DualMap breaks no tie at random).

    Raises:
        ValueError: a parameter out of range (the message names it).
    """

    name = "dualmap"

    def __init__(
        self,
        *,
        ttft_slo_s: float = DEFAULT_TTFT_SLO_S,
        prefix_blocks: int = DEFAULT_PREFIX_BLOCKS,
        seed: int = DEFAULT_SEED,
    ) -> None:
        if not ttft_slo_s > 0:
            raise ValueError(f"ttft_slo_s = {ttft_slo_s}, expected a number of seconds > 0")
        if prefix_blocks < 1:
            raise ValueError(f"prefix_blocks = {prefix_blocks}, expected an integer ≥ 1")
        super().__init__(seed=seed)
        self.ttft_slo_s = ttft_slo_s
        self.prefix_blocks = prefix_blocks

    def decide(self, ctx: PolicyContext) -> DualMapChoice:
        """The pair, its cache holder and the chosen candidate."""
        a, b = candidate_pair(prefix_key(ctx, self.prefix_blocks), len(ctx.snapshots))
        ttft_s = ctx.predictions.ttft_s
        reuse = ctx.reusable_tokens
        if reuse[a] == reuse[b]:
            chosen = b if ttft_s[b] < ttft_s[a] else a
            return DualMapChoice((a, b), None, chosen, "no cache holder: lower predicted TTFT")
        holder, other = (a, b) if reuse[a] > reuse[b] else (b, a)
        if ttft_s[holder] <= self.ttft_slo_s:
            return DualMapChoice((a, b), holder, holder, "cache holder within the SLO")
        return DualMapChoice((a, b), holder, other, "cache holder would break the SLO: the other")

    def choose(self, ctx: PolicyContext) -> tuple[int, str]:
        """See the class docstring."""
        d = self.decide(ctx)
        ids = [ctx.snapshots[i].worker_id for i in d.pair]
        reason = (
            f"{d.rule}; pair {ids[0]}/{ids[1]}, predicted TTFT {ctx.predictions.ttft_s[d.chosen] * 1e3:.1f} ms, "
            f"SLO {self.ttft_slo_s * 1e3:.0f} ms, reuse {ctx.reusable_tokens[d.chosen]} tokens"
        )
        return d.chosen, reason

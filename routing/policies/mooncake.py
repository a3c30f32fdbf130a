"""The ``mooncake_conductor`` baseline: Mooncake's KVCache-centric prefill scheduling (docs/architecture.md §7).

Source: Qin et al., "Mooncake: A KVCache-centric Disaggregated Architecture for
LLM Serving", FAST 2025 (arXiv:2407.00079), §6.1 Algorithm 1 ("KVCache-centric
Scheduling") and §6.2 (cache load balancing). kvcache-ai/Mooncake publishes the
trace and the store, not the production Conductor (``mooncake-conductor/`` is a
prefix index and a proxy without Algorithm 1), so the paper is the reference.

Algorithm 1, per prefill instance: ``prefix_len`` = its local match,
``T_queue`` = sum of the prefill times of the requests queued on it; if
``best_prefix_len > prefix_len × kvcache_balancing_threshold`` the instance
fetches the best prefix (``T_transfer`` for ``best_prefix_len − prefix_len``
tokens, then prefill from ``best_prefix_len``), otherwise it prefills from its
own match; TTFT = sum of the terms; the instance with the smallest TTFT wins
(strict ``<`` in the scan, so the first instance on ties).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcost.core.hardware import StepTimeModel
from kvcost.core.links import NETWORK
from kvcost.core.types import WorkerSnapshot
from kvcost.routing.policies.base import DEFAULT_SEED, ROUTER_POLICIES, PolicyContext, RouterPolicy, argmin_stable

#: Ratio best / local prefix above which an instance fetches the best prefix. The paper
#: names ``kvcache_balancing_threshold`` but publishes no value; 1.0 (fetch whenever a
#: longer prefix exists, and let the TTFT comparison weigh the transfer) is kvcost's assumption.
DEFAULT_KVCACHE_BALANCING_THRESHOLD = 1.0
#: Achieved inter-worker KV bandwidth, bytes/s: kvcost's network link (``core/links.py``, docs/architecture.md §1).
DEFAULT_TRANSFER_BYTES_PER_S = NETWORK.bandwidth_bytes_per_s
#: Fixed cost of one transfer (request, registration, preparation), seconds: the same link's setup.
DEFAULT_TRANSFER_SETUP_S = NETWORK.setup_s


@dataclass(frozen=True, slots=True)
class MooncakeEstimates:
    """Per-candidate TTFT estimate of Algorithm 1, seconds or tokens, shape ``(n,)``.

    Attributes:
        queue_s: sum of the queued requests' prefill times.
        prefill_s: this request's prefill from ``prefix_tokens``.
        transfer_s: fetch time (0 where the instance does not fetch).
        ttft_s: ``transfer_s + queue_s + prefill_s``.
        local_tokens: the instance's own reusable prefix (int64).
        prefix_tokens: prefix the prefill starts from (local, or the best one when fetching; int64).
        fetch: bool, True where the instance fetches the best prefix.
        over_threshold: bool, True where the best prefix passes the balancing threshold
            (whether or not fetching is enabled).
    """

    queue_s: np.ndarray
    prefill_s: np.ndarray
    transfer_s: np.ndarray
    ttft_s: np.ndarray
    local_tokens: np.ndarray
    prefix_tokens: np.ndarray
    fetch: np.ndarray
    over_threshold: np.ndarray


def queue_time_s(step_model: StepTimeModel, snapshot: WorkerSnapshot) -> float:
    """Algorithm 1's ``EstimatePrefillQueueTime``: sum of ``prefill_alone_s(remaining, context)`` over the queue."""
    return sum(step_model.prefill_alone_s(remaining, context) for remaining, context in snapshot.waiting_prefill)


@ROUTER_POLICIES.register("mooncake_conductor")
class MooncakeConductorPolicy(RouterPolicy):
    """Mooncake Conductor: lowest estimated TTFT = transfer + queue + prefill (FAST 2025, Algorithm 1).

    Rule, per candidate i (L_i = its reusable tokens, B = max_j L_j held by worker b)::

        T_queue_i = Σ_waiting prefill_alone_s(remaining, context)
        if fetching is enabled and B > L_i × kvcache_balancing_threshold:
            TTFT_i = (B − L_i) × kv_bytes_per_token / transfer_bytes_per_s + transfer_setup_s
                     + T_queue_i + prefill_alone_s(input − B, B)
        else:
            TTFT_i = T_queue_i + prefill_alone_s(input − L_i, L_i)

    Lowest TTFT wins, first (lowest-index) candidate on ties, as the paper's strict
    ``<`` scan. Times come from each worker's nominal ``StepTimeModel`` (the paper
    fits a model to offline profiles).

    Defaults: ``kvcache_balancing_threshold`` = 1.0 (not published; assumption),
    ``transfer_bytes_per_s`` = 12 GiB/s (docs/architecture.md §1 example),
    ``transfer_setup_s`` = 1 ms (assumption), ``fetch_remote_prefix`` = False.

    Fetching is OFF by default: the simulator does not move KV between workers
    yet, so a "fetch" decision could not be carried out. Enable it once the
    simulator models transfers; until then the policy is Mooncake's local
    cache-aware variant (local matches only), and the reason says when a longer
    remote prefix was passed over.

    Approximations:

    - Prefill instances are the colocated workers; decode work sharing their
      steps and the step in progress are not in ``T_queue`` (the paper's prefill
      instances run no decode).
    - Queued requests are timed from their remaining tokens and context, each as
      if alone (the paper's sum of per-request prefill times).
    - Transfer and queueing are added, as in the paper (no overlap), and the
      paper's hot-spot migration after the choice (copying the best prefix to
      the chosen instance) and SLO-based early rejection are not modelled.
    - Prefix lengths are the directory's reusable tokens (any tier), at most
      ``input − 1``; candidates are all workers (kvcost's skew limit ``ctx.allowed``
      is not part of Mooncake).

    Args:
        kvcache_balancing_threshold: ratio ≥ 0.
        transfer_bytes_per_s: > 0.
        transfer_setup_s: ≥ 0.
        fetch_remote_prefix: use the fetch branch of Algorithm 1.
        seed: unused (no tie is broken at random); accepted like every policy's.

    Raises:
        ValueError: an argument out of range (the message names it).
    """

    name = "mooncake_conductor"

    def __init__(
        self,
        *,
        kvcache_balancing_threshold: float = DEFAULT_KVCACHE_BALANCING_THRESHOLD,
        transfer_bytes_per_s: float = DEFAULT_TRANSFER_BYTES_PER_S,
        transfer_setup_s: float = DEFAULT_TRANSFER_SETUP_S,
        fetch_remote_prefix: bool = False,
        seed: int = DEFAULT_SEED,
    ) -> None:
        super().__init__(seed=seed)
        if not kvcache_balancing_threshold >= 0:
            raise ValueError(f"kvcache_balancing_threshold = {kvcache_balancing_threshold}, expected ≥ 0")
        if not transfer_bytes_per_s > 0:
            raise ValueError(f"transfer_bytes_per_s = {transfer_bytes_per_s}, expected > 0")
        if not transfer_setup_s >= 0:
            raise ValueError(f"transfer_setup_s = {transfer_setup_s}, expected ≥ 0")
        self.kvcache_balancing_threshold = kvcache_balancing_threshold
        self.transfer_bytes_per_s = transfer_bytes_per_s
        self.transfer_setup_s = transfer_setup_s
        self.fetch_remote_prefix = fetch_remote_prefix

    def estimates(self, ctx: PolicyContext) -> MooncakeEstimates:
        """Algorithm 1's TTFT terms for every candidate.

        Raises:
            KeyError: a candidate's GPU type has no step-time model in ``ctx.step_models``.
        """
        input_tokens = ctx.request.input_tokens
        local = np.asarray(ctx.reusable_tokens, dtype=np.int64)
        best = int(local.max())
        over = best > local * self.kvcache_balancing_threshold
        fetch = over if self.fetch_remote_prefix else np.zeros_like(over)
        prefix = np.where(fetch, best, local)
        n = len(ctx.snapshots)
        queue_s, prefill_s, transfer_s = np.zeros(n), np.zeros(n), np.zeros(n)
        for i, snapshot in enumerate(ctx.snapshots):
            step_model = ctx.step_models[snapshot.gpu]
            queue_s[i] = queue_time_s(step_model, snapshot)
            prefill_s[i] = step_model.prefill_alone_s(input_tokens - int(prefix[i]), int(prefix[i]))
            if fetch[i]:
                moved_bytes = (best - int(local[i])) * step_model.model.kv_bytes_per_token
                transfer_s[i] = moved_bytes / self.transfer_bytes_per_s + self.transfer_setup_s
        return MooncakeEstimates(
            queue_s=queue_s,
            prefill_s=prefill_s,
            transfer_s=transfer_s,
            ttft_s=transfer_s + queue_s + prefill_s,
            local_tokens=local,
            prefix_tokens=prefix,
            fetch=fetch,
            over_threshold=over,
        )

    def choose(self, ctx: PolicyContext) -> tuple[int, str]:
        """Candidate with the lowest estimated TTFT (lowest index on ties)."""
        est = self.estimates(ctx)
        index = argmin_stable(est.ttft_s)
        best_worker = ctx.snapshots[int(np.argmax(est.local_tokens))].worker_id
        head = f"min est. TTFT {est.ttft_s[index] * 1e3:.1f} ms = "
        terms = f"queue {est.queue_s[index] * 1e3:.1f} + prefill {est.prefill_s[index] * 1e3:.1f} ms"
        local, prefix = int(est.local_tokens[index]), int(est.prefix_tokens[index])
        if est.fetch[index]:
            transfer = f"transfer {est.transfer_s[index] * 1e3:.1f} + "
            fetched = f"fetch {prefix - local} tokens from worker {best_worker} (prefix {prefix} tokens)"
            return index, f"{head}{transfer}{terms}; {fetched}"
        reason = f"{head}{terms}; local prefix {local} tokens"
        if est.over_threshold[index]:
            longest = int(est.local_tokens.max())
            reason += f"; longer prefix {longest} tokens on worker {best_worker} not fetched (fetch off)"
        return index, reason

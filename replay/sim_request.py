"""A request's life on a simulated worker (:mod:`kvcost.replay.worker`): its times, its KV
allocation, its reuse, and what a preemption left it to recompute. Times in seconds on the
simulation clock; the worker module's docstring defines the actual terms read from it.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from kvcost.features.nominal import DEFAULT_FIRST_TOKEN_S
from kvcost.replay.kv_cache import Allocation


@dataclass(slots=True, eq=False)
class SimRequest:
    """A request's life on a worker; times in seconds on the simulation clock."""

    request_id: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    full_block_hashes: tuple[int, ...]
    predicted_reuse_tokens: int
    # the part of the promise the directory reported stored (the rest was in flight); 0 with the cache off
    directory_reuse_tokens: int = 0
    # the reuse the router expects to survive until admission (RouteDecision.queued_reuse_tokens); None = the promise
    expected_reuse_tokens: int | None = None
    # filled in by the worker
    admitted_s: float = math.nan
    queued_until_s: float = math.nan  # admission; for a tier load, its first chunk's start − L
    lookup_s: float = 0.0
    reused_tokens: int = 0
    computed_tokens: int = 0
    prefill_end_s: float = math.nan
    first_token_overhead_s: float = DEFAULT_FIRST_TOKEN_S
    decode_start_step: int = 0
    decode_context_start: int = 0
    finish_s: float = math.nan
    allocation: Allocation | None = None
    # tiers and transfers
    ready_s: float = 0.0  # prefix loaded into GPU memory (admission + lookup_s)
    loaded_blocks: int = 0  # blocks copied from CPU / disk at admission
    fetch_hashes: tuple[int, ...] = ()  # blocks fetched over the network before admission
    transfer_s: float = 0.0  # arrival → fetched blocks in this worker's CPU memory
    mismatch_lost_s: float = 0.0  # nominal prefill of the promised-but-missing tokens
    # preemption (vLLM's recompute): output tokens produced before the latest preemption, and how often
    emitted_tokens: int = 0
    preemptions: int = 0
    admission_lookup_s: float = 0.0  # the latest admission's lookup (``lookup_s`` keeps the first token's)
    # time at the head of the queue, with prefill budget left, that KV memory kept it out (before its first token)
    kv_wait_s: float = 0.0
    kv_blocked_since_s: float = math.nan
    next_block_step: int = -1  # decode step at which this decoding sequence needs its next block

    @property
    def sequence_tokens(self) -> int:
        """Tokens a prefill computes: the prompt, plus the output produced before a preemption."""
        return self.input_tokens + self.emitted_tokens

    @property
    def first_token_out(self) -> bool:
        """Whether it produced tokens before a preemption: its TTFT terms are then final and its
        readmission leaves them alone. (False until a preemption, even while it decodes: only
        preemption and readmission read it.)"""
        return self.emitted_tokens > 0

    @property
    def queued_tokens(self) -> int:
        """Prefill tokens still to compute (before admission net of :attr:`router_reuse_tokens`)."""
        if self.allocation is None:
            return self.sequence_tokens - self.router_reuse_tokens
        return self.sequence_tokens - self.computed_tokens

    @property
    def router_reuse_tokens(self) -> int:
        """The reuse the router counts this request's queued work net of before admission: its expected
        reuse where the router gave one, else its promise (``predicted_reuse_tokens``)."""
        return self.predicted_reuse_tokens if self.expected_reuse_tokens is None else self.expected_reuse_tokens

    @property
    def served_by(self) -> str:
        """Where the reused prefix came from: ``remote_transfer``, ``tier_load``, ``local_hit`` or ``recompute``."""
        if self.fetch_hashes:
            return "remote_transfer"
        if self.loaded_blocks:
            return "tier_load"
        return "local_hit" if self.reused_tokens else "recompute"

    @property
    def first_token_s(self) -> float:
        """Time the first token reaches the client."""
        return self.prefill_end_s + self.first_token_overhead_s

    def fork(self) -> SimRequest:
        """An independent copy, allocation included."""
        twin = copy.copy(self)
        if self.allocation is not None:
            a = self.allocation
            twin.allocation = Allocation(list(a.cached_hashes), a.private_blocks, a.reused_blocks)
        return twin

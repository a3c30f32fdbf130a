"""Nominal term times from a GPU type's measured profile (the analytic cost model's formulas).

These are what a router can know: the GPU *type* of each worker and its
nominal step-time curve (``StepTimeModel``), the lengths and phases of the
work queued there, and the directory's reusable prefix. Per-step jitter,
stragglers and KV-admission waits are not known and are not modelled.

Queue and prefill follow chunked prefill with continuous batching (vLLM's
scheduler, ``vllm/v1/core/sched/scheduler.py``): every step spends one token
per decoding request and gives the rest of the token budget to prefill chunks
in FCFS order. With ``C = token_budget − running`` prefill tokens per step,
``A`` tokens queued ahead and ``u`` uncached tokens of this request, the work
``W = A + u`` takes ``ceil(W / C)`` steps; this request's first chunk runs in
step ``floor(A / C)``. Full steps cost ``nonattention(budget) + decode
attention + overhead``; the last step only its own token count. Prefill
attention (FLOPs over new tokens × context, cached tokens counting as
context) is added to the steps where it happens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from kvcost.core.hardware import StepTimeModel
from kvcost.core.links import CPU_TO_GPU, DISK_TO_CPU, NETWORK, LinkSpec
from kvcost.features.finish_times import finish_steps_batch

#: Prefix lookup + block allocation fixed cost per request (assumption, ~0.2 ms of scheduler CPU).
DEFAULT_LOOKUP_BASE_S = 2e-4
#: Per full block hashed and matched (assumption: SHA-256 over 512 token ids ≈ 10 µs in Python).
DEFAULT_LOOKUP_PER_BLOCK_S = 1e-5
#: Sampling + detokenisation + one network hop to the client (assumption: 2 ms).
DEFAULT_FIRST_TOKEN_S = 2e-3
#: Expected remaining output tokens of a decoding request (the router cannot know output
#: lengths; the Mooncake conversation trace has a mean output of 343 tokens, so a running
#: request has about half of it left).
DEFAULT_EXPECTED_DECODE_TOKENS = 172


@dataclass(frozen=True, slots=True)
class NominalCosts:
    """Per-request quantities the router assumes; defaults are stated assumptions.

    Attributes:
        lookup_base_s, lookup_per_block_s: prefix lookup and preparation, seconds.
        first_token_s: sampling, detokenisation and network after the last chunk, seconds.
        expected_decode_tokens: remaining output tokens of a decoding request (≥ 0).
        mean_output_tokens: mean output length of a request, tokens (≥ 0), the rate at which
            decoders finish (:func:`kv_wait_s`); None = ``expected_decode_tokens`` (exponential
            lengths, whose mean and mean remaining output are equal).
        output_tokens_cv2: squared coefficient of variation of the output lengths (variance ÷
            mean², > 0), the law of the decoders' remaining output when their progress is known
            (:func:`.finish_times.finish_steps`); 1 = exponential (the default assumption).
        cpu_to_gpu, disk_to_cpu, network: the links KV moves over (``kvcost.core.links``).
    """

    lookup_base_s: float = DEFAULT_LOOKUP_BASE_S
    lookup_per_block_s: float = DEFAULT_LOOKUP_PER_BLOCK_S
    first_token_s: float = DEFAULT_FIRST_TOKEN_S
    expected_decode_tokens: int = DEFAULT_EXPECTED_DECODE_TOKENS
    mean_output_tokens: float | None = None
    output_tokens_cv2: float = 1.0
    cpu_to_gpu: LinkSpec = CPU_TO_GPU
    disk_to_cpu: LinkSpec = DISK_TO_CPU
    network: LinkSpec = NETWORK

    def __post_init__(self) -> None:
        for name in ("lookup_base_s", "lookup_per_block_s", "first_token_s", "expected_decode_tokens"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"{name} = {value}, expected a number ≥ 0")
        if not (self.output_tokens_cv2 > 0 and math.isfinite(self.output_tokens_cv2)):
            raise ValueError(f"output_tokens_cv2 = {self.output_tokens_cv2}, expected a finite number > 0")
        if self.mean_output_tokens is not None and not self.mean_output_tokens >= 0:
            raise ValueError(f"mean_output_tokens = {self.mean_output_tokens}, expected a number ≥ 0 or None")

    @property
    def output_tokens_mean(self) -> float:
        """``mean_output_tokens``, or ``expected_decode_tokens`` where it is None (tokens, ≥ 0)."""
        return self.expected_decode_tokens if self.mean_output_tokens is None else self.mean_output_tokens

    def lookup_s(self, request_blocks: int) -> float:
        """Lookup and preparation of a GPU-resident prefix for a request of ``request_blocks`` full blocks."""
        return self.lookup_base_s + self.lookup_per_block_s * request_blocks

    def load_s(self, load_bytes: float, disk_bytes: float, backlog_s: float = 0.0) -> float:
        """Loading a prefix into GPU memory from lower tiers: disk → CPU, then CPU → GPU.

        Args:
            load_bytes: bytes copied CPU → GPU (every non-GPU block, disk ones included), ≥ 0.
            disk_bytes: the part read from local disk first, ≥ 0.
            backlog_s: wait for the CPU → GPU link to free up (transfers queued ahead), ≥ 0.

        Returns:
            Seconds; 0 when nothing is loaded.
        """
        if load_bytes <= 0:
            return 0.0
        return backlog_s + self.disk_to_cpu.duration_s(disk_bytes) + self.cpu_to_gpu.duration_s(load_bytes)

    def transfer_s(self, transfer_bytes: float, backlog_s: float = 0.0) -> float:
        """Fetching ``transfer_bytes`` from another worker or the remote store over the network (0 for none)."""
        if transfer_bytes <= 0:
            return 0.0
        return backlog_s + self.network.duration_s(transfer_bytes)


def kv_wait_s(
    step_model: StepTimeModel,
    deficit_blocks: float,
    running_requests: int,
    decode_context_tokens: int,
    block_size_tokens: int,
    mean_output_tokens: float,
    queued_prefill_tokens: int,
    held_blocks: float | None = None,
    running_output_tokens: Sequence[int] = (),
    output_cv2: float = 1.0,
) -> float:
    """Expected wait for KV memory beyond the compute queue, seconds (≥ 0): the KV-wait estimate.

    A request is admitted once the blocks of the requests ahead of it and its own new blocks fit
    in the blocks not held by running requests (free, or idle cached: evictable). ``deficit_blocks``
    is what is missing now; the requests ahead are admitted as memory frees, so the wait of the
    last of them is the time for the whole deficit to be freed (the queue behind a memory-bound
    head waits for memory too, whether or not it is at the head).

    Memory is freed as decoders finish, net of what the decoders take meanwhile:

    * **released**: a decoder that finishes releases its share of the blocks the running requests
      hold, ``held_blocks / n`` (physical blocks: a prefix shared by many decoders is held once, and
      is not freed by one of them finishing, so counting each decoder's whole context,
      ``decode_context_tokens / n``, overstates the release wherever prompts share a prefix).
    * **taken**: each decoder writes one token a step and opens a new block every
      ``block_size_tokens`` steps (vLLM allocates as tokens are generated, and a running request's
      growth comes before admitting a waiting one). Decoders finish at ``n / mean`` a step while
      they open ``n / block_size_tokens`` blocks a step, so each finish comes with
      ``mean / block_size_tokens`` blocks taken.

    So ``k = ceil(deficit / (held / n − mean / block_size_tokens))`` decoders must finish. The share
    ``held / n`` stands for what a finisher releases: for exponential lengths a running decoder has
    produced ``mean`` tokens on average (its age, ``E[L²] ÷ (2 E[L])``), as much as a finisher's whole
    output. Where a decoder's share is below one mean output, that cannot hold: the decoders are
    younger than the law says (outputs vary less than an exponential's, or the batch is new), and the
    balance would free nothing, so no number of finishes would make room and the wait would be one
    drain of the batch whatever the deficit. There the balance is taken with the finisher releasing
    its whole output and the others' progress known: ``held / n − progress / block_size_tokens`` net
    (the prompt part of a decoder's share), ``progress`` the decoders' mean output so far where it is
    known (``running_output_tokens``), else their mean age ``mean × (1 + cv²) ÷ 2``. No cell of the
    A100 grid, the held-out L40S cells or the ×0.5 / ×2 sweep reaches this case; it keeps the wait
    growing with the deficit where one does (outputs long against the private part of the prompts).
    The progress balance in place of ``held / n − mean / block_size_tokens`` everywhere was measured
    and not kept: it fixed one overloaded cell (512-token answers to a shared system prompt, P99
    53.7 → 38.8 s) and lost on the held-out L40S cells (``docs/routing-unseen-workloads.md``, "The
    blocks a finish frees").

    The decoders' remaining outputs are taken as independent exponentials of mean ``mean_output_tokens`` steps
    (output lengths are unknown to a router; the exponential is the maximum-entropy law of a
    given mean): the ``k``-th of ``n`` finishes after ``mean × (1/n + 1/(n − 1) + … + 1/(n − k +
    1))`` steps in expectation (order statistics of exponentials). The mean is the mean output
    length, not the mean remaining output of a decoder: a batch of ``n`` decoders in steady state
    finishes ``n / E[L]`` requests a step whatever the law of the lengths ``L`` (each decoding slot
    serves one request per ``E[L]`` steps: Little's law), and the first finishes, the ones a small
    deficit waits for, come at that rate. The mean remaining output ``(E[L²] − E[L]) ÷ (2 E[L])``
    is below ``E[L]`` wherever lengths vary less than an exponential's, and taking it as the mean
    would predict finishes too soon: against the queue time the compute queue does not explain
    (``cost_aware``, 4 workers, seed 0; kvcost issue 13), the estimate's mean was 0.18–0.58 of it
    on four workloads with the remaining output, and is 0.63–1.24 with the mean output.

    When the decoders' progress is known (``running_output_tokens``, one count per decoder: the
    gateway counts each stream's tokens, a replay its decoders'), the ``k``-th finish comes from
    each decoder's own remaining output under the gamma law of the observed mean and variance
    instead (:func:`.finish_times.finish_steps`). The exponential's finishes do not depend on the progress; real
    lengths vary less (kvcost issue 13: right after a burst admitted 354 decoders on one worker,
    about one finished a second for over 10 s, a fraction of the stationary rate ``n ÷ E[L]`` a
    step).

    When a finish frees no more than is taken meanwhile, the wait is the whole batch's drain,
    ``mean × (1 + 1/2 + … + 1/n)`` steps (progress known: the last finish of :func:`.finish_times.finish_steps`).
    When ``k > n``, the drain is not enough: the requests admitted as memory frees must finish too.
    Their finishes come at the batch's stationary rate, ``n ÷ mean`` a step (Little's law, as
    above), each freeing the same net blocks, so the wait is the drain plus ``(k − n) × mean ÷ n``
    steps: it grows with the deficit at the rate the worker's memory turns over. This is the
    regime of a worker whose memory holds a few long prompts at a time (an L40S serving Llama-2-7B
    holds about four of the bundled trace's conversations; measured against the queue residual in
    ``docs/routing-sensitivity.md``, "The KV wait beyond one drain of the running batch"); on A100s
    serving Llama-3-8B ``k`` stays within the batch and nothing changes. The first
    ``ceil(queued_prefill_tokens / (token_budget − n))`` of those steps are the compute queue's own
    (chunked prefill, :func:`queue_and_prefill_s`), which the request waits out anyway; the wait for
    memory is the steps beyond them, each a decode-only step (``step_model.step_s``): of the running
    batch over its context until it has drained, then, for the ``k − n`` later finishes, over the
    context the memory holds (``held_blocks × block_size_tokens``). The requests admitted as memory
    frees fill it again, so the batch whose finishes those are reads the whole held memory each step,
    however little of it the decoders hold now (the rest held by prompts still in prefill, which
    decode over their whole prompts once admitted). Where the decoders hold the memory the two
    contexts are the same, and nothing changes; where a few long prompts in prefill hold it (long
    contexts, models without grouped-query attention), the current batch's short context priced
    those steps at a fraction of their time.
    With nothing decoding, the holders are still in prefill (:func:`_turnover_wait_s`): they release
    the memory one decode lifetime after their prefill, and the requests admitted in their place hold
    it as long, so the memory turns over once per mean lifetime. The deficit takes
    ``max(1, deficit / (held − mean / block_size_tokens))`` lifetimes (the ``k > n`` rule above with
    the holders as one batch), each step a decode step over the held context, less the compute
    queue's own steps. The state arises where a worker's memory holds a few long prompts (long
    contexts, models without grouped-query attention, small GPUs); the rule it replaces, one
    empty-context lifetime whatever the deficit, under-predicted those queues by tens of seconds
    (``docs/routing-sensitivity.md``, "The KV wait with nothing decoding").

    Counting steps rather than seconds matters: a step full of prefill chunks takes 20-40 times a
    decode-only step, and decoders advance one token per step whatever its length.

    Measured (kvcost issue 13; ``docs/routing-unseen-workloads.md``): on the shared-prefix workload
    at 4 workers, 733 decoders sharing one system prompt held 880 blocks of 512 tokens; 64 queued
    requests needed 64 blocks and were admitted over 50 steps (11 s), while counting each decoder's
    whole context as released predicted 0.6 s. The release and growth terms are what it missed.

    Why it should hold on other workloads: nothing in it is fitted; the deficit, the held blocks,
    the decode batch and the queue are read from each snapshot and the step times from the GPU
    type's profile. The mean output length is the one stated assumption
    (``NominalCosts.output_tokens_mean``; the router estimates it online from the output lengths
    of the requests that finished, :class:`~kvcost.features.decode_length.OutputLengthEstimate`).

    Args:
        step_model: the worker's GPU type nominal step-time model.
        deficit_blocks: blocks missing now (queued prompts + this request's new blocks − evictable).
        running_requests, decode_context_tokens: the decode batch and its KV tokens, ≥ 0.
        block_size_tokens: tokens per block, ≥ 1.
        mean_output_tokens: mean output length of a request, tokens, ≥ 0.
        queued_prefill_tokens: prefill tokens queued ahead of this request, ≥ 0.
        held_blocks: physical blocks held by the running requests (``kv_usage × capacity``);
            None = ``decode_context_tokens / block_size_tokens`` (no sharing known).
        running_output_tokens: tokens each decoder has produced so far; used only when it has
            ``running_requests`` entries (else the progress is taken as unknown).
        output_cv2: squared coefficient of variation of the output lengths (> 0; 1 =
            exponential), for the law :func:`.finish_times.finish_steps` assumes.
    """
    worker = KvWaitInputs(
        step_model,
        deficit_blocks,
        running_requests,
        decode_context_tokens,
        queued_prefill_tokens,
        held_blocks,
        running_output_tokens,
    )
    return float(kv_wait_batch_s((worker,), block_size_tokens, mean_output_tokens, output_cv2)[0])


class KvWaitInputs(NamedTuple):
    """One worker's state for the KV-wait estimate (the per-worker arguments of :func:`kv_wait_s`,
    which documents each)."""

    step_model: StepTimeModel
    deficit_blocks: float
    running_requests: int
    decode_context_tokens: int
    queued_prefill_tokens: int
    held_blocks: float | None = None
    running_output_tokens: Sequence[int] = ()


def kv_wait_batch_s(
    workers: Sequence[KvWaitInputs], block_size_tokens: int, mean_output_tokens: float, output_cv2: float = 1.0
) -> np.ndarray:
    """:func:`kv_wait_s` of one request on each of several workers, float64 ``(len(workers),)``, seconds.

    The same estimate, computed together: the workers whose decoders' progress is known have their
    finishes found in one :func:`.finish_times.finish_steps_batch` call (a router prices every candidate of a
    decision, and the root finding is what costs; ``make bench`` measures the route with every
    candidate short of memory).

    Args:
        workers: each candidate's state (:class:`KvWaitInputs`).
        block_size_tokens, mean_output_tokens, output_cv2: as in :func:`kv_wait_s`, shared by all.

    Raises:
        ValueError: ``output_cv2`` not > 0 where a worker's progress is used (:func:`.finish_times.finish_steps_batch`).
    """
    mean_steps = float(mean_output_tokens)
    waits = np.zeros(len(workers), dtype=np.float64)
    pending: list[tuple[int, int]] = []  # (index, finishes) of the workers whose progress is known
    for i, w in enumerate(workers):
        if w.deficit_blocks <= 0:
            continue
        n = w.running_requests
        if n <= 0 or w.decode_context_tokens <= 0:
            waits[i] = _turnover_wait_s(w, block_size_tokens, mean_steps)
            continue
        k, held = _finishes_needed(w, block_size_tokens, mean_steps, output_cv2)
        known = len(w.running_output_tokens) == n
        later_steps = max(0, k - n) * mean_steps / n  # the finishes beyond this batch, at n ÷ mean a step
        if known and mean_steps > 0:
            pending.append((i, min(k, n), later_steps, held))
        else:
            batch_steps = mean_steps * (_harmonic(n) - _harmonic(max(0, n - k)))
            waits[i] = _wait_beyond_queue_s(w, batch_steps, later_steps, held, block_size_tokens)
    if pending:
        progress = [workers[i].running_output_tokens for i, *_ in pending]
        steps = finish_steps_batch([k for _, k, _, _ in pending], progress, mean_steps, output_cv2)
        for (i, _, later, held), s in zip(pending, steps.tolist(), strict=True):
            waits[i] = _wait_beyond_queue_s(workers[i], s, later, held, block_size_tokens)
    return waits


def _finishes_needed(w: KvWaitInputs, block_size_tokens: int, mean_steps: float, cv2: float) -> tuple[int, float]:
    """``(k, held_blocks)`` of :func:`kv_wait_s` for a worker with decoders and a deficit: how many finishes free
    the deficit, and the blocks the running requests hold."""
    n = w.running_requests
    held = w.decode_context_tokens / block_size_tokens if w.held_blocks is None else float(w.held_blocks)
    freed_per_finish = held / n - mean_steps / block_size_tokens
    if freed_per_finish <= 0:
        known = len(w.running_output_tokens) == n
        progress = sum(w.running_output_tokens) / n if known else mean_steps * (1.0 + cv2) / 2.0
        freed_per_finish = held / n - progress / block_size_tokens
    k = math.ceil(w.deficit_blocks / freed_per_finish) if freed_per_finish > 0 else n
    return k, held


def kv_wait_sd_batch_s(
    workers: Sequence[KvWaitInputs], block_size_tokens: int, mean_output_tokens: float, output_cv2: float = 1.0
) -> np.ndarray:
    """Standard deviation of each worker's KV wait (:func:`kv_wait_batch_s`), float64 ``(len(workers),)``, seconds ≥ 0.

    The spread of the same model: the ``k``-th of ``n`` exponential finishes is a sum of independent gaps
    of means ``mean ÷ n, mean ÷ (n − 1), …``, so its variance is ``mean² × (1/n² + … + 1/(n − k + 1)²)``
    steps² (order statistics of exponentials); each of the ``k − n`` later finishes adds a gap of
    variance ``(mean ÷ n)²``; with nothing decoding, each of the memory's turnovers is one lifetime of
    variance ``mean²``. The exponential's variance is scaled by the observed ``output_cv2`` (a law of
    that squared coefficient of variation; the exponential has 1). Steps are priced as the estimate
    prices them (the batch's, then the held memory's); the compute queue's steps are taken as certain
    and are not subtracted, so this is the spread of the whole wait for memory. 0 without a deficit.

    It is wide where few requests hold the memory (one decoder's remaining life has a standard deviation
    as large as its mean) and narrow where many do: what a router needs to know before it takes a
    lower estimate for a better worker (:func:`~kvcost.routing.policies.basic.kv_wait_near_ties`; measured
    in ``docs/routing-sensitivity.md``, "Near ties under the KV wait's spread").

    Args:
        workers, block_size_tokens, mean_output_tokens, output_cv2: as in :func:`kv_wait_batch_s`.
    """
    mean_steps = float(mean_output_tokens)
    spread = np.zeros(len(workers), dtype=np.float64)
    for i, w in enumerate(workers):
        if w.deficit_blocks <= 0 or mean_steps <= 0:
            continue
        n = w.running_requests
        if n <= 0 or w.decode_context_tokens <= 0:
            lifetimes, step_s = _turnover(w, block_size_tokens, mean_steps)
            spread[i] = mean_steps * math.sqrt(lifetimes * output_cv2) * step_s
            continue
        k, held = _finishes_needed(w, block_size_tokens, mean_steps, output_cv2)
        batch_var = _inverse_squares(n) - _inverse_squares(n - min(k, n))
        later_var = max(0, k - n) / (n * n)
        batch_step_s, later_step_s = _decode_step_times_s(w, held, block_size_tokens)
        variance = batch_var * batch_step_s**2 + later_var * later_step_s**2
        spread[i] = mean_steps * math.sqrt(output_cv2 * variance)
    return spread


def _turnover_wait_s(worker: KvWaitInputs, block_size_tokens: int, mean_steps: float) -> float:
    """:func:`kv_wait_s` with nothing decoding, seconds (≥ 0): ``max(1, deficit / net)`` mean decode
    lifetimes of single-request steps over the held context, less the compute queue's steps, where
    ``net = held − mean_steps / block_size_tokens`` (one lifetime where ``net`` ≤ 0 or the held
    blocks are unknown)."""
    lifetimes, step_s = _turnover(worker, block_size_tokens, mean_steps)
    queue_steps = math.ceil(worker.queued_prefill_tokens / max(1, worker.step_model.token_budget))
    return max(0.0, mean_steps * lifetimes - queue_steps) * step_s


def _turnover(worker: KvWaitInputs, block_size_tokens: int, mean_steps: float) -> tuple[float, float]:
    """``(lifetimes, step_s)`` of the memory's turnover with nothing decoding (:func:`_turnover_wait_s`): the mean
    decode lifetimes the deficit takes, and one single-request decode step over the held context, seconds."""
    held = 0.0 if worker.held_blocks is None else float(worker.held_blocks)
    net = held - mean_steps / block_size_tokens
    lifetimes = max(1.0, worker.deficit_blocks / net) if net > 0 else 1.0
    return lifetimes, worker.step_model.step_s(1, 0.0, int(held * block_size_tokens))


def _wait_beyond_queue_s(
    worker: KvWaitInputs, batch_steps: float, later_steps: float, held_blocks: float, block_size_tokens: int
) -> float:
    """Seconds of the decode steps beyond the compute queue's own (:func:`kv_wait_s`): ``batch_steps``
    until the running batch's finishes, then ``later_steps`` for the finishes of the requests admitted
    in its place, each priced by :func:`_decode_step_times_s`. The compute queue's steps are taken off
    the first ones."""
    n = worker.running_requests
    queue_steps = math.ceil(worker.queued_prefill_tokens / max(1, worker.step_model.token_budget - n))
    batch_step_s, later_step_s = _decode_step_times_s(worker, held_blocks, block_size_tokens)
    later_steps -= max(0.0, queue_steps - batch_steps)
    return max(0.0, batch_steps - queue_steps) * batch_step_s + max(0.0, later_steps) * later_step_s


def _decode_step_times_s(worker: KvWaitInputs, held_blocks: float, block_size_tokens: int) -> tuple[float, float]:
    """``(batch_step_s, later_step_s)``: a decode step of the running batch over its context, and one over
    the context the memory holds (``held_blocks`` × block size, at least the batch's: the requests
    admitted as memory frees fill it again), seconds."""
    n, model = worker.running_requests, worker.step_model
    held_tokens = max(worker.decode_context_tokens, int(held_blocks * block_size_tokens))
    return model.step_s(n, 0.0, worker.decode_context_tokens), model.step_s(n, 0.0, held_tokens)


def _harmonic(m: int) -> float:
    """The harmonic number ``1 + 1/2 + … + 1/m`` (0 for ``m`` ≤ 0): summed up to 64 terms, else its
    asymptotic expansion ``ln m + γ + 1/(2m) − 1/(12m²)`` (error below 1e-9 there), so that any batch
    size a snapshot may claim costs O(1)."""
    if m <= 64:
        return sum(1.0 / i for i in range(1, m + 1))
    return math.log(m) + 0.5772156649015329 + 1.0 / (2 * m) - 1.0 / (12 * m * m)


def _inverse_squares(m: int) -> float:
    """``1 + 1/2² + … + 1/m²`` (0 for ``m`` ≤ 0): summed up to 64 terms, else ``π²/6 − ψ₁(m + 1)`` with the
    trigamma function's asymptotic series ``1/x + 1/(2x²) + 1/(6x³) − 1/(30x⁵)`` (error below 1e-12 there)."""
    if m <= 64:
        return sum(1.0 / (i * i) for i in range(1, m + 1))
    x = m + 1.0
    return math.pi**2 / 6 - (1 / x + 1 / (2 * x * x) + 1 / (6 * x**3) - 1 / (30 * x**5))


def queue_and_prefill_s(
    step_model: StepTimeModel,
    waiting_prefill: tuple[tuple[int, int], ...],
    running_requests: int,
    decode_context_tokens: int,
    step_remaining_s: float,
    uncached_tokens: int,
    reusable_tokens: int,
) -> tuple[float, float]:
    """Nominal (queue_s, prefill_s) of a request placed behind ``waiting_prefill`` on one worker.

    Args:
        step_model: the worker's GPU type nominal step-time model.
        waiting_prefill: ``(remaining_tokens, context_tokens)`` per request ahead, FCFS.
        running_requests: decoding requests (one budget token each per step).
        decode_context_tokens: KV tokens the decode batch reads per step.
        step_remaining_s: time left in the worker's current step.
        uncached_tokens: this request's tokens to prefill (≥ 1).
        reusable_tokens: this request's reused prefix (context of its first chunk).

    Returns:
        ``(queue_s, prefill_s)``: arrival → first chunk start, and first chunk
        start → last chunk end. Both ≥ 0.
    """
    budget = step_model.token_budget
    chunk_tokens = max(1, budget - running_requests)
    fixed_s = step_model.attention_s(0.0, decode_context_tokens) + step_model.step_overhead_s
    full_step_s = step_model.nonattention_s(budget) + fixed_s
    ahead_tokens, ahead_pairs = 0, 0.0
    for remaining, context in waiting_prefill:  # one pass: this runs per candidate of every decision
        ahead_tokens += remaining
        ahead_pairs += remaining * (context + (remaining + 1) / 2)
    ahead_attention_s = step_model.attention_s(step_model.attention_flops_of_pairs(ahead_pairs), 0)
    own_attention_s = step_model.attention_s(step_model.prefill_attention_flops(uncached_tokens, reusable_tokens), 0)
    work_tokens = ahead_tokens + uncached_tokens
    full_steps, tail_tokens = divmod(work_tokens, chunk_tokens)
    start_step = ahead_tokens // chunk_tokens
    if work_tokens <= chunk_tokens:
        step_s = step_model.nonattention_s(work_tokens + running_requests) + fixed_s
        return step_remaining_s, step_s + ahead_attention_s + own_attention_s
    tail_s = step_model.nonattention_s(tail_tokens + running_requests) + fixed_s if tail_tokens else 0.0
    total_s = full_steps * full_step_s + tail_s + ahead_attention_s + own_attention_s
    ahead_share = start_step * chunk_tokens / ahead_tokens if ahead_tokens else 0.0
    queue_s = start_step * full_step_s + ahead_attention_s * ahead_share
    return step_remaining_s + queue_s, total_s - queue_s

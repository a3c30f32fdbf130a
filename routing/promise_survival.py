"""The reuse a request can expect at its admission, not the reuse it was promised (kvcost issue 13 §3).

A promise is the prefix a worker holds (the directory) or will hold (requests routed there ahead
of this one, :class:`~kvcost.routing.routed_index.InFlightPrefixes`) when the router decides. Under
memory pressure part of it is evicted before the request is admitted, and the request recomputes
it. :func:`expected_reuse_blocks` is the promise weighted by the chance that it survives until
admission. The router uses it for the work a request adds to its worker's queue
(``RouteDecision.expected_reuse_tokens``): the requests queued ahead of a later request count
their expected reuse, not their promises. The request's own score keeps the promise: with the
survival in the score too, long conversations left their holders for a full recompute elsewhere
and the tails grew (``docs/routing-unseen-workloads.md``, "Where promises die").

Where the model comes from (``docs/routing-unseen-workloads.md``, "Where promises die", the
replays' logs classed by what the router knew at the decision):

* **No KV deficit, no loss.** Where the blocks the requests queued ahead and this one need fit in
  the worker's free and idle blocks (the ``kv_deficit_blocks`` feature is 0), 0.0–0.3 % of the
  promised tokens were lost, on every workload.
* **The stored part beyond the in-flight cover** is held, at most, by one running request (the
  conversation's previous turn, still decoding; a prefix two or more decoders hold was almost
  never lost). LRU frees it when that request ends, and the requests queued ahead, which allocate
  first, take it if they still lack blocks. With the finishing order of the running requests
  exchangeable, the others free the deficit first with probability ``1 − deficit ÷ held``, where
  ``held`` is the blocks running requests hold: the survival of that part (its calibration on two
  GPU types is in the docs).
* **The in-flight part** is stored by a sibling queued ahead and held while it runs. It was never
  lost where that sibling was still running when the request was admitted, and 76–89 % lost
  where it had finished (three workloads, two GPU types). So its loss is P(the sibling finishes
  before this request's admission): the sibling's predicted first token, plus its output at this
  worker's decode step time, before now + the predicted queue, with the output length drawn from
  the router's online estimate of the output law (a gamma of the observed mean and squared
  coefficient of variation, as in the KV-wait feature). Where several queued requests carry the
  block (a shared system prompt in a burst), every one of them must be done first: the
  probability to the power of their number (taken as independent; without it, a burst of one
  family read as lost prefixes everywhere). Where a shared prefix stays held by other running
  requests the estimate is pessimistic; the docs give how much.

Why it should hold on other workloads: nothing in it is fitted. The deficit, the held blocks, the
queue, the step time and the output law come from each snapshot, the cost model and the router's
own observations; where memory is not short every factor is 1 and nothing changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.special import gammainc

from kvcost.core.hardware import StepTimeModel
from kvcost.core.types import RouteRequest, WorkerSnapshot
from kvcost.features.spec import FEATURE_INDEX


def stored_survival(deficit_blocks: float, held_blocks: float) -> float:
    """P(a stored prefix held by at most one running request survives until admission), in [0, 1].

    ``1 − deficit_blocks ÷ held_blocks`` clipped to [0, 1]; 1 where the deficit is ≤ 0 (the queue
    is served from free and idle blocks), 0 where a deficit meets no held block (the prefix is
    idle and goes first). See the module docstring for the derivation.
    """
    if deficit_blocks <= 0:
        return 1.0
    if held_blocks <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - deficit_blocks / held_blocks))


def sibling_done_probability(
    slack_s: float, decode_step_s: float, mean_output_tokens: float, output_tokens_cv2: float
) -> float:
    """P(a sibling's decode ends within ``slack_s`` seconds of its first token), in [0, 1].

    The sibling decodes ``L`` tokens at ``decode_step_s`` seconds each, ``L`` gamma-distributed
    with mean ``mean_output_tokens`` and squared coefficient of variation ``output_tokens_cv2``
    (shape ``1 ÷ cv²``, scale ``mean × cv²``): ``P(L ≤ slack_s ÷ decode_step_s)``, the regularised
    lower incomplete gamma function. 0 where ``slack_s`` ≤ 0; 1 where the mean output is 0 or the
    step time is 0 and the slack positive.

    Raises:
        ValueError: ``output_tokens_cv2`` not > 0.
    """
    if not output_tokens_cv2 > 0:
        raise ValueError(f"output_tokens_cv2 = {output_tokens_cv2}, expected a number > 0")
    if slack_s <= 0:
        return 0.0
    if mean_output_tokens <= 0 or decode_step_s <= 0:
        return 1.0
    shape = 1.0 / output_tokens_cv2
    scale = mean_output_tokens * output_tokens_cv2
    return float(gammainc(shape, slack_s / decode_step_s / scale))


def expected_reuse_blocks(
    promised_blocks: int,
    in_flight_blocks: int,
    deficit_blocks: float,
    held_blocks: float,
    sibling_done: float,
) -> float:
    """Leading blocks of a promise expected to be held at admission, in [0, ``promised_blocks``].

    ``promised_blocks − (1 − stored_survival) × (promised − covered) − sibling_done × covered``,
    where ``covered = min(in_flight_blocks, promised_blocks)`` is the part a sibling queued ahead
    stores; the whole promise where ``deficit_blocks`` ≤ 0.

    Args:
        promised_blocks: the promise, directory and in flight (≥ 0).
        in_flight_blocks: leading blocks in flight to the worker (≥ 0).
        deficit_blocks: the worker's KV deficit with this request (``kv_deficit_blocks``).
        held_blocks: blocks its running requests hold (capacity − ``kv_available_blocks``).
        sibling_done: :func:`sibling_done_probability` of the in-flight sibling, in [0, 1].
    """
    if promised_blocks <= 0 or deficit_blocks <= 0:
        return float(max(0, promised_blocks))
    covered = min(in_flight_blocks, promised_blocks)
    stored = promised_blocks - covered
    lost = (1.0 - stored_survival(deficit_blocks, held_blocks)) * stored + sibling_done * covered
    return max(0.0, promised_blocks - lost)


def sibling_slack_s(now_s: float, queue_s: float, sibling_first_token_s: float | None) -> float:
    """Seconds between the sibling's predicted first token and this request's predicted admission
    (``now_s + queue_s − sibling_first_token_s``); ``-inf`` when no sibling's time is known."""
    if sibling_first_token_s is None or not math.isfinite(sibling_first_token_s):
        return -math.inf
    return now_s + queue_s - sibling_first_token_s


def expected_reuse_tokens(
    request: RouteRequest,
    snapshots: Sequence[WorkerSnapshot],
    reusable_tokens: np.ndarray,
    promised_blocks: Sequence[int],
    in_flight_blocks: Sequence[int],
    siblings: Sequence[tuple[float | None, int]],
    features: np.ndarray,
    queue_s: np.ndarray,
    step_models: Mapping[str, StepTimeModel],
    output_law: tuple[float, float],
    now_s: float,
) -> np.ndarray:
    """Each candidate's reusable tokens less the part expected lost before admission, int64 ``(n,)``.

    Per candidate: :func:`expected_reuse_blocks` of its GPU promise (``promised_blocks``, directory
    and in flight) with the deficit and held blocks of its feature row (``kv_deficit_blocks``;
    capacity − ``kv_available_blocks``), the sibling's :func:`sibling_done_probability` over
    :func:`sibling_slack_s` at the candidate's decode step time with the request in the batch
    (``step_s(running + 1, 0, decode context + input)``); the blocks expected lost come off
    ``reusable_tokens`` (whole blocks, rounded to the nearest), never below 0.

    Args:
        request: the request.
        snapshots: the candidates, ``(n,)``.
        reusable_tokens: int ``(n,)``, the reuse the router counted (its chosen plan's).
        promised_blocks, in_flight_blocks: ``(n,)`` each, leading blocks held or in flight, and in flight.
        siblings: ``(n,)`` of ``(first token, chains)``: the latest predicted first token of the in-flight
            requests holding the deepest in-flight block (None: unknown), and how many in-flight chains hold
            it (≥ 0). The in-flight part is lost only if every one of them is done first: the single
            sibling's probability to the power of their number (taken as independent).
        features: ``(n, len(FEATURE_SPEC))`` feature rows of the candidates.
        queue_s: ``(n,)`` predicted queue terms, seconds.
        step_models: step-time model per GPU type.
        output_law: ``(mean output tokens, squared coefficient of variation)`` of the output lengths.
        now_s: decision time, the clock of the siblings' first tokens.

    Raises:
        KeyError: a candidate with a deficit has a GPU type without a step model.
    """
    block_size = request.namespace.block_size_tokens
    deficit = features[:, FEATURE_INDEX["kv_deficit_blocks"]]
    available = features[:, FEATURE_INDEX["kv_available_blocks"]]
    expected = np.asarray(reusable_tokens, dtype=np.int64).copy()
    for i, s in enumerate(snapshots):
        if deficit[i] <= 0 or promised_blocks[i] <= 0:
            continue
        first_token_s, chains = siblings[i]
        slack_s = sibling_slack_s(now_s, float(queue_s[i]), first_token_s)
        done = 0.0
        if in_flight_blocks[i] > 0 and slack_s > 0:
            context = s.decode_context_tokens + request.input_tokens
            step_s = step_models[s.gpu].step_s(s.running_requests + 1, 0.0, context)
            done = sibling_done_probability(slack_s, step_s, *output_law) ** max(1, chains)
        held = s.kv_capacity_blocks - available[i]
        kept = expected_reuse_blocks(promised_blocks[i], in_flight_blocks[i], deficit[i], held, done)
        lost_blocks = round(promised_blocks[i] - kept)
        expected[i] = max(0, expected[i] - lost_blocks * block_size)
    return expected

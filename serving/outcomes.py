"""What a routed request's outcome is, and its ``requests`` row (``/v1/observe``, or what the gateway measured)."""

from __future__ import annotations

from dataclasses import dataclass

from kvcost.data.log_rows import RequestRow
from kvcost.data.store import TERMS_AND_TTFT
from kvcost.serving.routing import DecisionRecord
from kvcost.serving.schemas import ObservationIn


@dataclass(frozen=True, slots=True)
class MeasuredOutcome:
    """What the gateway measured of one request it routed and forwarded.

    Attributes:
        request_id: the gateway's id of the routing decision.
        ttft_s: arrival at the gateway to the first streamed chunk, seconds; None when no token
            arrived, or the request was not streamed (then only ``e2e_s`` is known).
        queue_s: the engine's own queue time of the request, seconds; None when it reports none.
        e2e_s: arrival to the last byte, seconds; None when the request did not complete.
        tpot_s: mean time per output token after the first, seconds; None when unknown.
        output_tokens: generated tokens (the engine's usage); None when not reported.
        actual_reuse_tokens: the engine's ``usage.prompt_tokens_details.cached_tokens``; None when not reported.
        directory_reuse_tokens: the directory's own match on the chosen worker at decision time, capped
            as the engine caps a full hit (vLLM computes at least the last block-aligned part).
        client_request_id: the client's id (``X-Request-Id`` or ``request_id``).
        outcome: ``ok``, or what ended the request, naming the engine.
    """

    request_id: int
    ttft_s: float | None
    queue_s: float | None
    e2e_s: float | None
    tpot_s: float | None
    output_tokens: int | None
    actual_reuse_tokens: int | None
    directory_reuse_tokens: int
    client_request_id: str | None
    outcome: str


def request_row(body: ObservationIn | MeasuredOutcome, d: DecisionRecord) -> RequestRow:
    """The ``requests`` row of an observation (``/v1/observe``, or what the gateway measured) joined to its decision.

    Engines do not report where a prefix came from nor what a miss cost:
    ``mismatch_lost_s`` and ``served_by`` are NULL; the mismatch is known only
    when the observation reports the reuse. A term the observation does not
    carry (the gateway knows only the queue and TTFT) is NULL, as are the
    gateway's columns for an ``/v1/observe`` observation.
    """
    actual_reuse = body.actual_reuse_tokens
    return RequestRow(
        request_id=body.request_id,
        arrival_s=d.arrival_s,
        worker_id=d.worker_id,
        input_tokens=d.input_tokens,
        output_tokens=body.output_tokens,
        predicted_reuse_tokens=d.predicted_reuse_tokens,
        actual_reuse_tokens=actual_reuse,
        predicted_s=d.predicted_s,
        actual_s=tuple(getattr(body, f"{term}_s", None) for term in TERMS_AND_TTFT),
        tpot_s=body.tpot_s,
        e2e_s=body.e2e_s,
        directory_mismatch_tokens=None if actual_reuse is None else max(0, d.predicted_reuse_tokens - actual_reuse),
        directory_reuse_tokens=getattr(body, "directory_reuse_tokens", None),
        client_request_id=getattr(body, "client_request_id", None),
        outcome=getattr(body, "outcome", None),
    )

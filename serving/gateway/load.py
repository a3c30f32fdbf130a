"""Load between scrapes: what the gateway itself sent to each engine (Dynamo's router-side active blocks).

A metrics scrape is up to ``--scrape-interval-s`` old, and a burst of requests
routed within one interval would all see the same queue. The gateway knows
what it sent: each request it forwards is queued prefill work on that worker
from routing until its first token, then a decoding request until its last.
:class:`SentLoad` keeps those per worker, so Q is known at once; a scrape
corrects it where it knows more (requests that reached the engine by another
path, and the engine's own KV usage and step time): per quantity the larger of
the two counts wins, since neither can undercount what the other saw.

The same accounting as NVIDIA Dynamo's KV router ("active blocks": incremented
when a request is routed, updated as it generates, decremented when it completes;
Dynamo's router design notes), with kvcost's per-request prefill tokens net of the
promised reuse instead of block counts.

Thread safety: the event loop only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvcost.core.types import WorkerSnapshot, blocks_to_allocate


@dataclass(slots=True)
class _Sent:
    worker_id: int
    prefill_tokens: int  # prompt tokens left to compute (input − promised reuse)
    context_tokens: int  # tokens already in KV at admission (the promised reuse)
    decoding: bool = False
    generated_tokens: int = 0


class SentLoad:
    """Per worker: requests sent and not yet at their first token (queued prefill), and those decoding.

    Keys are the gateway's request ids. Every method ignores an unknown key (a request
    already finished), so the proxy's paths can call them without bookkeeping.

    The requests are also kept per worker (in the order sent, which is FCFS): a route builds
    every candidate's snapshot, and reading each worker's own requests costs O(requests in
    flight) per route instead of O(workers × requests in flight). With 32 workers and 400
    decoders each that was 410,000 entries visited per route.
    """

    def __init__(self) -> None:
        self._sent: dict[int, _Sent] = {}
        self._by_worker: dict[int, dict[int, _Sent]] = {}

    def __len__(self) -> int:
        return len(self._sent)

    def routed(self, request_id: int, worker_id: int, input_tokens: int, reusable_tokens: int) -> None:
        """The request was sent to ``worker_id``: ``input_tokens − reusable_tokens`` tokens of prefill queued.

        Raises:
            ValueError: a negative count, or more reuse than input.
        """
        if input_tokens < 0 or not 0 <= reusable_tokens <= input_tokens:
            raise ValueError(
                f"input_tokens = {input_tokens}, reusable_tokens = {reusable_tokens}, expected 0 ≤ reusable ≤ input"
            )
        self.finished(request_id)  # a retry re-routes an id: it leaves its first worker
        sent = _Sent(worker_id, input_tokens - reusable_tokens, reusable_tokens)
        self._sent[request_id] = sent
        self._by_worker.setdefault(worker_id, {})[request_id] = sent

    def first_token(self, request_id: int) -> None:
        """The request's first token arrived: its prefill is done, it decodes now."""
        sent = self._sent.get(request_id)
        if sent is not None:
            sent.decoding = True
            sent.generated_tokens = max(1, sent.generated_tokens)

    def generated(self, request_id: int, tokens: int) -> None:
        """The request has generated ``tokens`` so far (its KV grows by them)."""
        sent = self._sent.get(request_id)
        if sent is not None:
            sent.generated_tokens = max(sent.generated_tokens, tokens)

    def finished(self, request_id: int) -> None:
        """The request ended (last token, error or cancel): it no longer loads its worker."""
        sent = self._sent.pop(request_id, None)
        if sent is not None:
            del self._by_worker[sent.worker_id][request_id]

    def counts(self, worker_id: int) -> tuple[int, int, int]:
        """``(waiting requests, decoding requests, prefill tokens queued)`` that the gateway sent to ``worker_id``."""
        waiting = decoding = tokens = 0
        for sent in self._by_worker.get(worker_id, {}).values():
            if sent.decoding:
                decoding += 1
            else:
                waiting += 1
                tokens += sent.prefill_tokens
        return waiting, decoding, tokens

    def snapshot(
        self, worker_id: int, gpu: str, scraped: WorkerSnapshot | None, block_size_tokens: int
    ) -> WorkerSnapshot:
        """``worker_id``'s load: what the gateway sent, corrected by its last scrape.

        Waiting requests: the gateway's own, FCFS, each ``(prefill tokens left, context
        tokens)``; when the scrape counts more waiting than that, the extra ones (sent by
        another path) are appended as the scrape describes them. Decoding requests and
        their KV: the larger of the two. KV usage, capacity and step time: the scrape's
        (0 = unknown without one). The decoders' progress: the tokens the gateway streamed for
        each of its own (where the scrape counts more decoders, the KV-wait estimate takes the
        progress as unknown).

        Args:
            worker_id: the worker.
            gpu: its GPU type (used when there is no scrape).
            scraped: its last scraped (or pushed) snapshot, or None.
            block_size_tokens: the engines' KV block size (≥ 1), for the blocks waiting prompts need.

        Returns:
            A :class:`WorkerSnapshot` for the router.
        """
        own = self._by_worker.get(worker_id, {}).values()
        waiting = tuple((s.prefill_tokens, s.context_tokens) for s in own if not s.decoding)
        decoding = [s for s in own if s.decoding]
        context = sum(s.context_tokens + s.prefill_tokens + s.generated_tokens for s in decoding)
        own_blocks = sum(blocks_to_allocate(tokens + ctx, ctx, block_size_tokens) for tokens, ctx in waiting)
        progress = tuple(s.generated_tokens for s in decoding)
        if scraped is None:
            return WorkerSnapshot(
                worker_id=worker_id,
                gpu=gpu,
                waiting_prefill=waiting,
                running_requests=len(decoding),
                decode_context_tokens=context,
                kv_usage=0.0,
                idle_cached_blocks=0,
                recent_step_s=0.0,
                step_remaining_s=0.0,
                waiting_prompt_blocks=own_blocks,
                running_output_tokens=progress,
            )
        extra = scraped.waiting_prefill[len(waiting) :]
        running = max(len(decoding), scraped.running_requests - len(waiting))
        return replace(
            scraped,
            worker_id=worker_id,
            waiting_prefill=waiting + tuple(extra),
            running_requests=max(0, running),
            decode_context_tokens=max(context, scraped.decode_context_tokens),
            waiting_prompt_blocks=max(own_blocks, scraped.waiting_prompt_blocks),
            running_output_tokens=progress,
        )

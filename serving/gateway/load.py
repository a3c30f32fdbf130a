"""Load between scrapes: what the gateway itself sent to each engine (Dynamo's router-side active blocks).

A metrics scrape is up to ``--scrape-interval-s`` old, and a burst of requests
routed within one interval would all see the same queue. The gateway knows
what it sent: each request it forwards is queued prefill work on that worker
from routing until its first token, then a decoding request until its last.
:class:`SentLoad` keeps those per worker, so Q is known at once. A scrape adds
what only it knows: the requests that reached the engine by another path, and
the engine's own KV usage and step time. It counts the gateway's own requests
too, as they stood when it was read, so the gateway notes its own counts at
each scrape (:meth:`SentLoad.scraped`) and takes from the scrape only the
excess over them. A burst that has ended then leaves no load behind it for the
rest of the interval: its requests are gone from the gateway's counts at once,
and the scrape's stale copies of them are not counted twice (docs/gateway.md,
"A scrape taken during a burst, read after it").

The same accounting as NVIDIA Dynamo's KV router ("active blocks": incremented
when a request is routed, updated as it generates, decremented when it completes;
Dynamo's router design notes), with kvcost's per-request prefill tokens net of the
promised reuse instead of block counts.

Thread safety: the event loop only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from kvcost.core.types import WorkerSnapshot, blocks_to_allocate


@dataclass(slots=True)
class _Sent:
    worker_id: int
    prefill_tokens: int  # prompt tokens left to compute (input − promised reuse)
    context_tokens: int  # tokens already in KV at admission (the promised reuse)
    decoding: bool = False
    generated_tokens: int = 0
    cached_prefix: tuple[int, ...] = ()  # block hashes of the stored prefix it expects to reuse
    prompt_blocks: tuple[int, ...] = ()  # its prompt's full-block hashes, held while it decodes


@dataclass(slots=True)
class _Pins:
    """One worker's stored blocks that the gateway's waiting requests will pin at admission, less
    those its decoding requests hold: the idle cached blocks admitting its queue takes.

    Kept as reference counts, so each route reads the count in O(1) and each request's change of
    state costs O(its blocks). The simulator counts the same from its block pool
    (``SimWorker._queue_changed``); the gateway knows it from what it routed: the stored prefix
    each waiting request was matched to, and the prompts of the requests it has decoding there.
    """

    pinned: Counter[int] = field(default_factory=Counter)
    held: Counter[int] = field(default_factory=Counter)
    idle: int = 0  # distinct block hashes pinned by a waiting request and held by no decoder

    def pin(self, block_hashes: Sequence[int], delta: int) -> None:
        """``delta`` = +1: a waiting request will pin ``block_hashes``; −1: it no longer will."""
        self.idle += delta * sum(not self.held[h] for h in _first_or_last(self.pinned, block_hashes, delta))

    def hold(self, block_hashes: Sequence[int], delta: int) -> None:
        """``delta`` = +1: a decoding request holds ``block_hashes``; −1: it released them."""
        self.idle -= delta * sum(bool(self.pinned[h]) for h in _first_or_last(self.held, block_hashes, delta))


def _first_or_last(counts: Counter[int], block_hashes: Sequence[int], delta: int) -> list[int]:
    """Add ``delta`` (±1) to each hash's count (a count of 0 leaves the counter); returns the hashes
    whose count went from 0 to 1 or from 1 to 0."""
    crossed = []
    for h in block_hashes:
        after = counts[h] + delta
        if after:
            counts[h] = after
        else:
            del counts[h]
        if after == (1 if delta > 0 else 0):
            crossed.append(h)
    return crossed


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
        self._pins: dict[int, _Pins] = {}
        #: per worker, at its last noted scrape: (stored at, own waiting, own decoding, own decoding KV tokens)
        self._at_scrape: dict[int, tuple[float, int, int, int]] = {}

    def __len__(self) -> int:
        return len(self._sent)

    def routed(
        self,
        request_id: int,
        worker_id: int,
        input_tokens: int,
        reusable_tokens: int,
        cached_prefix: Sequence[int] = (),
        prompt_blocks: Sequence[int] = (),
    ) -> None:
        """The request was sent to ``worker_id``: ``input_tokens − reusable_tokens`` tokens of prefill queued.

        Args:
            request_id: the gateway's id for the request.
            worker_id: where it was sent.
            input_tokens: its prompt tokens, ≥ 0.
            reusable_tokens: the reuse its queued work is counted net of, 0 ≤ … ≤ ``input_tokens``.
            cached_prefix: block hashes of the prefix stored on the worker when it was routed that it
                expects to reuse (in-flight blocks excluded: they are an earlier request's new blocks).
                Admission pins them; until then they count in ``waiting_prompt_blocks`` unless a
                decoding request holds them.
            prompt_blocks: its prompt's full-block hashes, held from its first token to its end.

        Raises:
            ValueError: a negative count, more reuse than input, or a cached prefix that does not begin
                the prompt.
        """
        if input_tokens < 0 or not 0 <= reusable_tokens <= input_tokens:
            raise ValueError(
                f"input_tokens = {input_tokens}, reusable_tokens = {reusable_tokens}, expected 0 ≤ reusable ≤ input"
            )
        if prompt_blocks and tuple(prompt_blocks[: len(cached_prefix)]) != tuple(cached_prefix):
            raise ValueError(
                f"cached_prefix = {list(cached_prefix)[:4]}… ({len(cached_prefix)} blocks), "
                "expected the first blocks of prompt_blocks"
            )
        self.finished(request_id)  # a retry re-routes an id: it leaves its first worker
        sent = _Sent(
            worker_id,
            input_tokens - reusable_tokens,
            reusable_tokens,
            False,
            0,
            tuple(cached_prefix),
            tuple(prompt_blocks),
        )
        self._sent[request_id] = sent
        self._by_worker.setdefault(worker_id, {})[request_id] = sent
        self._pins.setdefault(worker_id, _Pins()).pin(sent.cached_prefix, +1)

    def first_token(self, request_id: int) -> None:
        """The request's first token arrived: its prefill is done, it decodes now."""
        sent = self._sent.get(request_id)
        if sent is not None and not sent.decoding:
            pins = self._pins[sent.worker_id]
            pins.hold(sent.prompt_blocks, +1)
            pins.pin(sent.cached_prefix, -1)
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
            pins = self._pins[sent.worker_id]
            if sent.decoding:
                pins.hold(sent.prompt_blocks, -1)
            else:
                pins.pin(sent.cached_prefix, -1)

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

    def scraped(self, worker_id: int, received_at_s: float) -> None:
        """A scrape of ``worker_id`` was stored at ``received_at_s`` (the service's clock): note what the
        gateway had sent there at that moment, the part of the scrape's counts that is the gateway's own."""
        own = self._own(worker_id)
        self._at_scrape[worker_id] = (received_at_s, len(own.waiting), own.decoding, own.context_tokens)

    def snapshot(
        self,
        worker_id: int,
        gpu: str,
        scraped: WorkerSnapshot | None,
        block_size_tokens: int,
        scraped_at_s: float | None = None,
    ) -> WorkerSnapshot:
        """``worker_id``'s load: what the gateway sent, plus what its last scrape saw besides.

        Waiting requests: the gateway's own, FCFS, each ``(prefill tokens left, context
        tokens)``, then the scrape's requests in excess of the gateway's own at that scrape
        (sent by another path), as the scrape describes them. Decoding requests and their KV
        likewise: the gateway's own now, plus the scrape's excess. The excess is taken over all
        requests (waiting + decoding), since the engine may count as running a request whose
        first token has not reached the gateway yet. KV usage, capacity and step time: the
        scrape's (0 = unknown without one). Blocks the waiting requests take at admission: their new
        blocks, plus the stored prefixes they will pin that no decoding request of the gateway's holds,
        each once (:class:`_Pins`), plus the scrape's share for the others. The decoders' progress:
        the tokens the gateway streamed for each of its own (where there are other decoders, the
        KV-wait estimate takes the progress as unknown).

        A snapshot the gateway did not note (:meth:`scraped` with ``scraped_at_s``: one pushed
        over the API, say) cannot be split into own and other requests; then per quantity the
        larger of the two counts wins, since neither undercounts what the other saw.

        Args:
            worker_id: the worker.
            gpu: its GPU type (used when there is no scrape).
            scraped: its last scraped (or pushed) snapshot, or None.
            block_size_tokens: the engines' KV block size (≥ 1), for the blocks waiting prompts need.
            scraped_at_s: when ``scraped`` was stored (the service's clock), or None if unknown.

        Returns:
            A :class:`WorkerSnapshot` for the router.
        """
        own = self._own(worker_id)
        own_blocks = sum(blocks_to_allocate(t + ctx, ctx, block_size_tokens) for t, ctx in own.waiting)
        own_blocks += self._pins[worker_id].idle if worker_id in self._pins else 0
        if scraped is None:
            return WorkerSnapshot(
                worker_id=worker_id,
                gpu=gpu,
                waiting_prefill=own.waiting,
                running_requests=own.decoding,
                decode_context_tokens=own.context_tokens,
                kv_usage=0.0,
                idle_cached_blocks=0,
                recent_step_s=0.0,
                step_remaining_s=0.0,
                waiting_prompt_blocks=own_blocks,
                running_output_tokens=own.progress,
            )
        noted = self._at_scrape.get(worker_id)
        if noted is None or noted[0] != scraped_at_s:
            return _larger_of(own, own_blocks, scraped, worker_id)
        _, waiting_then, decoding_then, context_then = noted
        scraped_waiting = len(scraped.waiting_prefill)
        other = max(0, scraped_waiting + scraped.running_requests - waiting_then - decoding_then)
        other_waiting = min(other, max(0, scraped_waiting - waiting_then))
        other_running = other - other_waiting
        other_context = max(0, scraped.decode_context_tokens - context_then) if other_running else 0
        other_blocks = scraped.waiting_prompt_blocks * other_waiting // scraped_waiting if scraped_waiting else 0
        return replace(
            scraped,
            worker_id=worker_id,
            waiting_prefill=own.waiting + scraped.waiting_prefill[scraped_waiting - other_waiting :],
            running_requests=own.decoding + other_running,
            decode_context_tokens=own.context_tokens + other_context,
            waiting_prompt_blocks=own_blocks + other_blocks,
            running_output_tokens=own.progress,
        )

    def _own(self, worker_id: int) -> _Own:
        """What the gateway has sent to ``worker_id`` and not seen finish."""
        own = self._by_worker.get(worker_id, {}).values()
        waiting = tuple((s.prefill_tokens, s.context_tokens) for s in own if not s.decoding)
        decoding = [s for s in own if s.decoding]
        return _Own(
            waiting=waiting,
            decoding=len(decoding),
            context_tokens=sum(s.context_tokens + s.prefill_tokens + s.generated_tokens for s in decoding),
            progress=tuple(s.generated_tokens for s in decoding),
        )


@dataclass(frozen=True, slots=True)
class _Own:
    """The gateway's own requests on one worker: waiting ``(prefill tokens left, context tokens)`` FCFS,
    the number decoding, their KV tokens and their progress (output tokens each)."""

    waiting: tuple[tuple[int, int], ...]
    decoding: int
    context_tokens: int
    progress: tuple[int, ...]


def _larger_of(own: _Own, own_blocks: int, scraped: WorkerSnapshot, worker_id: int) -> WorkerSnapshot:
    """``scraped`` with the gateway's own requests, per quantity the larger count of the two (a snapshot
    the gateway cannot split into its own requests and others'; see :meth:`SentLoad.snapshot`)."""
    extra = scraped.waiting_prefill[len(own.waiting) :]
    running = max(own.decoding, scraped.running_requests - len(own.waiting))
    return replace(
        scraped,
        worker_id=worker_id,
        waiting_prefill=own.waiting + tuple(extra),
        running_requests=max(0, running),
        decode_context_tokens=max(own.context_tokens, scraped.decode_context_tokens),
        waiting_prompt_blocks=max(own_blocks, scraped.waiting_prompt_blocks),
        running_output_tokens=own.progress,
    )

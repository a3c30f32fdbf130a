"""Decode vLLM KV cache events and apply them to the cache directory (docs/architecture.md §7, "vLLM KV events").

Wire format (vLLM ``vllm/distributed/kv_events.py``, ``ZmqEventPublisher``): a ZMQ
multipart message ``[topic, seq, payload]`` where ``seq`` is the batch's sequence
number, 8 bytes big-endian, counting from 0 per publisher, and ``payload`` is a
msgpack ``EventBatch(ts, events, data_parallel_rank)`` encoded by msgspec:

- vLLM 0.9 and the releases up to mid-2026: ``EventBatch`` is ``array_like`` →
  ``[ts, events]`` (0.9) or ``[ts, events, data_parallel_rank]``; events are tagged
  ``array_like`` structs → ``["BlockStored", block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx, ...]``,
  ``["BlockRemoved", block_hashes, medium, group_idx]``, ``["AllBlocksCleared"]``
  (0.9 sends only up to ``lora_id`` and ``[tag, block_hashes]``; ``medium``, then
  ``lora_name`` / ``extra_keys`` / ``group_idx`` / cache-spec fields were appended).
- Later releases (vLLM PR #42892 dropped ``array_like`` from the events; 0.26 sends
  an array batch of map events, current main a map batch): events are maps with the
  tag under ``"type"`` (``{"type": "BlockStored", "block_hashes": ..., ...}``), the
  batch an array or a map ``{"ts", "events", "data_parallel_rank"}``.

Both are decoded; unknown keys and extra trailing array items are ignored;
events of an unknown type are skipped and counted. Block hashes are 64-bit ints
by default, or 32-byte digests with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``;
digests are folded to the same int (:func:`kvcost.routing.block_hash.external_hash`).

:class:`KVEventIngestor` applies batches to a :class:`~kvcost.routing.directory.CacheDirectory`
with per-worker sequence tracking: a gap is filled from the engine's replay socket
when a replay callback is configured (else the worker is marked stale), a sequence
that goes backwards means the engine restarted (the worker's entries are dropped),
and malformed messages are counted and logged, never raised.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from kvcost.core.types import Namespace
from kvcost.routing.block_hash import DEFAULT_HASH_ALGORITHM, DIGEST_BYTES, external_hash
from kvcost.routing.directory import CacheDirectory

logger = logging.getLogger(__name__)

#: vLLM ``medium`` (upper-cased) → kvcost tier. ``None`` (releases before 0.10 send no
#: medium; they publish the GPU prefix cache only) is the GPU.
DEFAULT_MEDIA: Mapping[str | None, str] = {
    None: "gpu",
    "GPU": "gpu",
    "CUDA": "gpu",
    "CPU": "cpu",
    "CPU_PINNED": "cpu",
    "DISK": "disk",
    "SSD": "disk",
    "REMOTE": "remote",
    "EXTERNAL": "remote",
}

#: Sequence bytes of the replay socket's end-of-replay marker (-1, 8 bytes big-endian, signed).
END_OF_REPLAY_SEQ = (-1).to_bytes(8, "big", signed=True)

_BlockHash = int | bytes


class BlockStored(msgspec.Struct, tag="BlockStored", frozen=True, gc=False):
    """A worker cached full blocks (vLLM ``BlockStored``); fields in vLLM's array order."""

    block_hashes: list[_BlockHash]
    parent_block_hash: _BlockHash | None = None
    token_ids: list[int] = []
    block_size: int | None = None
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: Any = None
    group_idx: int | None = None


class BlockRemoved(msgspec.Struct, tag="BlockRemoved", frozen=True, gc=False):
    """A worker evicted blocks from ``medium`` (vLLM ``BlockRemoved``)."""

    block_hashes: list[_BlockHash]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", frozen=True, gc=False):
    """A worker dropped its whole prefix cache (vLLM ``AllBlocksCleared``)."""


class _BlockStoredArray(BlockStored, array_like=True):
    pass


class _BlockRemovedArray(BlockRemoved, array_like=True):
    pass


class _AllBlocksClearedArray(AllBlocksCleared, array_like=True):
    pass


class _BatchMap(msgspec.Struct, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class _BatchArray(_BatchMap, array_like=True):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
_PUBLIC_OF_ARRAY = {
    _BlockStoredArray: BlockStored,
    _BlockRemovedArray: BlockRemoved,
    _AllBlocksClearedArray: AllBlocksCleared,
}
_KNOWN_TAGS = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})
_EVENT_MAP = msgspec.msgpack.Decoder(BlockStored | BlockRemoved | AllBlocksCleared)
_EVENT_ARRAY = msgspec.msgpack.Decoder(_BlockStoredArray | _BlockRemovedArray | _AllBlocksClearedArray)
_BATCH_MAP = msgspec.msgpack.Decoder(_BatchMap)
_BATCH_ARRAY = msgspec.msgpack.Decoder(_BatchArray)
_ANY = msgspec.msgpack.Decoder()


class KVEventDecodeError(ValueError):
    """A payload or event that is not a vLLM KV event message."""


def _is_array(first_byte: int) -> bool:  # msgpack fixarray, array16, array32
    return 0x90 <= first_byte <= 0x9F or first_byte in (0xDC, 0xDD)


def _is_map(first_byte: int) -> bool:  # msgpack fixmap, map16, map32
    return 0x80 <= first_byte <= 0x8F or first_byte in (0xDE, 0xDF)


def decode_event(raw: bytes | memoryview | msgspec.Raw) -> KVEvent | None:
    """Decode one msgpack-encoded event (tagged array or map with a ``"type"`` key).

    Returns:
        The event, or ``None`` for a well-formed event of a type not known here.

    Raises:
        KVEventDecodeError: not a valid event.
    """
    view = memoryview(raw)
    if not view:
        raise KVEventDecodeError("empty event")
    decoder = _EVENT_ARRAY if _is_array(view[0]) else _EVENT_MAP if _is_map(view[0]) else None
    if decoder is None:
        raise KVEventDecodeError("event is neither a msgpack array nor a map")
    try:
        event = decoder.decode(view)
    except msgspec.ValidationError as err:
        obj = _ANY.decode(view)
        tag = obj[0] if isinstance(obj, list) and obj else obj.get("type") if isinstance(obj, dict) else None
        if isinstance(tag, str) and tag not in _KNOWN_TAGS:
            return None
        raise KVEventDecodeError(f"invalid event: {err}") from None
    except msgspec.DecodeError as err:
        raise KVEventDecodeError(f"invalid msgpack in event: {err}") from None
    public = _PUBLIC_OF_ARRAY.get(type(event))
    return event if public is None else public(*msgspec.structs.astuple(event))


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """One decoded ``EventBatch``.

    Attributes:
        ts: the engine's wall-clock time of the batch (s since the epoch).
        events: the known events, in order.
        data_parallel_rank: the publishing DP rank, when sent.
        unknown_events: well-formed events of unknown type, skipped.
        malformed_events: one reason per event that could not be decoded, skipped.
    """

    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None
    unknown_events: int = 0
    malformed_events: tuple[str, ...] = ()


def decode_batch(payload: bytes | memoryview) -> DecodedBatch:
    """Decode an ``EventBatch`` payload (array or map); bad events inside are skipped and reported.

    Raises:
        KVEventDecodeError: the payload is not an EventBatch.
    """
    view = memoryview(payload)
    if not view:
        raise KVEventDecodeError("empty payload")
    decoder = _BATCH_ARRAY if _is_array(view[0]) else _BATCH_MAP if _is_map(view[0]) else None
    if decoder is None:
        raise KVEventDecodeError("payload is neither a msgpack array nor a map")
    try:
        batch = decoder.decode(view)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise KVEventDecodeError(f"invalid EventBatch: {err}") from None
    events = []
    unknown = 0
    malformed = []
    for raw in batch.events:
        try:
            event = decode_event(raw)
        except KVEventDecodeError as err:
            malformed.append(str(err))
            continue
        if event is None:
            unknown += 1
        else:
            events.append(event)
    return DecodedBatch(batch.ts, tuple(events), batch.data_parallel_rank, unknown, tuple(malformed))


def _int_hashes(hashes: list[_BlockHash], digest_bytes: int) -> list[int]:
    """The event's hashes as the directory's ints (a digest's low 64 bits, as vLLM's own ints are).

    Raises:
        KVEventDecodeError: a hash the engine's algorithm cannot emit: a negative int (Python's
            ``hash()``, older vLLM releases) or a digest of another size (names it).
    """
    if not hashes:
        return hashes  # type: ignore[return-value]
    if type(hashes[0]) is int and type(hashes[-1]) is int:
        try:
            lowest = min(hashes)  # one C-level pass (the common case: vLLM's ints)
        except TypeError:  # digests among the ints
            return [_int_hash(h, digest_bytes) for h in hashes]
        if lowest < 0:  # above 2^64 − 1 msgpack cannot carry
            raise KVEventDecodeError(f"block hash {lowest} is negative; the configured algorithm emits 0 … 2^64−1")
        return hashes  # type: ignore[return-value]
    return [_int_hash(h, digest_bytes) for h in hashes]


def _int_hash(value: _BlockHash, digest_bytes: int) -> int:
    if type(value) is bytes:
        if len(value) != digest_bytes:
            raise KVEventDecodeError(
                f"block hash of {len(value)} bytes; the configured algorithm's digest has {digest_bytes}"
            )
        return external_hash(value)
    if type(value) is not int or value < 0:
        raise KVEventDecodeError(f"block hash {value!r}: expected 0 … 2^64−1 or a {digest_bytes}-byte digest")
    return value


@dataclass(slots=True)
class IngestStats:
    """Counters of a :class:`KVEventIngestor` (all monotone).

    Attributes:
        messages: messages handed to :meth:`KVEventIngestor.ingest` (counted once processed).
        batches: batches applied, live and replayed.
        events: events applied.
        blocks_stored: block hashes in applied BlockStored events.
        blocks_removed: block hashes in applied BlockRemoved events.
        rejected_messages: messages dropped whole (frame count, sequence frame, payload not an EventBatch).
        rejected_events: events dropped inside a decodable batch (malformed, unknown medium, block size
            other than the namespace's).
        unknown_events: well-formed events of a type not known here, skipped.
        skipped_events: events of another KV cache group (``group_idx``), skipped.
        gaps: sequence gaps seen.
        replay_requests: replays asked of the engine (one per gap when a replay callback is set).
        replayed_batches: batches applied from a replay.
        restarts: sequences that went backwards (engine restarts).
    """

    messages: int = 0
    batches: int = 0
    events: int = 0
    blocks_stored: int = 0
    blocks_removed: int = 0
    rejected_messages: int = 0
    rejected_events: int = 0
    unknown_events: int = 0
    skipped_events: int = 0
    gaps: int = 0
    replay_requests: int = 0
    replayed_batches: int = 0
    restarts: int = 0

    @property
    def rejected(self) -> int:
        """Messages plus events rejected."""
        return self.rejected_messages + self.rejected_events

    @classmethod
    def total(cls, parts: Iterable[IngestStats]) -> IngestStats:
        """Field-wise sum of ``parts`` (a new object)."""
        out = cls()
        for part in parts:
            for name in _STAT_FIELDS:
                setattr(out, name, getattr(out, name) + getattr(part, name))
        return out


_STAT_FIELDS = tuple(f.name for f in dataclasses.fields(IngestStats))

#: Largest forward jump of a sequence number taken as a gap to replay: vLLM's replay buffer
#: (``KVEventsConfig.buffer_steps``) holds 10,000 batches by default, so a longer gap cannot be
#: replayed and a message claiming one is suspect (:meth:`KVEventIngestor.ingest`).
MAX_SEQUENCE_JUMP = 10_000

#: Replay callback: ``(worker_id, from_seq) -> [(seq, payload), ...]``, the batches the
#: engine still buffers from ``from_seq`` on (vLLM's replay ROUTER socket).
ReplayFn = Callable[[int, int], Iterable[tuple[int, bytes]]]


class KVEventIngestor:
    """Applies vLLM KV event messages of many workers to one :class:`CacheDirectory`.

    Args:
        directory: the directory to update.
        namespace_of_worker: the namespace a worker's blocks belong to (model, revision,
            block size, layout); for a BlockStored event of a LoRA request the adapter
            is replaced by the event's ``lora_name`` (or ``str(lora_id)`` for releases
            that send no name). The cache salt cannot be read from events: salted
            blocks land in the worker's namespace (their hashes already differ).
        replay: called on a sequence gap with ``(worker_id, first_missing_seq)``; returns
            the buffered ``(seq, payload)`` batches. ``None``: gaps mark the worker stale.
            It is called before anything of the batch that revealed the gap is applied.
            Public attribute: :class:`~kvcost.serving.engines.kv_subscriber.KVEventSubscriber` sets it
            when given replay endpoints.
        media: vLLM ``medium`` (upper-cased; ``None`` when absent) → tier.
        kv_group: the KV cache group tracked (vLLM ``group_idx``); events of other
            groups (hybrid models) are skipped.
        hash_algorithm: the engines' ``--prefix-caching-hash-algo``: a block hash it cannot
            emit (a negative int, or a digest of another size) rejects its event.

    Example:
        >>> from kvcost.routing.directory import CacheDirectory, Namespace
        >>> d = CacheDirectory()
        >>> ingestor = KVEventIngestor(d, lambda worker_id: Namespace("m", block_size_tokens=16))
        >>> payload = msgspec.msgpack.encode([0.0, [["BlockStored", [7, 8], None, [], 16, None, "GPU"]]])
        >>> ingestor.ingest(3, [b"kv", (0).to_bytes(8, "big"), payload], now_s=1.0)
        True
        >>> d.match(Namespace("m", block_size_tokens=16), [7, 8], [3], now_s=1.0)[0].reusable_blocks
        2

    Counters: :attr:`worker_stats` per worker (created by :meth:`expect_workers` or at a
    worker's first message), :attr:`stats` their sum.

    Thread safety: not thread-safe, like the directory; :class:`~kvcost.serving.engines.kv_subscriber.KVEventSubscriber`
    calls it under its ``lock``. Time is passed in (``now_s``); nothing reads a clock.
    """

    def __init__(
        self,
        directory: CacheDirectory,
        namespace_of_worker: Callable[[int], Namespace],
        replay: ReplayFn | None = None,
        media: Mapping[str | None, str] = DEFAULT_MEDIA,
        kv_group: int = 0,
        hash_algorithm: str = DEFAULT_HASH_ALGORITHM,
    ) -> None:
        self.directory = directory
        self._digest_bytes = DIGEST_BYTES[hash_algorithm]
        self.worker_stats: dict[int, IngestStats] = {}
        self._namespace_of_worker = namespace_of_worker
        self.replay = replay
        self._media = dict(media)
        self._kv_group = kv_group
        self._expected: dict[int, int] = {}
        self._jumps: dict[int, int] = {}  # a rejected implausible sequence per worker, until the next is seen
        self._adapter_ns: dict[tuple[Namespace, str], Namespace] = {}

    @property
    def stats(self) -> IngestStats:
        """Counters summed over every worker (a new object; see :attr:`worker_stats` for each worker's)."""
        return IngestStats.total(self.worker_stats.values())

    def expect_workers(self, worker_ids: Iterable[int]) -> None:
        """Create zeroed counters for ``worker_ids``, so that a configured stream shows (as silent)
        before its first message."""
        for worker_id in worker_ids:
            self._stats_of(worker_id)

    def _stats_of(self, worker_id: int) -> IngestStats:
        stats = self.worker_stats.get(worker_id)
        if stats is None:
            stats = self.worker_stats[worker_id] = IngestStats()
        return stats

    def expected_seq(self, worker_id: int) -> int | None:
        """Next sequence number expected from ``worker_id`` (``None`` before its first message)."""
        return self._expected.get(worker_id)

    def forget_worker(self, worker_id: int) -> None:
        """Stop tracking ``worker_id``'s sequence: its next message is accepted as a first one."""
        self._expected.pop(worker_id, None)
        self._jumps.pop(worker_id, None)

    def ingest(self, worker_id: int, frames: Sequence[bytes], now_s: float) -> bool:
        """Apply one ZMQ message ``[topic, seq, payload]`` from ``worker_id``.

        Sequence handling: ``seq`` = the expected one → applied; larger → a gap, filled
        from the replay callback first (or the worker is marked stale); smaller → the
        engine restarted: the worker's entries are dropped, then the batch is applied.
        A jump forward beyond :data:`MAX_SEQUENCE_JUMP` (more than the engine's replay buffer
        holds) is taken as malformed and rejected, the expected sequence unchanged, unless the
        next message continues from it: then batches were lost for good, the worker is marked
        stale and the stream goes on from there. (One forged ``seq`` of 2^64 − 1 would otherwise
        mark the worker stale and make the next genuine message look like a restart, wiping it.)
        A worker's first message is accepted whatever its ``seq`` (kvcost started after
        the engine: blocks cached before are unknown until stored again). A batch that
        cannot be decoded, or an event that cannot be applied, marks the worker stale.
        Never raises: a malformed message is counted in :attr:`stats` and logged.

        Returns:
            Whether the message's batch was applied.
        """
        stats = self._stats_of(worker_id)
        try:
            if len(frames) != 3:
                return self._reject(worker_id, f"expected 3 frames [topic, seq, payload], got {len(frames)}")
            _, seq_frame, payload = frames
            if len(seq_frame) != 8:
                return self._reject(worker_id, f"sequence frame has {len(seq_frame)} bytes, expected 8")
            seq = int.from_bytes(seq_frame, "big")
            expected = self._expected.get(worker_id)
            if expected is not None and seq < expected:
                logger.warning("worker %s: sequence went back from %d to %d: restart", worker_id, expected, seq)
                stats.restarts += 1
                self.directory.clear_worker(worker_id, now_s)
            elif expected is not None and seq - expected > MAX_SEQUENCE_JUMP:
                confirmed = self._jumps.get(worker_id) == seq - 1
                self._jumps[worker_id] = seq
                if not confirmed:
                    return self._reject(
                        worker_id, f"sequence jumped from {expected} to {seq}, beyond the replay buffer: not applied"
                    )
                stats.gaps += 1
                logger.warning("worker %s: sequence resumed at %d after a lost stretch: marked stale", worker_id, seq)
                self.directory.mark_stale(worker_id)
            elif expected is not None and seq > expected:
                stats.gaps += 1
                self._fill_gap(worker_id, expected, seq, now_s)
            self._jumps.pop(worker_id, None)
            self._expected[worker_id] = seq + 1
            try:
                batch = decode_batch(payload)
            except KVEventDecodeError as err:
                self.directory.mark_stale(worker_id)  # the batch's events are lost
                return self._reject(worker_id, f"seq {seq}: {err}")
            self._apply(worker_id, batch, now_s)
            return True
        except Exception as err:  # a bad message must never stop ingestion
            logger.exception("worker %s: unexpected error while ingesting a message", worker_id)
            self.directory.mark_stale(worker_id)
            return self._reject(worker_id, f"unexpected error: {err!r}")
        finally:
            stats.messages += 1  # counted when done, so a reader that sees it sees the message applied

    def _reject(self, worker_id: int, reason: str) -> bool:
        stats = self._stats_of(worker_id)
        stats.rejected_messages += 1
        _log_rejection(stats.rejected, "worker %s: rejected message: %s", worker_id, reason)
        return False

    def _fill_gap(self, worker_id: int, expected: int, seq: int, now_s: float) -> None:
        """Apply the missing batches ``expected … seq−1`` from a replay; mark the worker stale if any is missing."""
        if self.replay is None:
            logger.warning("worker %s: missed batches %d..%d, no replay: marked stale", worker_id, expected, seq)
            self.directory.mark_stale(worker_id)
            return
        stats = self._stats_of(worker_id)
        stats.replay_requests += 1
        try:
            replayed = {s: payload for s, payload in self.replay(worker_id, expected) if expected <= s < seq}
        except Exception:  # a failed replay degrades to a stale worker
            logger.exception("worker %s: replay from %d failed", worker_id, expected)
            replayed = {}
        complete = True
        for missing in range(expected, seq):
            payload = replayed.get(missing)
            if payload is None:
                complete = False
                continue
            try:
                batch = decode_batch(payload)
            except KVEventDecodeError as err:
                complete = False
                self._reject(worker_id, f"replayed seq {missing}: {err}")
                continue
            self._apply(worker_id, batch, now_s)
            stats.replayed_batches += 1
        if not complete:
            logger.warning("worker %s: replay of %d..%d incomplete: entries marked stale", worker_id, expected, seq)
            self.directory.mark_stale(worker_id)

    def _apply(self, worker_id: int, batch: DecodedBatch, now_s: float) -> None:
        stats = self._stats_of(worker_id)
        directory = self.directory
        base = self._namespace_of_worker(worker_id)
        lost = bool(batch.malformed_events)
        for reason in batch.malformed_events:
            stats.rejected_events += 1
            _log_rejection(stats.rejected, "worker %s: rejected event: %s", worker_id, reason)
        stats.unknown_events += batch.unknown_events
        for event in batch.events:
            try:
                if isinstance(event, BlockStored):
                    if event.group_idx is not None and event.group_idx != self._kv_group:
                        stats.skipped_events += 1
                        continue
                    namespace = self._namespace_for(base, event)
                    reason = self._check_stored(event, namespace)
                    if reason:
                        raise KVEventDecodeError(reason)
                    hashes = _int_hashes(event.block_hashes, self._digest_bytes)
                    parent = event.parent_block_hash
                    parent = _int_hash(parent, self._digest_bytes) if parent is not None else None
                    directory.apply_stored(namespace, worker_id, hashes, parent, self._tier(event.medium), now_s)
                    stats.blocks_stored += len(hashes)
                elif isinstance(event, BlockRemoved):
                    if event.group_idx is not None and event.group_idx != self._kv_group:
                        stats.skipped_events += 1
                        continue
                    tier = self._tier(event.medium)
                    if tier is None:
                        raise KVEventDecodeError(f"unknown medium {event.medium!r}")
                    hashes = _int_hashes(event.block_hashes, self._digest_bytes)
                    directory.apply_removed_everywhere(worker_id, hashes, now_s, tier=tier)
                    stats.blocks_removed += len(hashes)
                else:  # AllBlocksCleared: vLLM's reset_prefix_cache empties the GPU pool only
                    directory.clear_worker(worker_id, now_s, tier="gpu")
                stats.events += 1
            except Exception as err:  # one bad event must not stop the batch
                lost = True
                stats.rejected_events += 1
                _log_rejection(stats.rejected, "worker %s: rejected %s: %s", worker_id, type(event).__name__, err)
        if lost:
            directory.mark_stale(worker_id)
        directory.touch(worker_id, now_s)
        stats.batches += 1

    def _tier(self, medium: str | None) -> str | None:
        return self._media.get(medium.upper() if medium is not None else None)

    def _check_stored(self, event: BlockStored, namespace: Namespace) -> str:
        if self._tier(event.medium) is None:
            return f"unknown medium {event.medium!r}"
        if event.block_size is not None and event.block_size != namespace.block_size_tokens:
            return f"block_size {event.block_size} ≠ namespace block_size_tokens {namespace.block_size_tokens}"
        return ""

    def _namespace_for(self, base: Namespace, event: BlockStored) -> Namespace:
        adapter = event.lora_name if event.lora_name else str(event.lora_id) if event.lora_id is not None else ""
        if not adapter or adapter == base.adapter:
            return base
        key = (base, adapter)
        namespace = self._adapter_ns.get(key)
        if namespace is None:
            namespace = self._adapter_ns[key] = dataclasses.replace(base, adapter=adapter)
        return namespace


def _log_rejection(count: int, message: str, *args: object) -> None:
    """Log the 1st, 2nd, 4th, 8th … rejection as a warning and the others at debug level (no log floods)."""
    level = logging.WARNING if count & (count - 1) == 0 else logging.DEBUG
    logger.log(level, message + " (%d rejected so far)", *args, count)

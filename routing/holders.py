"""How the directory stores a block's holders: packed ints, chains of blocks (runs), tier masks.

The holders of a block are a set of ``(worker, tiers)``. The common case, one
worker holding the block, is packed into a single int
``worker_id << 5 | tier_mask`` (bit ``k`` of the mask set ⇔ the worker holds the
block in the tier whose ``TIER_CODES`` code is ``k``); a block held by several
workers keeps a ``dict[worker_id, tier_mask]``. A chain of blocks one worker
stored in one tier shares one packed holder object, a :class:`_Run`, that also
keeps the chain's hashes (:mod:`kvcost.routing.directory` explains why).

Private to :mod:`kvcost.routing.directory`; not thread-safe.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from kvcost.core.types import TIER_CODES

# Holder encoding (see the module docstring): the low _TIER_BITS bits of a packed
# holder are the tier mask, the rest the worker id.
_TIER_BITS = 5
_MASK = (1 << _TIER_BITS) - 1
_TIER_BIT: dict[str, int] = {name: 1 << code for name, code in TIER_CODES.items() if code > 0}
assert max(TIER_CODES.values()) < _TIER_BITS, "tier codes must fit the packed tier mask"
_TIERS_BY_CODE: tuple[str, ...] = tuple(sorted(_TIER_BIT, key=TIER_CODES.__getitem__))


def _tiers_of_mask(mask: int) -> tuple[str, ...]:
    return tuple(name for name in _TIERS_BY_CODE if mask & _TIER_BIT[name])


#: Fastest tier (lowest code) of each tier mask; ``"none"`` for 0.
_BEST_TIER: tuple[str, ...] = tuple((_tiers_of_mask(m) or ("none",))[0] for m in range(1 << _TIER_BITS))

_Holders = int | dict  # packed single holder (an int or a _Run), or {worker_id: tier_mask}
_NEVER = float("-inf")


def _packable(worker_id: object) -> bool:
    return type(worker_id) is int and worker_id >= 0


class _Run(int):
    """Packed single holder shared by a chain of blocks one worker stored in one tier.

    Its int value is the packed holder. ``hashes`` is the chain, in order: the blocks
    of an ``apply_stored`` call that created them all (at least 2), or a block and the
    new blocks of a call naming it as ``parent_hash``, extended by later calls whose
    ``parent_hash`` is the chain's last block (the next prefill chunk, the blocks
    decode fills). The first ``intact`` hashes still have this object as their value:
    changing one of them lowers ``intact`` (:func:`_detach`). Blocks may have this
    object as value without being among the vouched hashes.
    """

    hashes: list[int]
    intact: int


def _detach(run: _Run, block_hash: int) -> None:
    """``block_hash``, a block of ``run``, is about to get another value: shorten the run's intact prefix."""
    intact = run.intact
    if not intact:
        return
    if run.hashes[intact - 1] == block_hash:  # evictions come tail first
        run.intact = intact - 1
        return
    try:
        run.intact = run.hashes.index(block_hash, 0, intact)
    except ValueError:
        pass


def _run_blocks(run: _Run, request: list[int], i: int) -> int:
    """How many request blocks from ``i`` on (≥ 1; block ``i`` is in ``run``) the run vouches for."""
    intact = run.intact
    if intact < 2:
        return 1
    hashes = run.hashes
    if hashes[0] == request[i]:
        p = 0
    else:
        try:
            p = hashes.index(request[i], 1, intact)
        except ValueError:
            return 1
    k = min(intact - p, len(request) - i)
    if k < 2 or request[i + 1 : i + k] == hashes[p + 1 : p + k]:
        return max(k, 1)
    lo, hi = 1, k - 1  # longest common prefix by bisection: request[i:i+lo] == hashes[p:p+lo]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if request[i + lo : i + mid] == hashes[p + lo : p + mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _mask_of(holders: _Holders, worker_id: int) -> int:
    """Tier mask of ``worker_id`` in a block's holders (0 when it does not hold the block)."""
    if type(holders) is dict:
        return holders.get(worker_id, 0)
    return holders & _MASK if holders >> _TIER_BITS == worker_id else 0


def _clear_mask(tier: str | None) -> int:
    """Tier bits to clear for ``tier`` (every bit for ``None``); ValueError for an unknown name."""
    if tier is None:
        return _MASK
    if tier not in _TIER_BIT:
        raise ValueError(f"tier = {tier!r}, expected one of gpu, cpu, disk, remote")
    return _TIER_BIT[tier]


def _drop(tree: dict[int, _Holders], worker_id: int, block_hashes: Iterable[int], clear_mask: int) -> int:
    """Clear the tier bits ``clear_mask`` of ``worker_id`` on ``block_hashes``; delete blocks nobody holds.

    Returns:
        Blocks ``worker_id`` no longer holds in any tier that it held before (≥ 0).
    """
    get = tree.get
    keep_mask = _MASK & ~clear_mask
    gone = 0
    for block_hash in block_hashes:
        holders = get(block_hash)
        if holders is None:
            continue
        if type(holders) is not dict:
            if holders >> _TIER_BITS != worker_id:
                continue
            if type(holders) is _Run:
                _detach(holders, block_hash)
            mask = holders & keep_mask
            if mask:
                tree[block_hash] = (holders & ~_MASK) | mask
            else:
                del tree[block_hash]
                gone += 1
            continue
        mask = holders.get(worker_id)
        if mask is None:
            continue
        mask &= keep_mask
        if mask:
            holders[worker_id] = mask
            continue
        gone += 1
        del holders[worker_id]
        if len(holders) == 1:
            ((other, other_mask),) = holders.items()
            if _packable(other):
                tree[block_hash] = (other << _TIER_BITS) | other_mask
        elif not holders:
            del tree[block_hash]
    return gone


class _StoreOrder:
    """The blocks one worker came to hold, oldest first, for the directory's cap (one per worker).

    ``held`` is exact: the ``(namespace, block hash)`` pairs the worker holds in any
    tier. The order is kept lazily, 8 bytes per entry: per namespace a deque of
    hashes, and the sequence of namespaces as runs ``[namespace, count]``. An entry
    whose block was removed since stays until :meth:`pop_oldest` or
    :meth:`compact` meets it; :meth:`compact` runs once the entries outnumber
    twice ``held`` plus 1,024, so the order costs at most about three entries
    per held block (amortised O(1) per store).
    """

    __slots__ = ("held", "hashes", "runs", "entries")

    def __init__(self) -> None:
        self.held = 0
        self.entries = 0
        self.hashes: dict[object, deque[int]] = {}
        self.runs: deque[list] = deque()  # [namespace, entries], oldest first

    def add(self, namespace: object, new_hashes: list[int]) -> None:
        """``new_hashes``: blocks of ``namespace`` the worker did not hold before, in store order."""
        queue = self.hashes.get(namespace)
        if queue is None:
            queue = self.hashes[namespace] = deque()
        queue.extend(new_hashes)
        if self.runs and self.runs[-1][0] == namespace:
            self.runs[-1][1] += len(new_hashes)
        else:
            self.runs.append([namespace, len(new_hashes)])
        self.held += len(new_hashes)
        self.entries += len(new_hashes)

    def pop_oldest(self) -> tuple[object, int] | None:
        """The oldest entry ``(namespace, block hash)``, removed from the order; None when there is none."""
        if not self.runs:
            return None
        run = self.runs[0]
        run[1] -= 1
        if not run[1]:
            self.runs.popleft()
        self.entries -= 1
        return run[0], self.hashes[run[0]].popleft()

    def compact(self, trees: dict[object, dict[int, _Holders]], worker_id: int) -> None:
        """Drop the entries of blocks the worker no longer holds, and all but the newest entry of each block."""
        kept: list[tuple[object, int]] = []
        seen: set[tuple[object, int]] = set()
        for namespace, count in reversed(self.runs):
            queue, tree = self.hashes[namespace], trees.get(namespace, {})
            for _ in range(count):
                block_hash = queue.pop()
                key, holders = (namespace, block_hash), tree.get(block_hash)
                if key not in seen and holders is not None and _mask_of(holders, worker_id):
                    seen.add(key)
                    kept.append(key)
        self.hashes, self.runs, self.entries, held = {}, deque(), 0, self.held
        for namespace, block_hash in reversed(kept):
            self.add(namespace, [block_hash])
        self.held = held

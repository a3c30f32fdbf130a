"""Block hashes of token ids, as vLLM's prefix cache computes them (docs/architecture.md §2, §7).

The chaining scheme is vLLM's whatever the hash function; the function is the
engine's ``--prefix-caching-hash-algo`` (vLLM ``vllm/config/cache.py``,
``PrefixCachingHashAlgo``; ``vllm/utils/hashing.py``, ``get_hash_fn_by_name``):

=================  ===============================================  =======
algorithm          digest of the object ``x``                        bytes
=================  ===============================================  =======
``sha256``         ``SHA-256(pickle.dumps(x, HIGHEST_PROTOCOL))``    32
                   (vLLM's default since 0.10.2)
``sha256_cbor``    ``SHA-256(cbor2.dumps(x, canonical=True))``       32
``xxhash``         ``XXH3-128(pickle.dumps(x, HIGHEST_PROTOCOL))``   16
``xxhash_cbor``    ``XXH3-128(cbor2.dumps(x, canonical=True))``      16
=================  ===============================================  =======

The pickle-based two reproduce the engine's hashes only when this process's
CPython pickles like the engine's (protocol 5 on CPython 3.8 – 3.14: the same
bytes for bytes, ints, strings, tuples and None); the CBOR-based two are
portable. The scheme (vLLM ``vllm/v1/core/kv_cache_utils.py``: ``init_none_hash``,
``hash_block_tokens``, ``generate_block_hash_extra_keys``,
``maybe_convert_block_hash``; ``vllm/utils/hashing.py``: ``sha256_cbor``), as in
vLLM since PR #23673 made a block hash the 32-byte digest itself (0.10.2 on), read
in vLLM 0.32.0's installed source and checked against a running vLLM 0.32 engine
(``tests/e2e``):

- ``H`` is the engine's hash function above; for ``sha256_cbor``,
  ``H(x) = SHA-256(cbor2.dumps(x, canonical=True))`` (RFC 8949 CBOR; Python tuples
  and lists are CBOR arrays, ``None`` is ``0xf6``).
- ``NONE_HASH = H(seed)``, where ``seed`` is the *string* value of the
  engine's ``PYTHONHASHSEED`` environment variable. Without ``PYTHONHASHSEED``,
  vLLM 0.32 seeds the two SHA-256 algorithms with the fixed string
  :data:`VLLM_DEFAULT_HASH_SEED` (``"vllm-none-hash"``) and the two xxhash ones from
  ``os.urandom(32)`` (no one outside that engine process can reproduce those);
  earlier releases drew every seed at random.
- block ``i`` (full blocks only; a trailing partial block is never hashed)::

      d_i = H((d_{i-1} or NONE_HASH, tuple(tokens_i), extra_keys_i))

  with ``extra_keys_i = tuple(lora_keys + mm_keys + salt_keys)`` or ``None`` when
  that list is empty (:func:`block_extra_keys`). vLLM 0.32 *tags* each key
  (``key_format="tagged"``): ``("lora", lora_name, lora_path)`` on every block of a
  LoRA request, ``("mm", identifier, offset_in_block)`` for each multimodal item
  overlapping the block, ``("cache_salt", salt)`` on the *first* block only (and
  only when the salt is non-empty); earlier releases used the bare values
  (``key_format="bare"``: ``lora_name``, ``(identifier, offset_in_block)``,
  ``salt``; the form vLLM 0.32 still publishes in its events' ``extra_keys``).
  Prompt-embedding keys (the SHA-256 of each block's embedding tensor bytes) are
  not supported: a router does not hold the tensors.
- KV events publish ``int.from_bytes(d_i, "big") & (2**64 − 1)`` (the low 64 bits)
  by default (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``), or the digest bytes ``d_i``
  when that variable is ``0``. :func:`block_hashes` returns the int form;
  ``kvcost.serving.engines.kv_events`` folds byte hashes to the same int, so one block has
  one name whichever way the engine is configured.

To make the router's hashes equal the engine's, start the engine with
``PYTHONHASHSEED=<seed>`` in its environment and pass ``hash_seed="<seed>"`` (the
same string; or, for a SHA-256 algorithm on vLLM ≥ 0.32 without the variable,
``"vllm-none-hash"``), the engine's ``--prefix-caching-hash-algo`` as ``algorithm`` and
its block size here. Not reproduced: releases 0.10.0 and before (they chained
64-bit ints, ``sha256_cbor_64bit``), and engines whose ``hash_block_size`` differs
from the KV block size (hybrid models; their published hashes are merged).

Example:
    >>> hashes = block_hashes([1, 2, 3, 4, 5], block_size=2, hash_seed="0")
    >>> len(hashes), all(0 <= h < 2**64 for h in hashes)
    (2, True)
"""

from __future__ import annotations

import hashlib
import pickle
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import cbor2

from kvcost.core.types import Namespace

#: Mask of the low 64 bits that vLLM publishes as an int block hash.
HASH_MASK_64 = (1 << 64) - 1
#: vLLM's ``--prefix-caching-hash-algo`` choices (``PrefixCachingHashAlgo`` in ``vllm/config/cache.py``).
HASH_ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
#: vLLM's default ``--prefix-caching-hash-algo`` (``CacheConfig.prefix_caching_hash_algo``, since 0.10.2).
DEFAULT_HASH_ALGORITHM = "sha256"
#: Digest size of each algorithm, bytes (SHA-256: 32; vLLM's xxhash algorithms use XXH3-128: 16).
DIGEST_BYTES = {"sha256": 32, "sha256_cbor": 32, "xxhash": 16, "xxhash_cbor": 16}
#: The seed vLLM 0.32 uses for the SHA-256 algorithms without ``PYTHONHASHSEED`` (``DEFAULT_NONE_HASH_SEED``).
VLLM_DEFAULT_HASH_SEED = "vllm-none-hash"
#: How extra keys enter a block's hash: vLLM 0.32 tags them, earlier releases used bare values.
EXTRA_KEY_FORMATS = ("tagged", "bare")


def sha256_pickle(obj: Any) -> bytes:
    """SHA-256 digest (32 bytes) of ``pickle.dumps(obj, HIGHEST_PROTOCOL)``, as vLLM's ``sha256`` (its default)."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(obj: Any) -> bytes:
    """SHA-256 digest (32 bytes) of the canonical CBOR encoding of ``obj``, as vLLM's ``sha256_cbor``."""
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def hash_function(algorithm: str) -> Callable[[Any], bytes]:
    """The digest function vLLM uses for ``--prefix-caching-hash-algo algorithm`` (see the module table).

    Raises:
        ValueError: ``algorithm`` is not one of :data:`HASH_ALGORITHMS`.
        ImportError: an ``xxhash`` algorithm without the ``xxhash`` package (≥ 3.0, for ``xxh3_128_digest``).
    """
    if algorithm == "sha256":
        return sha256_pickle
    if algorithm == "sha256_cbor":
        return sha256_cbor
    if algorithm not in HASH_ALGORITHMS:
        raise ValueError(f"algorithm = {algorithm!r}, expected one of {', '.join(HASH_ALGORITHMS)}")
    import xxhash  # only these two need it, as in vLLM

    digest = xxhash.xxh3_128_digest
    if algorithm == "xxhash":
        return lambda obj: digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    return lambda obj: digest(cbor2.dumps(obj, canonical=True))


def none_hash(hash_seed: str, algorithm: str = DEFAULT_HASH_ALGORITHM) -> bytes:
    """vLLM's ``NONE_HASH`` (the parent of a prefix's first block) for ``PYTHONHASHSEED=hash_seed``.

    Raises:
        ValueError: unknown ``algorithm``.
    """
    return hash_function(algorithm)(hash_seed)


def external_hash(digest: bytes) -> int:
    """The int a vLLM KV event carries for block digest ``digest``: its low 64 bits, big-endian."""
    return int.from_bytes(digest, "big") & HASH_MASK_64


def block_extra_keys(
    start: int,
    end: int,
    lora: tuple[str, str] | None = None,
    salt: str | None = None,
    mm_items: Sequence[tuple[str, int, int]] = (),
    key_format: str = "tagged",
) -> tuple | None:
    """The extra keys vLLM hashes into the block of prompt tokens ``[start, end)`` (its
    ``generate_block_hash_extra_keys``); None when there are none.

    Args:
        start, end: the block's token range.
        lora: ``(lora_name, lora_path)`` of a LoRA request (the path only enters the tagged form).
        salt: the request's ``cache_salt`` (first block only; ``""`` / None = none).
        mm_items: ``(identifier, offset, length)`` of each multimodal item (its placeholder
            tokens' position in the prompt), in prompt order.
        key_format: ``tagged`` (vLLM 0.32) or ``bare`` (earlier releases).

    Raises:
        ValueError: unknown ``key_format``.
    """
    if key_format not in EXTRA_KEY_FORMATS:
        raise ValueError(f"key_format = {key_format!r}, expected one of {', '.join(EXTRA_KEY_FORMATS)}")
    tagged = key_format == "tagged"
    keys: list[Any] = []
    if lora is not None:
        keys.append(("lora", lora[0], lora[1]) if tagged else lora[0])
    for identifier, offset, length in mm_items:
        if end > offset and start < offset + length:
            keys.append(("mm", identifier, offset - start) if tagged else (identifier, offset - start))
    if start == 0 and salt:
        keys.append(("cache_salt", salt) if tagged else salt)
    return tuple(keys) or None


class PrefixHashCache:
    """Bounded LRU of block digests, keyed by what a digest is a function of.

    A key is ``(parent digest, the block's token ids as native uint32 bytes, extra
    keys)``: the parent digest already carries the hash function, the seed and the
    whole prefix before the block, so one cache can serve every :class:`BlockHasher`
    of a process. Requests that share a prefix (a system prompt, a conversation's
    earlier turns) hash only their new blocks. An entry costs about
    ``150 + 4 × block_size_tokens`` bytes (≈ 2.2 KB for 512-token blocks).

    Args:
        max_blocks: entries kept (≥ 1); the least recently used go first.

    Raises:
        ValueError: ``max_blocks`` < 1.

    Thread safety: not thread-safe; one cache per thread (the service hashes on its event loop).
    """

    def __init__(self, max_blocks: int) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks = {max_blocks}, expected ≥ 1")
        self.max_blocks = max_blocks
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple, bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple) -> bytes | None:
        """The digest stored under ``key`` (now the most recently used), or None."""
        digest = self._entries.get(key)
        if digest is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return digest

    def put(self, key: tuple, digest: bytes) -> None:
        """Store ``digest`` under ``key``, dropping the least recently used entry past ``max_blocks``."""
        self._entries[key] = digest
        if len(self._entries) > self.max_blocks:
            self._entries.popitem(last=False)


class BlockHasher:
    """Hashes prompts for one engine configuration (block size, hash seed, hash algorithm, extra-key format).

    Args:
        block_size_tokens: tokens per KV block (vLLM ``--block-size``), ≥ 1.
        hash_seed: the engine's ``PYTHONHASHSEED`` string.
        algorithm: the engine's ``--prefix-caching-hash-algo``, one of :data:`HASH_ALGORITHMS`.
        cache: digests already computed, shared (None: hash every block). Prompts with a
            token id outside ``[0, 2**32)`` are hashed without it.
        key_format: ``tagged`` (vLLM 0.32) or ``bare`` (earlier releases); see :func:`block_extra_keys`.

    Raises:
        ValueError: ``block_size_tokens`` < 1, an unknown ``algorithm`` or ``key_format``.
    """

    def __init__(
        self,
        block_size_tokens: int,
        hash_seed: str = "0",
        algorithm: str = DEFAULT_HASH_ALGORITHM,
        cache: PrefixHashCache | None = None,
        key_format: str = "tagged",
    ) -> None:
        if block_size_tokens < 1:
            raise ValueError(f"block_size_tokens = {block_size_tokens}, expected ≥ 1")
        if key_format not in EXTRA_KEY_FORMATS:
            raise ValueError(f"key_format = {key_format!r}, expected one of {', '.join(EXTRA_KEY_FORMATS)}")
        self.block_size_tokens = block_size_tokens
        self.hash_seed = hash_seed
        self.algorithm = algorithm
        self.cache = cache
        self.key_format = key_format
        self._hash = hash_function(algorithm)
        self.none_hash = self._hash(hash_seed)

    def digests(
        self,
        token_ids: Sequence[int],
        lora: tuple[str, str] | None = None,
        salt: str | None = None,
        mm_items: Sequence[tuple[str, int, int]] = (),
    ) -> list[bytes]:
        """Digests of the full blocks of ``token_ids``, prompt order (32 bytes each; 16 for the xxhash ones).

        Args:
            token_ids: the prompt's token ids (a sequence of ints or a 1-D integer array).
            lora: ``(lora_name, lora_path)`` of a LoRA request (every block), None otherwise.
            salt: the request's ``cache_salt`` (first block only); ``None`` or ``""`` for none.
            mm_items: ``(identifier, offset, length)`` of the multimodal items, prompt order.

        Returns:
            ``len(token_ids) // block_size_tokens`` digests.
        """
        if hasattr(token_ids, "tolist"):  # numpy arrays: CBOR encodes Python ints only
            token_ids = token_ids.tolist()
        size = self.block_size_tokens
        digest = self._hash
        parent = self.none_hash
        out = []
        cache = self.cache
        packed = b""
        if cache is not None:
            try:
                packed = array("I", token_ids[: len(token_ids) - len(token_ids) % size]).tobytes()
            except (OverflowError, TypeError):  # a token id that is no uint32: hash without the cache
                cache = None
        width = size * array("I").itemsize
        keyed = lora is not None or bool(salt) or bool(mm_items)
        for i, start in enumerate(range(0, len(token_ids) - size + 1, size)):
            keys = block_extra_keys(start, start + size, lora, salt, mm_items, self.key_format) if keyed else None
            if cache is None:
                parent = digest((parent, tuple(token_ids[start : start + size]), keys))
            else:
                key = (parent, packed[i * width : (i + 1) * width], keys)
                found = cache.get(key)
                if found is None:
                    found = digest((parent, tuple(token_ids[start : start + size]), keys))
                    cache.put(key, found)
                parent = found
            out.append(parent)
        return out

    def hashes(
        self,
        token_ids: Sequence[int],
        lora: tuple[str, str] | None = None,
        salt: str | None = None,
        mm_items: Sequence[tuple[str, int, int]] = (),
    ) -> list[int]:
        """The block hashes vLLM's KV events carry (64-bit ints) for ``token_ids``; see :meth:`digests`."""
        return [external_hash(d) for d in self.digests(token_ids, lora, salt, mm_items)]


def block_digests(
    token_ids: Sequence[int],
    block_size: int,
    lora: tuple[str, str] | None = None,
    salt: str | None = None,
    hash_seed: str = "0",
    algorithm: str = DEFAULT_HASH_ALGORITHM,
    key_format: str = "tagged",
) -> list[bytes]:
    """Digests of the full blocks of ``token_ids``; see :meth:`BlockHasher.digests`."""
    return BlockHasher(block_size, hash_seed, algorithm, key_format=key_format).digests(token_ids, lora, salt)


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    lora: tuple[str, str] | None = None,
    salt: str | None = None,
    hash_seed: str = "0",
    algorithm: str = DEFAULT_HASH_ALGORITHM,
    key_format: str = "tagged",
) -> list[int]:
    """Chained block hashes of ``token_ids`` as vLLM's KV events carry them (ints in ``[0, 2**64)``).

    Only full blocks are hashed: the result has ``len(token_ids) // block_size`` entries.
    ``lora`` = ``(lora_name, lora_path)`` goes on every block, ``salt`` (the request's
    ``cache_salt``) on the first block only, ``hash_seed`` is the engine's
    ``PYTHONHASHSEED``, ``algorithm`` its ``--prefix-caching-hash-algo``, ``key_format``
    how its release writes extra keys. See the module docstring for the exact scheme.

    Raises:
        ValueError: ``block_size`` < 1, an unknown ``algorithm`` or ``key_format``.
    """
    return BlockHasher(block_size, hash_seed, algorithm, key_format=key_format).hashes(token_ids, lora, salt)


def block_hashes_for(
    token_ids: Sequence[int],
    block_size_tokens: int,
    namespace: Namespace,
    algorithm: str = DEFAULT_HASH_ALGORITHM,
    hash_seed: str = "0",
    cache: PrefixHashCache | None = None,
    *,
    cache_salt: str | None = None,
    lora_path: str = "",
    key_format: str = "tagged",
) -> tuple[int, ...]:
    """The block hashes a vLLM engine publishes for ``token_ids`` sent in ``namespace``; the service's token hasher.

    vLLM's chaining (the module docstring): the namespace's adapter is the LoRA
    name vLLM puts in every block's extra keys (with ``lora_path`` in the tagged
    form: the engine's ``--lora-modules NAME=PATH``), its cache salt goes in the
    first block's; ``algorithm`` and ``hash_seed`` are the engines'
    ``--prefix-caching-hash-algo`` and ``PYTHONHASHSEED``. Model, revision and KV
    layout are not hashed (vLLM does not): the directory keeps namespaces apart.
    Only full blocks are hashed (a partial last block is not cacheable).

    Args:
        token_ids: prompt token ids, each in ``[0, 2**32)``.
        block_size_tokens: tokens per block (≥ 1).
        namespace: the request's KV namespace.
        algorithm: one of :data:`kvcost.routing.block_hash.HASH_ALGORITHMS`.
        hash_seed: the engines' ``PYTHONHASHSEED`` string.
        cache: digests of blocks already hashed (shared prefixes are hashed once); None = none.
        cache_salt: the request's cache salt when ``namespace`` is the directory's (unsalted) one;
            None = ``namespace.cache_salt``.
        lora_path: the adapter's path as the engine loaded it (tagged keys only).
        key_format: ``tagged`` (vLLM 0.32) or ``bare`` (earlier releases).

    Returns:
        ``len(token_ids) // block_size_tokens`` hashes in prompt order, each in ``[0, 2**64)``.

    Raises:
        ValueError: ``block_size_tokens`` < 1, an unknown ``algorithm`` or ``key_format``.
    """
    lora = (namespace.adapter, lora_path) if namespace.adapter else None
    hasher = BlockHasher(block_size_tokens, hash_seed, algorithm, cache, key_format)
    salt = namespace.cache_salt if cache_salt is None else cache_salt
    return tuple(hasher.hashes(token_ids, lora, salt or None))

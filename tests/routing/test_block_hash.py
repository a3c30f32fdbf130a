"""Tests for kvcost.routing.block_hash: vLLM-compatible block hashes, checked against hand-made CBOR and pickle."""

import hashlib

import numpy as np
import pytest
import xxhash

from kvcost.core.types import Namespace
from kvcost.routing.block_hash import (
    DEFAULT_HASH_ALGORITHM,
    HASH_ALGORITHMS,
    BlockHasher,
    PrefixHashCache,
    block_digests,
    block_extra_keys,
    block_hashes,
    block_hashes_for,
    external_hash,
    hash_function,
    none_hash,
    sha256_cbor,
)

CBOR = "sha256_cbor"

# RFC 8949 heads used below (major type << 5 | additional info):
#   unsigned int: 0x00-0x17 inline, 0x18 + 1 byte, 0x19 + 2 bytes, 0x1a + 4 bytes
#   byte string of 32 bytes: 0x58 0x20; text string of n < 24 bytes: 0x60 + n
#   array of n < 24 items: 0x80 + n; null: 0xf6

BLOCK_0 = [1, 23, 24, 300]  # inline, inline, 1-byte and 2-byte ints
BLOCK_1 = [70000, 0, 255, 65536]  # 4-byte, inline, 1-byte, 4-byte
TOKENS = BLOCK_0 + BLOCK_1 + [9, 9, 9]  # 2 full blocks of 4 and a partial one
BLOCK_0_CBOR = bytes([0x84, 0x01, 0x17, 0x18, 24, 0x19, 0x01, 0x2C])
BLOCK_1_CBOR = bytes([0x84, 0x1A, 0x00, 0x01, 0x11, 0x70, 0x00, 0x18, 0xFF, 0x1A, 0x00, 0x01, 0x00, 0x00])
NULL = b"\xf6"


def text(s: str) -> bytes:
    return bytes([0x60 + len(s)]) + s.encode()


def digest_of(parent: bytes, block_cbor: bytes, extra_cbor: bytes) -> bytes:
    """sha256 of the CBOR array (parent bytes, block token array, extra keys)."""
    return hashlib.sha256(b"\x83" + b"\x58\x20" + parent + block_cbor + extra_cbor).digest()


# NONE_HASH for PYTHONHASHSEED=0: sha256 of the CBOR text string "0"
NONE_HASH_0 = hashlib.sha256(b"\x61\x30").digest()


def test_none_hash_is_sha256_of_the_cbor_seed_string():
    assert none_hash("0", CBOR) == NONE_HASH_0
    assert none_hash("42", CBOR) == hashlib.sha256(b"\x62\x34\x32").digest()
    assert BlockHasher(4, hash_seed="0", algorithm=CBOR).none_hash == NONE_HASH_0


def test_two_blocks_match_hand_computed_digests_and_partial_block_is_not_hashed():
    d0 = digest_of(NONE_HASH_0, BLOCK_0_CBOR, NULL)
    d1 = digest_of(d0, BLOCK_1_CBOR, NULL)
    assert block_digests(TOKENS, 4, hash_seed="0", algorithm=CBOR) == [d0, d1]
    assert block_hashes(TOKENS, 4, hash_seed="0", algorithm=CBOR) == [
        int.from_bytes(d0[-8:], "big"),
        int.from_bytes(d1[-8:], "big"),
    ]


def test_external_hash_is_low_64_bits_big_endian():
    digest = bytes(range(32))
    assert external_hash(digest) == int.from_bytes(bytes(range(24, 32)), "big")
    assert external_hash(b"\xff" * 32) == 2**64 - 1


def test_salt_goes_on_the_first_block_only_tagged_as_vllm_0_32_hashes_it():
    tagged = b"\x81" + b"\x82" + text("cache_salt") + text("s1")  # (("cache_salt", "s1"),)
    d0 = digest_of(NONE_HASH_0, BLOCK_0_CBOR, tagged)
    d1 = digest_of(d0, BLOCK_1_CBOR, NULL)
    assert block_digests(TOKENS, 4, salt="s1", algorithm=CBOR) == [d0, d1]
    bare = digest_of(NONE_HASH_0, BLOCK_0_CBOR, b"\x81" + text("s1"))  # ("s1",): releases before the tags
    assert block_digests(TOKENS, 4, salt="s1", algorithm=CBOR, key_format="bare") == [
        bare,
        digest_of(bare, BLOCK_1_CBOR, NULL),
    ]
    plain = block_hashes(TOKENS, 4)
    salted = block_hashes(TOKENS, 4, salt="s1")
    assert salted[0] != plain[0] and salted[1] != plain[1]  # the chain carries the salt on
    assert block_hashes(TOKENS, 4, salt="") == plain  # an empty salt is no salt, as in vLLM


def test_lora_key_goes_on_every_block_before_the_salt():
    lora = b"\x83" + text("lora") + text("sql-lora") + bytes([0x60 + 12]) + b"/adapters/sq"
    d0 = digest_of(NONE_HASH_0, BLOCK_0_CBOR, b"\x82" + lora + b"\x82" + text("cache_salt") + text("s1"))
    d1 = digest_of(d0, BLOCK_1_CBOR, b"\x81" + lora)
    key = ("sql-lora", "/adapters/sq")
    assert block_digests(TOKENS, 4, lora=key, salt="s1", algorithm=CBOR) == [d0, d1]
    b0 = digest_of(NONE_HASH_0, BLOCK_0_CBOR, b"\x82" + text("sql-lora") + text("s1"))
    b1 = digest_of(b0, BLOCK_1_CBOR, b"\x81" + text("sql-lora"))
    assert block_digests(TOKENS, 4, lora=key, salt="s1", algorithm=CBOR, key_format="bare") == [b0, b1]
    assert block_hashes(TOKENS, 4, lora=key) != block_hashes(TOKENS, 4)
    assert block_hashes(TOKENS, 4, lora=("a", "")) != block_hashes(TOKENS, 4, lora=("b", ""))
    assert block_hashes(TOKENS, 4, lora=("a", "/x")) != block_hashes(TOKENS, 4, lora=("a", "/y"))  # the path counts


def test_multimodal_keys_name_each_item_overlapping_the_block_with_its_offset_in_it():
    items = [("img0", 2, 4), ("img1", 7, 1)]  # tokens 2-5 and 7: block 0 holds img0 from 2, block 1 img0 from -2, img1
    assert block_extra_keys(0, 4, mm_items=items) == (("mm", "img0", 2),)
    assert block_extra_keys(4, 8, lora=("l", "/p"), salt="s", mm_items=items) == (
        ("lora", "l", "/p"), ("mm", "img0", -2), ("mm", "img1", 3),
    )  # fmt: skip
    assert block_extra_keys(8, 12, mm_items=items) is None
    assert block_extra_keys(0, 4, salt="s", mm_items=items, key_format="bare") == (("img0", 2), "s")
    with pytest.raises(ValueError, match="key_format = 'tags'"):
        block_extra_keys(0, 4, key_format="tags")


def test_seed_changes_every_hash():
    a, b = block_hashes(TOKENS, 4, hash_seed="0"), block_hashes(TOKENS, 4, hash_seed="1")
    assert a[0] != b[0] and a[1] != b[1]


def test_hashes_are_chained_prefixes():
    # a prompt that shares the first block but not the second shares exactly one hash
    other = BLOCK_0 + [5, 6, 7, 8]
    assert block_hashes(other, 4)[0] == block_hashes(TOKENS, 4)[0]
    assert block_hashes(other, 4)[1] != block_hashes(TOKENS, 4)[1]
    # the same tokens in block 1 under a different block 0 hash differently
    assert block_hashes([2, 23, 24, 300] + BLOCK_1, 4)[1] != block_hashes(TOKENS, 4)[1]


@pytest.mark.parametrize("n_tokens, expected_blocks", [(0, 0), (3, 0), (4, 1), (7, 1), (8, 2), (11, 2)])
def test_only_full_blocks_are_hashed(n_tokens, expected_blocks):
    hashes = block_hashes(TOKENS[:n_tokens], 4)
    assert len(hashes) == expected_blocks
    assert hashes == block_hashes(TOKENS, 4)[:expected_blocks]


def test_numpy_tokens_hash_like_lists():
    assert block_hashes(np.array(TOKENS, dtype=np.int64), 4) == block_hashes(TOKENS, 4)


def test_sha256_cbor_of_a_tuple_is_an_array():
    assert sha256_cbor((1, None)) == hashlib.sha256(b"\x82\x01\xf6").digest()


# --- vLLM's default, sha256: SHA-256 of pickle protocol 5 (opcodes of CPython's Lib/pickle.py):
#   PROTO 0x80 0x05; FRAME 0x95 + 8-byte little-endian length of what follows up to STOP '.';
#   SHORT_BINBYTES 'C' + 1-byte length; SHORT_BINUNICODE 0x8c + 1-byte length; MEMOIZE 0x94;
#   BININT1 'K' (1 byte), BININT2 'M' (2 bytes LE), BININT 'J' (4 bytes LE); MARK '(' … TUPLE 't';
#   TUPLE1 0x85, TUPLE3 0x87; NONE 'N'.
BLOCK_0_PICKLE = b"(" + b"K\x01" + b"K\x17" + b"K\x18" + b"M\x2c\x01" + b"t\x94"
BLOCK_1_PICKLE = b"(" + b"Jp\x11\x01\x00" + b"K\x00" + b"K\xff" + b"J\x00\x00\x01\x00" + b"t\x94"


def framed(body: bytes) -> bytes:
    """A protocol-5 pickle of one frame holding ``body`` (which ends with STOP)."""
    return b"\x80\x05\x95" + len(body).to_bytes(8, "little") + body


def pickled_block(parent: bytes, block: bytes, extra: bytes) -> bytes:
    """Pickle bytes of the tuple (parent digest, block token tuple, extra keys) vLLM hashes."""
    return framed(b"C" + bytes([len(parent)]) + parent + b"\x94" + block + extra + b"\x87\x94.")


NONE_PICKLE_0 = framed(b"\x8c\x010\x94.")  # pickle of the str "0"


def test_default_algorithm_is_vllms_pickle_sha256():
    assert DEFAULT_HASH_ALGORITHM == "sha256" and HASH_ALGORITHMS == ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
    assert none_hash("0") == hashlib.sha256(NONE_PICKLE_0).digest()


def test_sha256_blocks_match_hand_computed_pickle_digests():
    n0 = hashlib.sha256(NONE_PICKLE_0).digest()
    d0 = hashlib.sha256(pickled_block(n0, BLOCK_0_PICKLE, b"N")).digest()
    d1 = hashlib.sha256(pickled_block(d0, BLOCK_1_PICKLE, b"N")).digest()
    assert block_digests(TOKENS, 4) == [d0, d1]
    assert block_hashes(TOKENS, 4) == [int.from_bytes(d0[-8:], "big"), int.from_bytes(d1[-8:], "big")]
    # bare keys (releases before the tags): LoRA name on every block, salt on the first
    lora, salt = b"\x8c\x08sql-lora\x94", b"\x8c\x02s1\x94"
    e0 = hashlib.sha256(pickled_block(n0, BLOCK_0_PICKLE, lora + salt + b"\x86\x94")).digest()
    e1 = hashlib.sha256(pickled_block(e0, BLOCK_1_PICKLE, lora + b"\x85\x94")).digest()
    assert block_digests(TOKENS, 4, lora=("sql-lora", "/p"), salt="s1", key_format="bare") == [e0, e1]


@pytest.mark.parametrize(
    ("algorithm", "encoded_none", "encoded_block_0", "digest"),
    [
        ("xxhash", NONE_PICKLE_0, lambda n: pickled_block(n, BLOCK_0_PICKLE, b"N"), xxhash.xxh3_128_digest),
        ("xxhash_cbor", b"\x61\x30", lambda n: b"\x83\x50" + n + BLOCK_0_CBOR + NULL, xxhash.xxh3_128_digest),
    ],
)
def test_xxhash_algorithms_hash_16_byte_digests(algorithm, encoded_none, encoded_block_0, digest):
    n0 = digest(encoded_none)
    d0 = digest(encoded_block_0(n0))  # a 16-byte parent is a CBOR byte string of head 0x50
    assert len(n0) == 16 and block_digests(TOKENS[:4], 4, algorithm=algorithm) == [d0]
    assert block_hashes(TOKENS[:4], 4, algorithm=algorithm) == [int.from_bytes(d0[-8:], "big")]


def test_unknown_algorithm_is_refused():
    with pytest.raises(ValueError) as err:
        hash_function("md5")
    assert str(err.value) == "algorithm = 'md5', expected one of sha256, sha256_cbor, xxhash, xxhash_cbor"


def test_block_size_must_be_positive():
    with pytest.raises(ValueError) as err:
        block_hashes(TOKENS, 0)
    assert str(err.value) == "block_size_tokens = 0, expected ≥ 1"


@pytest.mark.parametrize("algorithm", HASH_ALGORITHMS)
def test_cache_gives_the_same_digests_and_hashes_a_shared_prefix_once(algorithm):
    cache = PrefixHashCache(max_blocks=8)
    cached = BlockHasher(4, algorithm=algorithm, cache=cache)
    plain = BlockHasher(4, algorithm=algorithm)
    assert cached.digests(TOKENS, ("lora", "/p"), "s1") == plain.digests(TOKENS, ("lora", "/p"), "s1")
    assert (cache.hits, cache.misses, len(cache)) == (0, 2, 2)
    other = BLOCK_0 + [5, 6, 7, 8]  # shares block 0 with TOKENS
    assert cached.digests(other, ("lora", "/p"), "s1") == plain.digests(other, ("lora", "/p"), "s1")
    assert (cache.hits, cache.misses) == (1, 3)
    assert cached.digests(TOKENS) == plain.digests(TOKENS)  # other extra keys: other entries
    assert (cache.hits, cache.misses) == (1, 5)


def test_cache_drops_the_least_recently_used_and_skips_non_uint32_tokens():
    cache = PrefixHashCache(max_blocks=2)
    hasher = BlockHasher(1, cache=cache)
    hasher.digests([1, 2, 3])  # three blocks of one token: the first is dropped
    assert (len(cache), cache.misses) == (2, 3)
    assert hasher.digests([2**32, 1]) == BlockHasher(1).digests([2**32, 1])  # not cacheable, still hashed
    assert (len(cache), cache.misses) == (2, 3)
    with pytest.raises(ValueError, match="max_blocks = 0, expected ≥ 1"):
        PrefixHashCache(0)


NS = Namespace("m", block_size_tokens=2)


def test_block_hashes_are_vllms_with_the_namespace_extra_keys():
    tokens = [1, 2, 3, 256, 9]  # two full blocks of two; the partial last block [9] is not hashed
    assert block_hashes_for(tokens, 2, NS) == tuple(block_hashes(tokens, 2, hash_seed="0", algorithm="sha256"))
    lora_salted = Namespace("m", adapter="sql-lora", cache_salt="tenant-1")
    assert block_hashes_for(tokens, 2, lora_salted, "sha256_cbor", "7") == tuple(
        block_hashes(tokens, 2, lora=("sql-lora", ""), salt="tenant-1", hash_seed="7", algorithm="sha256_cbor")
    )


def test_block_hashes_chain_prefixes_and_separate_adapters_and_salts():
    tokens = list(range(40))
    full = block_hashes_for(tokens, 8, NS)
    assert len(full) == 5 and all(0 <= h < 2**64 for h in full)
    assert block_hashes_for(tokens[:24], 8, NS) == full[:3]  # a prefix's hashes are a prefix
    assert block_hashes_for([99] + tokens[1:], 8, NS)[1] != full[1]  # chained: block 0 changes block 1
    for other in (Namespace("m", adapter="lora-a"), Namespace("m", cache_salt="tenant-1")):
        assert set(block_hashes_for(tokens, 8, other)).isdisjoint(full)
    assert block_hashes_for(tokens, 8, Namespace("m2")) == full  # vLLM does not hash the model: the directory does
    assert block_hashes_for(tokens, 8, NS, hash_seed="1") != full
    assert block_hashes_for(tokens[:7], 8, NS) == ()
    with pytest.raises(ValueError, match="block_size_tokens = 0"):
        block_hashes_for(tokens, 0, NS)


def test_block_hashes_for_takes_the_salt_beside_an_unsalted_namespace():
    tokens = list(range(40))
    lora = Namespace("m", adapter="sql-lora")
    salted = block_hashes_for(tokens, 8, Namespace("m", adapter="sql-lora", cache_salt="tenant-1"))
    assert block_hashes_for(tokens, 8, lora, cache_salt="tenant-1") == salted
    assert block_hashes_for(tokens, 8, lora, cache_salt="") == block_hashes_for(tokens, 8, lora) != salted

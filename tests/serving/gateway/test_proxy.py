"""Tests for kvcost.serving.gateway.proxy's pure parts (the proxy itself runs against real engines: tests/e2e)."""

import pytest

from kvcost.serving.gateway.proxy import engine_cached_tokens


@pytest.mark.parametrize(
    ("blocks", "input_tokens", "expected"),
    [
        (3, 200, 96),  # a prefix of 3 blocks of a longer prompt: all of it
        (6, 192, 160),  # the whole prompt cached: the last block is computed again (vLLM aligns hits to blocks)
        (6, 193, 192),  # one token past the cached blocks: every cached block counts
        (0, 50, 0),
        (1, 1, 0),
    ],
)
def test_engine_cached_tokens_caps_a_full_hit_as_vllm_does(blocks, input_tokens, expected):
    assert engine_cached_tokens(blocks, 32, input_tokens) == expected

"""Tests for kvcost.features.nominal on the hand-made linear step model (tests/conftest.py).

That model's step costs 1 µs per batch token + 1e-12 s per prefill attention
token pair + 1 µs per decode context token + 1 ms overhead; budget 8192.
"""

import math

import pytest

from kvcost.features.nominal import (
    KvWaitInputs,
    NominalCosts,
    kv_wait_batch_s,
    kv_wait_s,
    kv_wait_sd_batch_s,
    queue_and_prefill_s,
)


def nominal(model, uncached, reusable=0, waiting=(), running=0, decode_ctx=0, remaining_s=0.0):
    return queue_and_prefill_s(model, waiting, running, decode_ctx, remaining_s, uncached, reusable)


def test_idle_worker_single_step(linear_step_model):
    queue_s, prefill_s = nominal(linear_step_model, 1000)
    # 1000 µs + 1 ms + 1000 × 1001 / 2 pairs × 1e-12 s
    assert queue_s == 0.0
    assert prefill_s == pytest.approx(0.0020005005)
    assert prefill_s == pytest.approx(linear_step_model.prefill_alone_s(1000))


def test_reused_prefix_is_attention_context(linear_step_model):
    _, prefill_s = nominal(linear_step_model, 1000, reusable=512)
    # pairs = 1000 × (512 + 1001 / 2) = 1 012 500
    assert prefill_s == pytest.approx(0.002 + 1.0125e-6)


def test_idle_worker_two_chunks_is_sum_of_the_two_steps(linear_step_model):
    m = linear_step_model
    queue_s, prefill_s = nominal(m, 10_000)
    first = m.step_s(8192, m.prefill_attention_flops(8192, 0), 0)
    second = m.step_s(1808, m.prefill_attention_flops(1808, 8192), 0)
    assert queue_s == 0.0
    assert prefill_s == pytest.approx(first + second)
    # (8.192 + 1) ms + (1.808 + 1) ms + 10000 × 10001 / 2 pairs × 1e-12 s
    assert prefill_s == pytest.approx(0.012050005)


def test_step_remaining_is_queue_on_idle_worker(linear_step_model):
    queue_s, prefill_s = nominal(linear_step_model, 1000, remaining_s=0.004)
    assert queue_s == 0.004
    assert prefill_s == pytest.approx(0.0020005005)


def test_full_step_ahead_shifts_queue_exactly(linear_step_model):
    idle_queue_s, idle_prefill_s = nominal(linear_step_model, 100)
    queue_s, prefill_s = nominal(linear_step_model, 100, waiting=((8192, 0),), remaining_s=0.003)
    # 3 ms remaining + one full step (9.192 ms) + its attention (8192 × 8193 / 2 pairs)
    assert queue_s == pytest.approx(0.003 + 0.009192 + 33_558_528e-12)
    # the request's own prefill is the same as on an idle worker: 100 µs + 1 ms + 5050 pairs
    assert prefill_s == pytest.approx(idle_prefill_s)
    assert prefill_s == pytest.approx(0.0011 + 5050e-12)
    assert idle_queue_s == 0.0


def test_work_ahead_sharing_the_first_step(linear_step_model):
    queue_s, prefill_s = nominal(linear_step_model, 100, waiting=((1000, 0),))
    # one step of 1100 tokens; the request waits for no step boundary
    assert queue_s == 0.0
    assert prefill_s == pytest.approx(0.0021 + (500_500 + 5050) * 1e-12)


def test_ahead_attention_split_by_tokens_done_before_first_chunk(linear_step_model):
    waiting = ((6144, 0), (6144, 0))  # 12288 ahead: step 0 is all ahead, step 1 starts with 4096 ahead
    queue_s, prefill_s = nominal(linear_step_model, 4096, waiting=waiting)
    ahead_attention_s = 2 * 6144 * 6145 / 2 * 1e-12
    own_attention_s = 4096 * 4097 / 2 * 1e-12
    assert queue_s == pytest.approx(0.009192 + ahead_attention_s * 8192 / 12288)
    assert queue_s + prefill_s == pytest.approx(2 * 0.009192 + ahead_attention_s + own_attention_s)


def test_decoding_requests_reduce_chunk_capacity(linear_step_model):
    # 2 decoding requests: chunk capacity 8190; 1000 decode context tokens add 1 ms per step
    _, fits_s = nominal(linear_step_model, 8190, running=2, decode_ctx=1000)
    _, spills_s = nominal(linear_step_model, 8191, running=2, decode_ctx=1000)
    _, alone_s = nominal(linear_step_model, 8191)
    assert fits_s == pytest.approx(0.008192 + 0.002 + 8190 * 8191 / 2 * 1e-12)
    # a full step (8192 tokens + 2 ms) and a tail step of 1 prefill + 2 decode tokens (3 µs + 2 ms)
    assert spills_s == pytest.approx(0.010192 + 0.002003 + 8191 * 8192 / 2 * 1e-12)
    assert alone_s == pytest.approx(0.009191 + 8191 * 8192 / 2 * 1e-12)


def test_nominal_costs():
    costs = NominalCosts()
    assert costs.lookup_s(0) == 2e-4
    assert costs.lookup_s(17) == pytest.approx(3.7e-4)
    assert costs.first_token_s == 2e-3
    assert NominalCosts(lookup_base_s=0.0, lookup_per_block_s=1e-3).lookup_s(4) == pytest.approx(4e-3)
    # the mean output falls back to the remaining output (equal for exponential lengths)
    assert (costs.output_tokens_mean, NominalCosts(mean_output_tokens=90.5).output_tokens_mean) == (172, 90.5)


@pytest.mark.parametrize("value", [-1.0, float("nan")])
def test_nominal_costs_refuse_a_negative_mean_output(value):
    with pytest.raises(ValueError, match=f"mean_output_tokens = {value}, expected a number ≥ 0 or None"):
        NominalCosts(mean_output_tokens=value)


# 2 decoders of 256 context tokens (16 blocks of 16 tokens between them); a decode-only step:
# 2 tokens × 1 µs + 1 ms + 256 context × 1 µs
DECODE_STEP_S = 0.001258


@pytest.mark.parametrize(
    ("deficit_blocks", "queued_tokens", "mean_tokens", "held_blocks", "steps"),
    [
        (0, 0, 100, None, 0),  # the request fits now
        # mean 16: a finish frees 8 blocks while the decoders open 16 / 16 = 1 meanwhile: 7 net
        (7, 0, 16, None, 16 / 2),  # one of the 2 decoders must finish: 16 × 1/2 steps
        (8, 0, 16, None, 16 * (1 / 2 + 1)),  # both must finish
        (8, 8190 * 3, 16, None, 16 * (1 / 2 + 1) - 3),  # 3 of those steps are the queue's own chunks
        # more than all: the drain, then 15 − 2 = 13 more finishes (ceil(99 / 7)) at 2 ÷ 16 a step
        (99, 0, 16, None, 16 * (1 / 2 + 1) + 13 * 16 / 2),
        # a shared prefix: 6 physical blocks held, 3 a decoder, 2 net of the 1 opened per finish
        (2, 0, 16, 6, 16 / 2),
        (3, 0, 16, 6, 16 * (1 / 2 + 1)),
        # mean 100: a finish frees 8 blocks while 100 / 16 = 6.25 are opened: 1.75 net
        (1, 0, 100, None, 100 / 2),
        (2, 0, 100, None, 100 * (1 / 2 + 1)),
        (1, 0, 100, 10, 100 * (1 / 2 + 1)),  # 5 freed, 6.25 opened: only the drain frees memory
    ],
)
def test_kv_wait_two_decoders_by_hand(
    linear_step_model, deficit_blocks, queued_tokens, mean_tokens, held_blocks, steps
):  # noqa: E501
    got = kv_wait_s(linear_step_model, deficit_blocks, 2, 256, 16, mean_tokens, queued_tokens, held_blocks)
    assert got == pytest.approx(steps * DECODE_STEP_S, abs=1e-12)


def test_kv_wait_with_nothing_decoding_is_one_mean_decode_lifetime(linear_step_model):
    # a 1-token step: 1 µs + 1 ms
    assert kv_wait_s(linear_step_model, 3, 0, 0, 16, 100, 0) == pytest.approx(100 * 0.001001, abs=1e-12)


def test_kv_wait_with_nothing_decoding_turns_the_held_memory_over(linear_step_model):
    """Nothing decoding, 12 blocks held by requests in prefill, mean output 32 (2 blocks of 16), 2 full
    steps of prefill queued (16,384 tokens): a lifetime frees 12 − 2 = 10 blocks net; each step is one
    decode step over the 192 held tokens, 1 µs + 192 µs + 1 ms."""
    step_s = 0.001193
    # 30 blocks missing: 3 lifetimes, 96 steps, less the 2 of the compute queue
    assert kv_wait_s(linear_step_model, 30, 0, 0, 16, 32, 16384, 12) == pytest.approx(94 * step_s, abs=1e-12)
    # 5 missing: the first lifetime frees them
    assert kv_wait_s(linear_step_model, 5, 0, 0, 16, 32, 16384, 12) == pytest.approx(30 * step_s, abs=1e-12)
    # the held blocks unknown: one lifetime of empty-context steps
    assert kv_wait_s(linear_step_model, 30, 0, 0, 16, 32, 16384) == pytest.approx(30 * 0.001001, abs=1e-12)


def test_kv_wait_beyond_the_batch_reads_the_held_memory(linear_step_model):
    """2 decoders of 256 context tokens; 40 blocks of 16 held (prompts in prefill hold the other 24), mean
    output 16: a finish frees 20 − 1 = 19 blocks net, so 99 missing take ceil(99 / 19) = 6 finishes. The
    drain's 16 × (1/2 + 1) = 24 steps read the batch's 256 tokens; the 4 later finishes' 4 × 16 / 2 = 32
    steps read the 640 held ones (2 µs + 640 µs + 1 ms)."""
    held_step_s = 0.001642
    got = kv_wait_s(linear_step_model, 99, 2, 256, 16, 16, 0, 40)
    assert got == pytest.approx(24 * DECODE_STEP_S + 32 * held_step_s, abs=1e-12)
    # 30 chunks of the compute queue (8,190 tokens each) cover the drain and 6 of the later steps
    queued = kv_wait_s(linear_step_model, 99, 2, 256, 16, 16, 8190 * 30, 40)
    assert queued == pytest.approx(26 * held_step_s, abs=1e-12)
    # the decoders' progress known: the same later steps after the drain's finish
    known = kv_wait_s(linear_step_model, 99, 2, 256, 16, 16, 0, 40, (4, 9), 1.0)
    assert known == pytest.approx(-16 * math.log(0.2) * DECODE_STEP_S + 32 * held_step_s, rel=1e-9)


def test_kv_wait_spread_by_hand(linear_step_model):
    """The by-hand cases' standard deviations: the k-th of 2 exponential finishes of mean 16 has variance
    16² × (1/2²) (k = 1) or 16² × (1/2² + 1) (k = 2); 4 later finishes add 4 × (16 / 2)² over the held
    memory's steps; cv² 0.25 halves the deviation; nothing decoding, 3 lifetimes of 32 steps add 3 × 32²."""
    held_step_s = 0.001642  # 2 µs + 640 µs + 1 ms: the 40 held blocks' 640 tokens

    def spread(*worker, cv2=1.0, mean=16):
        return kv_wait_sd_batch_s([KvWaitInputs(linear_step_model, *worker)], 16, mean, cv2)[0]

    assert spread(0, 2, 256, 0) == 0.0  # no deficit
    assert spread(7, 2, 256, 0) == pytest.approx(16 * 0.5 * DECODE_STEP_S, abs=1e-15)
    assert spread(8, 2, 256, 0) == pytest.approx(16 * math.sqrt(1.25) * DECODE_STEP_S, abs=1e-15)
    assert spread(8, 2, 256, 0, cv2=0.25) == pytest.approx(8 * math.sqrt(1.25) * DECODE_STEP_S, abs=1e-15)
    beyond = 16 * math.sqrt(1.25 * DECODE_STEP_S**2 + 4 * 0.5**2 * held_step_s**2)
    assert spread(99, 2, 256, 0, 40) == pytest.approx(beyond, abs=1e-15)
    # the compute queue is taken as certain: the same spread with 30 chunks queued
    assert spread(99, 2, 256, 8190 * 30, 40) == pytest.approx(beyond, abs=1e-15)
    assert spread(30, 0, 0, 16384, 12, mean=32) == pytest.approx(32 * math.sqrt(3) * 0.001193, abs=1e-15)


def test_kv_wait_is_finite_and_fast_for_any_claimed_batch(linear_step_model):
    # 10⁹ decoders of 62.5 blocks, all of which must finish: 100 × H(10⁹) steps, the harmonic number in
    # its asymptotic form (no billion-term loop); 62.5 blocks freed and 6.25 opened per finish, so a
    # deficit of 56.25 × 10⁹ blocks is exactly the batch
    harmonic = math.log(10**9) + 0.5772156649015329 + 5e-10
    step_s = linear_step_model.step_s(10**9, 0.0, 10**12)
    got = kv_wait_s(linear_step_model, 56.25e9, 10**9, 10**12, 16, 100, 0)
    assert got == pytest.approx(100 * harmonic * step_s, rel=1e-12)


def test_kv_wait_uses_the_progress_only_with_one_count_per_decoder(linear_step_model):
    # the by-hand case (7, 0, 16, None): one of the 2 decoders must finish. Progress known, exponential:
    # 2 (1 − e^(−s / 16)) = 0.8; one count for 2 decoders: unknown, the stationary 16 / 2 steps
    known = kv_wait_s(linear_step_model, 7, 2, 256, 16, 16, 0, None, (4, 9), 1.0)
    assert known == pytest.approx(-16 * math.log(0.6) * DECODE_STEP_S, rel=1e-9)
    partial = kv_wait_s(linear_step_model, 7, 2, 256, 16, 16, 0, None, (4,), 1.0)
    assert partial == pytest.approx(16 / 2 * DECODE_STEP_S, abs=1e-12)
    # (99, 0, 16, None) with progress: both finish (2 (1 − e^(−s / 16)) = 1.6), then 13 more at 2 ÷ 16 a step
    beyond = kv_wait_s(linear_step_model, 99, 2, 256, 16, 16, 0, None, (4, 9), 1.0)
    assert beyond == pytest.approx((-16 * math.log(0.2) + 13 * 16 / 2) * DECODE_STEP_S, rel=1e-9)


def test_kv_wait_grows_with_the_deficit_where_a_mean_output_exceeds_a_decoders_share(linear_step_model):
    """2 decoders, 112 context tokens (7 blocks of 16), mean output 64 with cv² 0.25, progress unknown: a
    decoder's share, 3.5 blocks, is less than the 4 blocks a mean output opens. A running decoder has
    produced 64 × 1.25 ÷ 2 = 40 tokens on average, so a finish frees 3.5 − 40 ÷ 16 = 1 block net (its
    whole output is freed; the 4 blocks the other opens meanwhile are taken from it)."""
    step_s = linear_step_model.step_s(2, 0.0, 112)
    assert kv_wait_s(linear_step_model, 1, 2, 112, 16, 64, 0, None, (), 0.25) == pytest.approx(64 / 2 * step_s)
    # 5 finishes: the drain (64 × (1/2 + 1) steps), then 3 more at 2 ÷ 64 a step
    five = kv_wait_s(linear_step_model, 5, 2, 112, 16, 64, 0, None, (), 0.25)
    assert five == pytest.approx((64 * 1.5 + 3 * 64 / 2) * step_s)
    # exponential lengths: the mean progress is the mean, 3.5 − 4 < 0 net, so one drain whatever the deficit
    # (the snapshot contradicts the law: decoders that hold less than their mean output)
    assert kv_wait_s(linear_step_model, 5, 2, 112, 16, 64, 0, None, (), 1.0) == pytest.approx(64 * 1.5 * step_s)


def test_kv_wait_batch_is_each_worker_alone(linear_step_model):
    # no deficit; nothing decoding; progress unknown; progress known (twice, found together)
    workers = [
        KvWaitInputs(linear_step_model, 0, 2, 256, 0),
        KvWaitInputs(linear_step_model, 3, 0, 0, 0),
        KvWaitInputs(linear_step_model, 7, 2, 256, 0),
        KvWaitInputs(linear_step_model, 7, 2, 256, 0, None, (4, 9)),
        KvWaitInputs(linear_step_model, 8, 2, 256, 8190 * 3, None, (4, 9)),
    ]
    got = kv_wait_batch_s(workers, 16, 16, 0.25)
    assert got.tolist() == pytest.approx([kv_wait_s(*w[:4], 16, 16, *w[4:], 0.25) for w in workers], rel=1e-12)
    assert got[:3].tolist() == [0.0, pytest.approx(16 * 0.001001), pytest.approx(16 / 2 * DECODE_STEP_S)]


@pytest.mark.parametrize("value", [0.0, -1.0, math.inf, math.nan])
def test_output_cv2_out_of_range_is_refused_by_name(value):
    with pytest.raises(ValueError, match=f"output_tokens_cv2 = {value}, expected a finite number > 0"):
        NominalCosts(output_tokens_cv2=value)

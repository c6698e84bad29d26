"""KV cache semantics (searchjax/models/transformer.py, KVCache): prefill + decode through the cache == one full forward without a cache."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.models import init_cache, positions_from_mask

ATOL = 1e-5


@functools.partial(jax.jit, static_argnums=0)
def _jitted_apply(model, params, ids, positions, mask, cache):
    return model.apply({"params": params}, ids, positions, mask, cache)


def _apply(model, params, ids, positions, mask, cache=None):
    # One compile per (model, block length, cache or not): a handful per test.
    return _jitted_apply(model, params, jnp.asarray(ids), jnp.asarray(positions), jnp.asarray(mask), cache)


def _full_forward(model, params, ids, mask):
    logits, _ = _apply(model, params, ids, positions_from_mask(jnp.asarray(mask)), mask)
    return np.asarray(logits)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_prefill_then_decode_equals_full_forward(name, tiny_loaded, padded_batch):
    model, params = tiny_loaded[name]
    ids, mask = padded_batch
    reference = _full_forward(model, params, ids, mask)
    positions = np.asarray(positions_from_mask(jnp.asarray(mask)))
    cache = init_cache(model.config, ids.shape[0], 16, jnp.float32)
    logits, cache = _apply(model, params, ids[:, :8], positions[:, :8], mask[:, :8], cache)
    pieces = [np.asarray(logits)]
    for t in range(8, 12):
        logits, cache = _apply(model, params, ids[:, t:t + 1], positions[:, t:t + 1], mask[:, t:t + 1], cache)
        pieces.append(np.asarray(logits))
    stepwise = np.concatenate(pieces, axis=1)
    assert int(cache.index) == 12
    np.testing.assert_array_equal(np.asarray(cache.mask), np.concatenate([mask, np.zeros((3, 4), bool)], 1))
    np.testing.assert_allclose(stepwise[mask], reference[mask], rtol=0, atol=ATOL)


def test_block_with_masked_slots_in_the_middle(tiny_loaded):
    """Turn 1 (left-padded prompt), turn 2 a block whose pad slots sit between real tokens, then 2 decode steps.

    Reference: each row's real tokens alone, compacted and left-padded, through one no-cache forward.
    """
    model, params = tiny_loaded["tiny-qwen2"]
    rng = np.random.default_rng(1)
    mask1 = np.array([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1]], bool)
    mask2 = np.array([[1, 1, 0, 0, 1], [0, 1, 1, 1, 1], [1, 0, 1, 0, 1]], bool)
    mask3 = np.ones((3, 2), bool)
    blocks = [(rng.integers(3, 256, m.shape).astype(np.int32) * m, m) for m in (mask1, mask2, mask3)]
    all_mask = np.concatenate([m for _, m in blocks], axis=1)
    all_ids = np.concatenate([i for i, _ in blocks], axis=1)
    all_positions = np.asarray(positions_from_mask(jnp.asarray(all_mask)))

    cache = init_cache(model.config, 3, 16, jnp.float32)
    pieces = []
    logits, cache = _apply(model, params, blocks[0][0], all_positions[:, :6], mask1, cache)
    pieces.append(np.asarray(logits))
    logits, cache = _apply(model, params, blocks[1][0], all_positions[:, 6:11], mask2, cache)
    pieces.append(np.asarray(logits))
    for t in (11, 12):
        logits, cache = _apply(model, params, all_ids[:, t:t + 1], all_positions[:, t:t + 1], all_mask[:, t:t + 1],
                               cache)
        pieces.append(np.asarray(logits))
    ours = np.concatenate(pieces, axis=1)[all_mask]  # real tokens, row-major

    lengths = all_mask.sum(1)
    width = lengths.max()
    compact_ids = np.zeros((3, width), np.int32)
    compact_mask = np.zeros((3, width), bool)
    for row in range(3):
        compact_ids[row, width - lengths[row]:] = all_ids[row][all_mask[row]]
        compact_mask[row, width - lengths[row]:] = True
    reference = _full_forward(model, params, compact_ids, compact_mask)[compact_mask]
    np.testing.assert_allclose(ours, reference, rtol=0, atol=ATOL)


def test_left_padding_does_not_change_a_row(tiny_loaded, padded_batch):
    """No cache: the row with 7 pads equals its 5 real tokens run alone (positions from the mask)."""
    model, params = tiny_loaded["tiny-llama"]
    ids, mask = padded_batch
    padded = _full_forward(model, params, ids, mask)[2, 7:]
    alone = _full_forward(model, params, ids[2:, 7:], mask[2:, 7:])[0]
    np.testing.assert_allclose(padded, alone, rtol=0, atol=ATOL)


def test_a_long_block_into_the_cache_attends_in_query_blocks(tiny_loaded, padded_batch, monkeypatch):
    """A block longer than CACHE_QUERY_BLOCK written into a cache runs its queries in blocks (bounded memory for
    long prompts and observations): the logits equal the no-cache forward's, and the kernel's blocked result
    equals its one-block result."""
    from searchjax.models import kernels, transformer
    model, params = tiny_loaded["tiny-llama"]
    ids, mask = padded_batch
    reference = _full_forward(model, params, ids, mask)
    monkeypatch.setattr(transformer, "CACHE_QUERY_BLOCK", 4)  # 12 tokens: 3 blocks of 4
    assert transformer.cache_query_block(12) == 4 and transformer.cache_query_block(10) == 0
    positions = positions_from_mask(jnp.asarray(mask))
    cache = init_cache(model.config, ids.shape[0], 16, jnp.float32)
    # traced afresh (not the module's jitted helper, which may hold a trace made with the real block size)
    logits, cache = model.apply({"params": params}, jnp.asarray(ids), positions, jnp.asarray(mask), cache)
    np.testing.assert_allclose(np.asarray(logits)[mask], reference[mask], rtol=0, atol=ATOL)
    rng = np.random.default_rng(2)
    q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((2, 8, 4, 8), (2, 20, 2, 8), (2, 20, 2, 8)))
    slots = jnp.asarray(rng.random((2, 1, 8, 20)) < 0.7).at[..., 0].set(True)  # every query sees a slot
    one = kernels.grouped_attention(q, k, v, slots, 0.3)
    np.testing.assert_allclose(kernels.grouped_attention(q, k, v, slots, 0.3, query_block=2), one, atol=1e-6)
    with pytest.raises(ValueError, match="query_block=3 must divide the 8 queries"):
        kernels.grouped_attention(q, k, v, slots, 0.3, query_block=3)


def test_cached_query_blocks_bound_the_logits_per_row():
    """The query block of a cached forward keeps each row's float32 logits [heads, block, slots] within
    ROW_LOGITS_BYTES (32 MiB), by hand: SmolLM2's 9 heads over 6,144 slots are 221,184 bytes per query, so 151
    queries fit and a 512-token observation runs in blocks of 128; over 1,024 slots all 512 fit (one block)."""
    from searchjax.models import transformer
    assert transformer.ROW_LOGITS_BYTES == 32 * 2 ** 20
    assert transformer.cache_query_block(512, 9, 6144) == 128
    assert transformer.cache_query_block(512, 9, 1024) == 0
    assert transformer.cache_query_block(1024, 9, 1024) == 512  # CACHE_QUERY_BLOCK still caps the block
    assert transformer.cache_query_block(512, 64, 10 ** 6) == 16  # never below 16 queries
    assert transformer.cache_query_block(48, 64, 10 ** 6) == 16 and transformer.cache_query_block(40, 64, 10 ** 6) == 0


def test_a_long_forward_attends_each_causal_block_in_query_blocks(tiny_loaded, padded_batch, monkeypatch):
    """Past LONG_FORWARD tokens the no-cache forward (the update, the log-prob passes) splits each causal block
    into query blocks: the logits equal the one-block forward's, and the kernel's values and gradients equal
    the unblocked kernel's."""
    from searchjax.models import kernels, transformer
    model, params = tiny_loaded["tiny-llama"]
    ids, mask = padded_batch  # 12 tokens: 3 causal blocks of 4
    reference = _full_forward(model, params, ids, mask)
    monkeypatch.setattr(transformer, "LONG_FORWARD", 8)
    monkeypatch.setattr(transformer, "CACHE_QUERY_BLOCK", 8)  # tried 8, 4, 2 in turn: 2 divides a block of 4
    assert transformer.causal_blocks(12, block=4) == 3 and transformer.causal_query_block(12, 3) == 2
    assert transformer.causal_query_block(8, 2) == 0  # not longer than LONG_FORWARD
    calls = []
    original = kernels.grouped_attention
    monkeypatch.setattr(transformer, "grouped_attention",
                        lambda *a, **kw: calls.append(kw["query_block"]) or original(*a, **kw))
    monkeypatch.setattr(transformer, "causal_blocks", lambda T: 3)
    positions = positions_from_mask(jnp.asarray(mask))
    logits, _ = model.apply({"params": params}, jnp.asarray(ids), positions, jnp.asarray(mask))
    assert calls and set(calls) == {2}
    np.testing.assert_allclose(np.asarray(logits)[mask], reference[mask], rtol=0, atol=ATOL)
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((2, 8, 4, 8), (2, 8, 2, 8), (2, 8, 2, 8)))
    causal = jnp.tril(jnp.ones((8, 8), bool))[None, None].repeat(2, 0)
    weights = jnp.asarray(rng.standard_normal((2, 8, 4, 8)), jnp.float32)

    def loss(q, k, v, **kw):
        return jnp.sum(kernels.grouped_attention(q, k, v, causal, 0.3, **kw) * weights)
    one = jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)
    blocked = jax.value_and_grad(functools.partial(loss, causal_blocks=2, query_block=2), argnums=(0, 1, 2))(q, k, v)
    np.testing.assert_allclose(blocked[0], one[0], rtol=1e-5)
    for got, want in zip(blocked[1], one[1]):
        np.testing.assert_allclose(got, want, atol=1e-5)

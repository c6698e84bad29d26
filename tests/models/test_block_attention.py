"""The block-attention kernel (`native.block_attention`, prefill's and append's attention on one CPU device):
against a float64 numpy softmax written from the masking rule, and against `kernels.grouped_attention` with
`transformer.attention_mask`'s mask, in float32 and in bfloat16 (both the bf16 dot-product form, where the host
has AVX-512 BF16, and the f32-FMA form); the switch (`native.block_attention_model`) and its use by append, whose
result must equal the jnp form's. Greedy parity of whole generations (which now run it) is tests/generation's."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax import decode_steps, generation
from searchjax.models import kernels, native, transformer

# (B, T, N, K, D, S, first): G = 3 (SmolLM2), 1, 7 (Qwen2.5-0.5B) and 2; one token tile and several, a last
# tile of 8 tokens (136 = 2 x 64 + 8); prompts (first = 0) and appends; windows ending mid key block, and one
# whose last key block is 12 slots (196 + 72 = 4 x 64 + 12)
SHAPES = [(2, 16, 9, 3, 64, 64, 20), (3, 136, 4, 4, 32, 512, 300), (2, 24, 14, 2, 64, 128, 0),
          (1, 8, 2, 1, 16, 20, 8), (2, 64, 6, 3, 128, 200, 130), (1, 72, 9, 3, 64, 300, 196)]


def _inputs(B, T, N, K, D, S, first, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((B, T, N, D), (B, S, K, D), (B, S, K, D)))
    seen = np.zeros((B, S), bool)
    seen[:, :first] = rng.random((B, first)) > 0.3  # earlier turns' padding: holes anywhere before the block
    tokens = np.ones((B, T), bool)
    tokens[0, :min(5, T - 1)] = False  # a left-padded block row (padding queries still see their own slot)
    seen[:, first:first + T] = tokens
    return q, k, v, seen, tokens


def _reference(q, k, v, seen, first, scale):
    """softmax over the visible slots in float64: query t sees slot s iff (s < first + t and seen[s]) or
    s == first + t; query head n reads kv head n // G. Returns (out, sum_s p_s |v_s| / sum_s p_s): the second
    bounds what rounding the probabilities by a relative u moves the output by (u times it)."""
    B, T, N, D = q.shape
    S, K = k.shape[1], k.shape[2]
    out, spread = np.zeros(q.shape), np.zeros(q.shape)
    for b in range(B):
        for t in range(T):
            slots = np.arange(S)
            visible = ((slots < first + t) & seen[b]) | (slots == first + t)
            for n in range(N):
                h = n // (N // K)
                logits = scale * k[b, :, h].astype(np.float64) @ q[b, t, n].astype(np.float64)
                p = np.where(visible, np.exp(logits - logits[visible].max()), 0.0)
                out[b, t, n] = p @ v[b, :, h] / p.sum()
                spread[b, t, n] = p @ np.abs(v[b, :, h]) / p.sum()
    return out, spread


@pytest.mark.parametrize("B, T, N, K, D, S, first", SHAPES)
def test_block_attention_equals_the_float64_softmax_and_grouped_attention(B, T, N, K, D, S, first):
    q, k, v, seen, tokens = _inputs(B, T, N, K, D, S, first, seed=T * S)
    assert native.block_attention_fits(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))  # built here: CI runs it
    scale = D ** -0.5
    got = np.asarray(jax.jit(native.block_attention, static_argnums=5)(q, k, v, seen, first, scale))
    np.testing.assert_allclose(got, _reference(q, k, v, seen, first, scale)[0], rtol=0, atol=2e-5)
    mask = transformer.attention_mask(jnp.asarray(tokens), jnp.asarray(seen), first)
    jnp_form = kernels.grouped_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), mask, scale)
    np.testing.assert_allclose(got, np.asarray(jnp_form), rtol=0, atol=2e-5)
    # the mask's last query row is what the model passes as `seen`: the same slots before that query
    np.testing.assert_array_equal(np.asarray(mask[:, 0, -1, :first + T - 1]), seen[:, :first + T - 1])


# the kernel's bf16 forms as (dot_bf16, amx_tiles): AMX's tiles where the CPU has them (`native.amx_tiles`; the
# shapes with D 16 run vdpbf16ps there), vdpbf16ps where it has AVX-512 BF16, the f32-FMA form everywhere
BF16_FORMS = {"tiles": (True, True), "vdpbf16ps": (True, False), "f32_fma": (False, False)}


@pytest.mark.parametrize("form", list(BF16_FORMS))
@pytest.mark.parametrize("B, T, N, K, D, S, first", SHAPES)
def test_bf16_block_attention_is_within_bf16_rounding_of_the_float64_softmax(B, T, N, K, D, S, first, form):
    """A bf16 model's operands (q, k, v bf16 values): the kernel rounds the probabilities to bf16 before P V
    (relative error <= u = 2^-8) and returns bf16 (<= u |out|), both products otherwise exact or f32, so
    |got - exact| <= u (sum p |v| / sum p + |exact|) + f32 terms. A slot missed, a pair misplaced or the two
    halves of a pair swapped moves the output by far more (the forms are checked each against the float64
    softmax; on a host with AMX the flags run all three there). The shapes take the AMX form through its edges:
    windows ending off the 16-slot tiles (20 + 16 slots: a zero-padded last tile of keys, P V's 32-slot step half
    empty), odd numbers of 16-row tiles (3 for 16 tokens of 3 heads), D 32 and 128."""
    q, k, v, seen, tokens = _inputs(B, T, N, K, D, S, first, seed=T * S + 1)
    q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    assert native.block_attention_fits(q, k, v)
    scale = D ** -0.5
    run = jax.jit(native.block_attention, static_argnums=(5, 6, 7))
    got = run(q, k, v, seen, first, scale, *BF16_FORMS[form])
    assert got.dtype == jnp.bfloat16
    exact, spread = _reference(*(np.asarray(x, np.float32) for x in (q, k, v)), seen, first, scale)
    u = 2.0 ** -8
    error = np.abs(np.asarray(got, np.float64) - exact)
    assert np.all(error <= u * (spread + np.abs(exact)) + 1e-5), float((error - u * (spread + np.abs(exact))).max())
    assert error.max() > 0  # bf16 rounding shows: the comparison is not vacuous
    # the jnp form rounds the normalised probabilities instead: both within the bound of the exact softmax
    mask = transformer.attention_mask(jnp.asarray(tokens), jnp.asarray(seen), first)
    jnp_form = np.asarray(kernels.grouped_attention(q, k, v, mask, scale), np.float64)
    assert np.all(np.abs(np.asarray(got, np.float64) - jnp_form) <= 2 * u * (spread + np.abs(exact)) + 2e-5)


def test_block_attention_fits_float32_or_bfloat16_blocks():
    f32, bf16 = jnp.zeros((1, 16, 4, 8)), jnp.zeros((1, 16, 4, 8), jnp.bfloat16)
    cache = jnp.zeros((1, 32, 2, 8))
    assert native.block_attention_fits(f32, cache, cache)
    assert native.block_attention_fits(bf16, cache.astype(jnp.bfloat16), cache.astype(jnp.bfloat16))
    assert not native.block_attention_fits(bf16, cache, cache)  # one dtype for all three
    assert not native.block_attention_fits(f32.astype(jnp.float16), cache.astype(jnp.float16), cache.astype(jnp.float16))
    assert not native.block_attention_fits(jnp.zeros((1, 12, 4, 8)), cache, cache)  # T not a multiple of 8


def test_append_runs_the_kernel_on_one_cpu_device_and_equals_the_jnp_form(monkeypatch):
    config = transformer.ModelConfig(architecture="llama", vocab_size=64, hidden_size=32, intermediate_size=64,
                                     num_layers=2, num_heads=6, num_kv_heads=2, head_dim=16)
    model = transformer.Transformer(config)
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    assert native.block_attention_model(model).config.attention_impl == "native"
    assert native.block_attention_model(None) is None

    def run(native_on: bool):
        monkeypatch.setenv("SEARCHJAX_NATIVE", "1" if native_on else "0")
        native._target.cache_clear()
        jax.clear_caches()
        session = generation.start(model, params, [[1, 2, 3], [4, 5, 6, 7, 8]], max_cache_len=64, seed=0)
        session, _ = generation.decode(session, 3)
        session = generation.append(session, [[9, 10, 11, 12, 13, 14, 15, 16, 17], [18, 19]])
        return session

    with_kernel, without = run(True), run(False)
    np.testing.assert_allclose(np.asarray(with_kernel.state.next_logits), np.asarray(without.state.next_logits),
                               rtol=0, atol=1e-4)
    np.testing.assert_allclose(np.asarray(with_kernel.state.cache.k), np.asarray(without.state.cache.k), atol=1e-5)
    assert generation.sequences(with_kernel) == generation.sequences(without)
    monkeypatch.setenv("SEARCHJAX_NATIVE", "1")
    native._target.cache_clear()
    state = with_kernel.state
    hlo = decode_steps.append_block.lower(params, state, jnp.zeros((2, 16), jnp.int32), jnp.full((2,), 16),
                                          model=model, logits_fn=None, mesh=None, rules=None).as_text()
    assert native.BLOCK_ATTENTION_TARGET in hlo
    assert os.environ["SEARCHJAX_NATIVE"] == "1"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_scoring_runs_the_kernel_on_one_cpu_device_and_equals_the_jnp_form(monkeypatch, dtype):
    """token_logprobs (forward only) attends through the kernel without a cache: the block is its own window from
    slot 0; left-padded rows and a short row's filler positions as in the model's own causal mask."""
    from searchjax import scoring
    config = transformer.ModelConfig(architecture="llama", vocab_size=64, hidden_size=32, intermediate_size=64,
                                     num_layers=2, num_heads=6, num_kv_heads=2, head_dim=16, dtype=dtype)
    model = transformer.Transformer(config)
    params = jax.tree.map(lambda p: p * 4, transformer.init_params(config, jax.random.PRNGKey(1)))  # peaked softmax
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 64, (3, 40)).astype(np.int32)
    mask = np.ones_like(ids, bool)
    mask[1, :11], mask[2, :33] = False, False

    def run(native_on: bool):
        monkeypatch.setenv("SEARCHJAX_NATIVE", "1" if native_on else "0")
        native._target.cache_clear()
        jax.clear_caches()
        return np.asarray(scoring.token_logprobs(model, params, ids, mask))

    with_kernel, without = run(True), run(False)
    assert np.abs(without).max() > 1.0  # not a uniform softmax
    tol = 2e-5 if dtype == "float32" else 0.1  # bf16: the kernel rounds P before its normalisation
    np.testing.assert_allclose(with_kernel, without, rtol=0, atol=tol)
    monkeypatch.setenv("SEARCHJAX_NATIVE", "1")
    native._target.cache_clear()
    jax.clear_caches()  # the jnp form's trace is cached under the same static model
    ids64, mask64 = (jnp.zeros((4, 64), jnp.int32), jnp.ones((4, 64), bool))
    hlo = scoring._jitted_tail_logprobs(None).lower(native.block_attention_model(model), params, ids64, mask64,
                                                    jnp.float32(1.0), tail=63, vocab_chunk=None).as_text()
    assert native.BLOCK_ATTENTION_TARGET in hlo

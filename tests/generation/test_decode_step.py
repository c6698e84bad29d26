"""The decode step (`cpu_decode.decode_forward`: window read in place, token merged by log-sum-exp, one slot
written) against the model's full forward with a cache (`Transformer.__call__`, which writes the token into
each layer's cache and softmaxes over all of it), on tiny random models with a partly filled window; and the
compiled decode loop against copies of the window or the weights in its body.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax import cpu_decode, decode_steps, sampling
from searchjax.models import KVCache, init_cache, native, transformer
from searchjax.models.decode_attention import (KEY_PAIRS, block_values, from_key_window, from_window, pairs_values,
                                               to_key_window, to_window, unblock_values, value_block)

# every architecture switch: GQA with q/k norms (Qwen3), q/k/v biases (Qwen2), tied embeddings (Llama), MHA
CONFIGS = {
    "qwen3": dict(architecture="qwen3", num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True),
    "qwen2": dict(architecture="qwen2", num_heads=6, num_kv_heads=2, head_dim=8, qkv_bias=True),
    # head_dim 32: value blocks of 16 columns, a bf16 window's values in slot pairs where the kernels pair
    "llama_tied": dict(architecture="llama", num_heads=6, num_kv_heads=3, head_dim=32, tie_embeddings=True),
    "mha_unscanned": dict(architecture="llama", num_heads=4, num_kv_heads=4, head_dim=16, scan_layers=False),
}
S, W, FILLED = 48, 32, 21  # cache slots, decode window, slots written before the step


def _model(name, dtype):
    config = transformer.ModelConfig(vocab_size=128, hidden_size=48, intermediate_size=96, num_layers=3,
                                     rms_norm_eps=1e-5, dtype=dtype, param_dtype="float32", **CONFIGS[name])
    # large random weights (norm scales 1 + N(0, 0.3^2), matrices N(0, 0.3^2)): logits spread over several units.
    # Drawn by numpy into the model's parameter shapes (no program compiled per shape, as jax.random's would be).
    leaves, tree = jax.tree.flatten_with_path(transformer.abstract_params(config))
    rng = np.random.default_rng(4)
    leaves = [jnp.asarray(("norm" in jax.tree_util.keystr(path)) + 0.3 * rng.standard_normal(w.shape), w.dtype)
              for path, w in leaves]
    return transformer.Transformer(config), jax.tree.unflatten(tree, leaves)


def _filled_cache(model, params):
    """A cache of S slots with FILLED written by two prefill blocks; row 1 left-padded (its first 5 slots empty),
    row 2 stopped at the last block (its last 4 slots masked)."""
    rng = np.random.default_rng(0)
    cache = init_cache(model.config, 3, S)
    mask = np.ones((3, FILLED), bool)
    mask[1, :5] = False
    mask[2, -4:] = False
    ids = jnp.asarray(rng.integers(0, 128, size=(3, FILLED)), jnp.int32)
    positions = transformer.positions_from_mask(jnp.asarray(mask))

    @jax.jit  # one program for both blocks (op by op, each block's layer scan compiled on its own)
    def prefill(params, cache):
        for block in (slice(0, 13), slice(13, FILLED)):
            _, cache = model.apply({"params": params}, ids[:, block], positions[:, block],
                                   jnp.asarray(mask[:, block]), cache=cache)
        return cache
    return prefill(params, cache), jnp.asarray(mask.sum(axis=1), jnp.int32)


TOKEN, RUNNING = jnp.asarray([5, 77, 100], jnp.int32), jnp.asarray([True, True, False])


@functools.cache
def _case(name, dtype):
    """(model, params, filled cache, lengths, the full forward's logits and cache for the step's token), made
    once per architecture and dtype: the three step forms are compared against the same reference."""
    model, params = _model(name, dtype)
    cache, lengths = _filled_cache(model, params)
    reference, ref_cache = jax.jit(lambda p, c: model.apply({"params": p}, TOKEN[:, None], lengths[:, None],
                                                            RUNNING[:, None], cache=c))(params, cache)
    return model, params, cache, lengths, reference, ref_cache


# the CPU's step as decode_loop runs it for a few rows (windows as `window_layout` makes them: the cache's values,
# a bf16 cache's as their bits, for the native kernels for attention and, with packed weights, the products),
# the same with float32 windows, the same without the kernels (the jnp forms, on float32 windows as decode_loop
# gives them), and the accelerators' (per_layer_decode)
@pytest.mark.parametrize("form", ["per_layer", "per_layer_f32_windows", "per_layer_jnp", "stacked"])
@pytest.mark.parametrize("dtype, tolerance", [("float32", 2e-5), ("bfloat16", 0.05)])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_decode_step_equals_full_forward_with_cache(name, dtype, tolerance, form):
    """Logits and the written slot equal the full forward's; every other slot is untouched (bitwise).
    Tolerance: max |difference| / max |logit|: float32 2e-5 (summation order only); bfloat16 5e-2 (the two
    forms round the same quantities at different points, e.g. the merged softmax's sum before the cast)."""
    model, params, cache, lengths, reference, ref_cache = _case(name, dtype)
    token, running = TOKEN, RUNNING
    kernels = form != "per_layer_jnp"
    window_dtype, values = cpu_decode.window_layout(model.config, None, cache.k.dtype)
    if form == "per_layer":  # the kernels are what runs here, not a fallback, on the bf16 cache's bits
        assert cpu_decode.packed_decode(model.config, len(TOKEN), None) and values is not None
        assert window_dtype == (cpu_decode.WINDOW_BITS if dtype == "bfloat16" else None)
        split = cpu_decode.split_cache(cache, W, window_dtype, values)  # paired for vdpbf16ps where it is
        paired = dtype == "bfloat16" and native.bf16_pairs()
        assert split.k[0].dtype == (KEY_PAIRS if paired else cache.k.dtype if dtype == "float32"
                                    else cpu_decode.WINDOW_BITS)
        assert split.v[0].ndim == (6 if paired and model.config.head_dim % 32 == 0 else 5)  # values in slot pairs
    elif form != "stacked":
        window_dtype = cpu_decode.CPU_WINDOW_DTYPE
        values = values if kernels else None  # the kernel's layout, or the jnp form's

    @jax.jit
    def step(params, cache):
        if form == "stacked":
            logits, part = decode_steps.decode_forward_stacked(params, model, token, lengths, running,
                                                               decode_steps.window_cache(cache, W))
            return logits, decode_steps.unwindow_cache(cache, part)
        config = model.config
        weights = cpu_decode.layer_weights(params, config, pack=kernels)
        head = cpu_decode.packed_lm_head(params, config) if kernels else None
        logits, part = cpu_decode.decode_forward(params, weights, model, token, lengths, running,
                                                 cpu_decode.split_cache(cache, W, window_dtype, values),
                                                 native_attention=kernels, packed_head=head)
        return logits, cpu_decode.merge_cache(cache, part, cache.index)

    logits, new_cache = step(params, cache)
    reference = np.asarray(reference[:, 0], np.float32)
    scale = np.abs(reference).max()
    assert scale > 1.0  # spread logits: the tolerance below is not vacuous
    assert np.abs(np.asarray(logits) - reference).max() <= tolerance * scale
    np.testing.assert_array_equal(new_cache.mask, ref_cache.mask)
    assert int(new_cache.index) == int(ref_cache.index) == FILLED + 1
    for got, want, old in ((new_cache.k, ref_cache.k, cache.k), (new_cache.v, ref_cache.v, cache.v)):
        got, want, old = (np.asarray(a, np.float32) for a in (got, want, old))
        others = np.arange(S) != FILLED
        np.testing.assert_array_equal(got[:, :, others], old[:, :, others])
        written = np.abs(want[:, :, FILLED]).max()
        assert np.abs(got[:, :, FILLED] - want[:, :, FILLED]).max() <= tolerance * written


@pytest.mark.parametrize("written_from, written_to, block", [
    (21, 22, 4),   # one slot (a decode step): one block
    (3, 30, 4),    # several blocks; the last (27-31) reaches past 30 but not past the window
    (21, 32, 4),   # to the window's end: the third block (29-33) is clamped to 28-32
    (0, 32, 32),   # the whole window in one block
    (10, 10, 4),   # a launch that ran no step writes nothing
    (5, 27, 64),   # block wider than the window: one block of the whole window
])
@pytest.mark.parametrize("window_dtype, value_block", [(jnp.float32, None), (None, None), (jnp.float32, 2),
                                                       (cpu_decode.WINDOW_BITS, 2), (cpu_decode.WINDOW_BITS, 16)])
def test_merge_cache_writes_back_the_written_slots_only(written_from, written_to, block, window_dtype, value_block):
    """merge_cache(full, split_cache(full) with slots [written_from, written_to) changed, written_from) equals
    the stacked cache with exactly those slots (and the window's mask) replaced, bitwise, for blocks that
    cover the range several times over, reach past the window (clamped) or exceed it; values in slot pairs
    (bits in blocks of 16 where the host pairs) from odd slots too, and keys in blocks of 16 slots (`KEY_PAIRS`)
    from slots and in blocks off theirs."""
    rng = np.random.default_rng(7)
    L, B, K, D = 2, 3, 2, max(4, value_block or 0)
    full = KVCache(k=jnp.asarray(rng.normal(size=(L, B, S, K, D)), jnp.bfloat16),
                   v=jnp.asarray(rng.normal(size=(L, B, S, K, D)), jnp.bfloat16),
                   mask=jnp.asarray(rng.random((B, S)) < 0.5), index=jnp.int32(written_from))
    part = cpu_decode.split_cache(full, W, window_dtype, value_block)  # bits: keys paired where the host pairs
    assert part.k[0].dtype == (KEY_PAIRS if window_dtype == cpu_decode.WINDOW_BITS and native.bf16_pairs()
                               else window_dtype or full.k.dtype)
    pairs = pairs_values(part.k[0].dtype, value_block)
    assert pairs == (value_block == 16 and native.bf16_pairs())
    if value_block:  # the kernel's value layout, [B, K, D / CB, W, CB], or [B, K, D / CB, W / 2, CB, 2] in pairs
        assert part.v[0].shape == ((B, K, D // value_block, W // 2, value_block, 2) if pairs
                                   else (B, K, D // value_block, W, value_block))
        np.testing.assert_array_equal(np.asarray(from_window(unblock_values(part.v[1]), jnp.float32)),
                                      np.asarray(full.v[1, :, :W].transpose(0, 2, 1, 3), np.float32))
        part = part.replace(v=tuple(unblock_values(layer) for layer in part.v))
    new_k = rng.normal(size=(L, B, W, K, D)).astype(np.float32)  # what the steps wrote, layer by layer
    new_v = rng.normal(size=(L, B, W, K, D)).astype(np.float32)
    new_mask = rng.random((B, W)) < 0.5
    slots = slice(written_from, written_to)
    stored = lambda x, dtype: to_window(jnp.asarray(x, jnp.bfloat16), dtype)  # noqa: E731  a bf16 cache's values

    def written_keys(layer, i):  # the window's keys [B, K, D, W] with the slots replaced, in the window's form
        keys = np.asarray(from_key_window(layer, jnp.float32)).copy()
        keys[..., slots] = new_k[i, :, slots].transpose(0, 2, 3, 1)
        return to_key_window(jnp.asarray(keys, jnp.bfloat16), layer.dtype)

    part = KVCache(
        k=tuple(written_keys(layer, i) for i, layer in enumerate(part.k)),
        v=tuple(layer.at[:, :, slots].set(stored(new_v[i, :, slots].transpose(0, 2, 1, 3), layer.dtype))
                for i, layer in enumerate(part.v)),
        mask=jnp.asarray(new_mask), index=jnp.int32(written_to))
    if value_block:
        part = part.replace(v=tuple(block_values(layer, value_block, pairs) for layer in part.v))
    expected_k, expected_v = np.asarray(full.k, np.float32).copy(), np.asarray(full.v, np.float32).copy()
    expected_k[:, :, slots] = np.asarray(jnp.asarray(new_k[:, :, slots], jnp.bfloat16), np.float32)
    expected_v[:, :, slots] = np.asarray(jnp.asarray(new_v[:, :, slots], jnp.bfloat16), np.float32)
    expected_mask = np.asarray(full.mask).copy()
    expected_mask[:, :W] = new_mask

    merged = jax.jit(cpu_decode.merge_cache, static_argnames="block")(full, part, jnp.int32(written_from),
                                                                       block=block)
    np.testing.assert_array_equal(np.asarray(merged.k, np.float32), expected_k)
    np.testing.assert_array_equal(np.asarray(merged.v, np.float32), expected_v)
    np.testing.assert_array_equal(merged.mask, expected_mask)
    assert int(merged.index) == written_to


def _computation(hlo: str, name: str) -> str:
    found = re.search(r"^%" + re.escape(name) + r" [^\n]*\{\n(.*?)^\}", hlo, re.S | re.M)
    assert found, name
    return found.group(1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_loop_body_copies_no_window_and_no_weight(dtype):
    """Optimized HLO of the decode loop: inside the while body nothing is made with the shape of a layer's
    window or of a weight except by the in-place slot writes (dynamic-update-slice fusions); in particular no
    copy, slice or dynamic-slice of them. Fails on the former step, which sliced layer caches and weights out
    of the stacked arrays inside its layer scan. At 2 rows the step runs the CPU kernels (`native`): each
    layer's attention is one call, fed the windows in place, and its 7 products (4 calls: q/k/v side by side, o,
    gate/up side by side, down) and the LM head are calls of the skinny matmul on weights packed once per
    launch, which are not copied either. A bf16 model's windows hold
    the cache's bits (`cpu_decode.window_layout`): as bf16 windows, the bit casts around each slot write copied
    them (this test then fails)."""
    model, params = _model("llama_tied", dtype)  # float32 weights: with bfloat16 compute, no per-step casts either
    config = model.config
    batch = 2
    state = decode_steps.prefill(params, jnp.ones((batch, 8), jnp.int32), jnp.ones((batch, 8), bool),
                                 jnp.zeros((batch, S), jnp.int32), jnp.full((batch,), 8, jnp.int32),
                                 jnp.zeros((batch,), bool), jax.vmap(jax.random.key)(jnp.arange(batch)),
                                 model=model, logits_fn=None, cache_len=S, mesh=None, rules=None)
    hlo = decode_steps.decode_loop.lower(
        params, state, np.int32(4), np.int32(4), np.bool_(True), np.float32(1.0), np.float32(1.0), np.zeros((1, config.vocab_size), np.int32),
        np.int32(-1), model=model, logits_fn=None, mode=sampling.sampling_mode(0.0, 1.0, 0), eos_token_ids=(),
        window=W, mesh=None, rules=None).compile().as_text()
    body = _computation(hlo, re.search(r"body=%([\w.\-]+)", hlo).group(1))
    K, D, block = config.num_kv_heads, config.head_dim, value_block(config.head_dim)
    shapes = {(batch, K, W, D), (batch, K, D, W), (batch, K, D // 2, W), (batch, K, D // block, W, block),
              (batch, K, D // block, W // 2, block, 2)}  # windows
    shapes |= {tuple(w.shape[1:]) for w in jax.tree.leaves(params["layers"]) if w.ndim > 2}
    shapes |= {tuple(params["embed"]["embedding"].shape)}
    packed = jax.eval_shape(lambda p: (cpu_decode.layer_weights(p, config, pack=True),
                                       cpu_decode.packed_lm_head(p, config)), params)
    shapes |= {tuple(w.shape) for w in jax.tree.leaves(packed) if w.ndim == 3}
    offenders = []
    for line in body.splitlines():
        match = re.match(r"\s*(ROOT )?%(\S+) = (?:f32|bf16|u16|u32)\[([\d,]*)\]\{[^}]*\} (\S+)\(", line)
        if not match:
            continue
        name, dims, op = match.group(2), tuple(int(d) for d in match.group(3).split(",") if d), match.group(4)
        # an in-place write is a fusion named for its dynamic-update-slice; one that also converts (a bit cast
        # around a bf16 write) computes the whole window anew
        if dims in shapes and op not in ("get-tuple-element", "parameter", "bitcast") and not (
                op == "fusion" and "dynamic-update-slice" in name and "convert" not in name):
            offenders.append(line.strip()[:160])
    assert not offenders, "\n".join(offenders)
    assert body.count("dynamic-update-slice") >= 2 * config.num_layers  # the slot writes are there (in place)
    # and the kernels' calls are there, reading the windows and the packed weights in place too
    assert body.count(f'custom_call_target="{native.DECODE_ATTENTION_TARGET}"') == config.num_layers
    assert body.count(f'custom_call_target="{native.SKINNY_MATMUL_TARGET}"') == 4 * config.num_layers + 1


def test_per_layer_decode_is_for_cpu_targets_only():
    """The mesh's devices decide (a TPU program compiled on a CPU host takes the stacked form), else the backend."""
    from types import SimpleNamespace
    assert cpu_decode.per_layer_decode(None) == (jax.default_backend() == "cpu")
    for platform, expected in (("cpu", True), ("tpu", False), ("gpu", False)):
        mesh = SimpleNamespace(devices=np.array([SimpleNamespace(platform=platform)] * 2))
        assert cpu_decode.per_layer_decode(mesh) is expected

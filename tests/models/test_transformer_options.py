"""Config switches that must not change the math (remat, unrolled scan), parameter metadata, and config checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.models import (ModelConfig, Transformer, abstract_params, init_cache, lm_head_weight,
                              param_logical_axes, positions_from_mask)
from searchjax.models.presets import get_preset


def _loss_and_grads(model, params, ids, mask):
    def loss(p):
        logits, _ = model.apply({"params": p}, ids, positions_from_mask(mask), mask)
        logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        picked = jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
        return -(picked * mask[:, 1:]).sum()
    return jax.jit(jax.value_and_grad(loss))(params)


def test_remat_policies_give_same_loss_and_grads(tiny_loaded, padded_batch):
    model, params = tiny_loaded["tiny-qwen3"]
    ids, mask = (jnp.asarray(x) for x in padded_batch)
    reference_loss, reference_grads = _loss_and_grads(model, params, ids, mask)
    for policy in ("full", "dots_saveable"):
        loss, grads = _loss_and_grads(Transformer(model.config.replace(remat_policy=policy)), params, ids, mask)
        np.testing.assert_allclose(loss, reference_loss, rtol=1e-5, err_msg=policy)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=policy),
                     grads, reference_grads)


def test_unrolled_layers_give_same_logits(tiny_loaded, padded_batch):
    """scan_layers=False unrolls the layer loop over the same stacked parameters."""
    model, params = tiny_loaded["tiny-llama"]
    ids, mask = (jnp.asarray(x) for x in padded_batch)
    run = lambda m: np.asarray(jax.jit(m.apply)({"params": params}, ids, positions_from_mask(mask), mask)[0])
    np.testing.assert_allclose(run(Transformer(model.config.replace(scan_layers=False))), run(model),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-qwen2"])
def test_param_logical_axes_cover_every_parameter(name):
    config = get_preset(name)
    axes, shapes = param_logical_axes(config), abstract_params(config)
    is_axes = lambda x: isinstance(x, tuple)
    assert jax.tree.structure(axes, is_leaf=is_axes) == jax.tree.structure(shapes)
    allowed = {"layers", "vocab", "embed", "mlp", "q_heads", "kv_heads", "head_dim"}
    for names, shape in zip(jax.tree.leaves(axes, is_leaf=is_axes), jax.tree.leaves(shapes)):
        assert len(names) == len(shape.shape) and set(names) <= allowed
    assert axes["layers"]["attn"]["q_proj"]["kernel"] == ("layers", "embed", "q_heads", "head_dim")
    assert axes["layers"]["attn"]["o_proj"]["kernel"] == ("layers", "q_heads", "head_dim", "embed")
    assert axes["embed"]["embedding"] == ("vocab", "embed")
    assert shapes["layers"]["attn"]["k_proj"]["kernel"].shape == (config.num_layers, config.hidden_size,
                                                                   config.num_kv_heads, config.head_dim)
    assert ("lm_head" in shapes) == (not config.tie_embeddings)
    assert ("bias" in shapes["layers"]["attn"]["q_proj"]) == config.qkv_bias
    assert ("q_norm" in shapes["layers"]["attn"]) == config.qk_norm


def test_lm_head_weight_and_hidden_states(tiny_loaded, padded_batch):
    """logits == final hidden @ lm_head_weight, tied and untied."""
    ids, mask = (jnp.asarray(x) for x in padded_batch)
    for name in ("tiny-qwen2", "tiny-llama"):
        model, params = tiny_loaded[name]
        apply = jax.jit(model.apply, static_argnames="return_hidden")
        logits, _ = apply({"params": params}, ids, positions_from_mask(mask), mask)
        hidden, _ = apply({"params": params}, ids, positions_from_mask(mask), mask, return_hidden=True)
        weight = lm_head_weight(params, model.config)
        assert weight.shape == (model.config.hidden_size, model.config.vocab_size)
        np.testing.assert_allclose(logits, hidden @ weight, rtol=1e-5, atol=1e-5)


def test_init_cache_layout():
    config = get_preset("tiny-qwen3")
    cache = init_cache(config, 3, 10, jnp.bfloat16)
    assert cache.k.shape == cache.v.shape == (2, 3, 10, 2, 16) and cache.k.dtype == jnp.bfloat16
    assert cache.mask.shape == (3, 10) and not cache.mask.any() and int(cache.index) == 0


def test_config_validation_names_the_field():
    base = get_preset("tiny-llama")
    with pytest.raises(ValueError, match="num_heads=5 is not a multiple of num_kv_heads=2"):
        base.replace(num_heads=5)
    with pytest.raises(ValueError, match="remat_policy='sometimes'"):
        base.replace(remat_policy="sometimes")
    with pytest.raises(ValueError, match="rope_type='yarn'"):
        base.replace(rope_scaling={"rope_type": "yarn", "factor": 4.0})
    assert hash(base) == hash(get_preset("tiny-llama"))  # hashable: usable as a static jit argument
    assert isinstance(base, ModelConfig)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_grouped_attention_matches_jax_dot_product_attention(dtype):
    """Our default attention against JAX's reference implementation: GQA (6 query heads over 2 kv heads),
    causal + key padding + a cache-shaped S > T, values and gradients."""
    from searchjax.models.kernels import grouped_attention
    from searchjax.models.transformer import attention_mask
    B, T, S, N, K, D = 2, 5, 9, 6, 2, 8
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal(shape), dtype) for shape in
               ((B, T, N, D), (B, S, K, D), (B, S, K, D)))
    slot_mask = jnp.asarray(rng.random((B, S)) > 0.3)
    mask = attention_mask(jnp.ones((B, T), bool), slot_mask, S - T)  # queries at the last T slots
    reference = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask, scale=D ** -0.5,
                                                            implementation="xla")
    ours = lambda q, k, v: grouped_attention(q, k, v, mask, D ** -0.5)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == "float32" else dict(rtol=2e-2, atol=2e-2)
    f32 = lambda x: np.asarray(x, np.float32)
    np.testing.assert_allclose(f32(ours(q, k, v)), f32(reference(q, k, v)), **tol)
    weights = jnp.asarray(rng.standard_normal((B, T, N, D)), dtype)
    grad = lambda f: jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32) * weights), argnums=(0, 1, 2))(q, k, v)
    for name, g, r in zip("qkv", grad(ours), grad(reference)):
        np.testing.assert_allclose(f32(g), f32(r), err_msg=f"d{name}", **tol)


def test_silu_times_rounds_as_torch_does():
    """silu(g) * u on bf16 operands, bit for bit torch's (silu in float32 from the bf16 gate, rounded once, then the
    bf16 product); in float32 jax.nn.silu(g) * u."""
    import torch
    from searchjax.models.kernels import silu_times
    rng = np.random.default_rng(3)
    gate, up = (rng.standard_normal((64, 96)).astype(np.float32) * 4 for _ in range(2))
    as_torch = lambda a: torch.from_numpy(a.copy()).bfloat16()  # noqa: E731
    reference = (torch.nn.functional.silu(as_torch(gate)) * as_torch(up)).float().numpy()
    ours = silu_times(jnp.asarray(gate, jnp.bfloat16), jnp.asarray(up, jnp.bfloat16))
    assert ours.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(ours, np.float32), reference)
    np.testing.assert_allclose(silu_times(jnp.asarray(gate), jnp.asarray(up)), jax.nn.silu(gate) * up, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_swiglu_backward_matches_autodiff(dtype):
    """The hand-written SwiGLU backward against jax.grad of the textbook formula: dx and all three weights (silu
    rounded as torch rounds it in bf16: `silu_times`, checked against torch above)."""
    from searchjax.models.kernels import silu_times, swiglu
    B, T, H, F = 2, 7, 12, 20
    rng = np.random.default_rng(1)
    x, w_gate, w_up, w_down = (jnp.asarray(rng.standard_normal(shape), dtype) for shape in
                               ((B, T, H), (H, F), (H, F), (F, H)))
    textbook = lambda x, g, u, d: silu_times(x @ g, x @ u) @ d
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=3e-2, atol=3e-2)
    f32 = lambda a: np.asarray(a, np.float32)
    np.testing.assert_allclose(f32(swiglu(x, w_gate, w_up, w_down)), f32(textbook(x, w_gate, w_up, w_down)), **tol)
    weights = jnp.asarray(rng.standard_normal((B, T, H)), dtype)
    grad = lambda f: jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32) * weights), argnums=(0, 1, 2, 3))(
        x, w_gate, w_up, w_down)
    for name, ours, reference in zip(("x", "w_gate", "w_up", "w_down"), grad(swiglu), grad(textbook)):
        assert ours.dtype == reference.dtype, name
        if dtype == "bfloat16":  # both round intermediates to bf16, in different orders: scale-aware tolerance
            tol = dict(rtol=3e-2, atol=2e-2 * float(np.abs(f32(reference)).max()))
        np.testing.assert_allclose(f32(ours), f32(reference), err_msg=f"d{name}", **tol)


def test_causal_blocks_skip_only_masked_products():
    """grouped_attention with causal_blocks (what the model uses without a cache) equals one block, values and
    gradients, on a causal mask with left padding; causal_blocks() picks blocks of >= 128 queries."""
    from searchjax.models.kernels import grouped_attention
    from searchjax.models.transformer import attention_mask, causal_blocks
    assert [causal_blocks(T) for T in (16, 255, 256, 384, 512, 1000, 4096)] == [1, 1, 2, 3, 4, 4, 4]
    B, T, N, K, D = 2, 12, 4, 2, 8
    rng = np.random.default_rng(2)
    q, k, v = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for shape in
               ((B, T, N, D), (B, T, K, D), (B, T, K, D)))
    token_mask = jnp.asarray(np.arange(T)[None, :] >= np.array([[0], [5]]))  # row 1 left-padded
    mask = attention_mask(token_mask, token_mask, 0)
    weights = jnp.asarray(rng.standard_normal((B, T, N, D)), jnp.float32)
    run = lambda blocks: jax.value_and_grad(
        lambda *a: jnp.sum(grouped_attention(*a, mask, D ** -0.5, causal_blocks=blocks) * weights),
        argnums=(0, 1, 2))(q, k, v)
    (one, one_grads), (three, three_grads) = run(1), run(3)
    np.testing.assert_allclose(three, one, rtol=1e-5)
    for name, a, b in zip("qkv", three_grads, one_grads):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"d{name}")
    with pytest.raises(ValueError, match="causal_blocks=5"):
        grouped_attention(q, k, v, mask, 1.0, causal_blocks=5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rope_backward_matches_autodiff(dtype):
    """apply_rope's VJP (RoPE with the sine negated) against jax.grad of the textbook formula, for x and for the
    cos/sin tables; bf16: both round the same products, so the tolerance is bf16's half ulp of the scale."""
    from searchjax.models.kernels import apply_rope
    from searchjax.models.transformer import rope_cos_sin
    config = get_preset("tiny-llama")  # llama3-scaled frequencies
    B, T, heads, D = 2, 6, 3, config.head_dim
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((B, T, heads, D)), dtype)
    cos, sin = rope_cos_sin(jnp.asarray(rng.integers(0, 50, (B, T))), config)

    def textbook(x, cos, sin):
        c, s = cos[:, :, None].astype(x.dtype), sin[:, :, None].astype(x.dtype)
        return x * c + jnp.concatenate([-x[..., D // 2:], x[..., :D // 2]], axis=-1) * s
    weights = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
    grad = lambda f: jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32) * weights), argnums=(0, 1, 2))(x, cos, sin)
    f32 = lambda a: np.asarray(a, np.float32)
    np.testing.assert_array_equal(f32(apply_rope(x, cos, sin)), f32(textbook(x, cos, sin)))
    for name, ours, reference in zip(("x", "cos", "sin"), grad(apply_rope), grad(textbook)):
        assert ours.dtype == reference.dtype, name
        atol = 1e-6 if dtype == "float32" else 2 ** -8 * float(np.abs(f32(reference)).max())
        np.testing.assert_allclose(f32(ours), f32(reference), rtol=0, atol=atol * (1 if name == "x" else heads),
                                   err_msg=f"d{name}")


def test_rms_norm_backward_against_float64():
    """rms_norm's written-out VJP against numpy float64 from the same (bf16-rounded) inputs: dx to bf16's rounding,
    dscale to float32 accumulation (it sums the tokens in float32; autodiff's bf16 sum is also checked, and is
    further off), and against jax.grad of the textbook form in float32."""
    from searchjax.models.kernels import rms_norm
    rng = np.random.default_rng(4)
    eps = 1e-6

    def textbook(x, scale):
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
        return scale.astype(x.dtype) * normed.astype(x.dtype)
    for dtype in ("float32", "bfloat16"):
        x = jnp.asarray(rng.standard_normal((4, 64, 3, 32)), dtype)  # [B, T, heads, D]: q/k norms' shape
        scale = jnp.asarray(1 + 0.3 * rng.standard_normal(32), jnp.float32)
        weights = jnp.asarray(rng.standard_normal(x.shape), dtype)
        grad = lambda f: jax.grad(lambda *a: jnp.sum((f(*a) * weights).astype(jnp.float32)), argnums=(0, 1))(x, scale)
        (d_x, d_scale), (ref_x, ref_scale) = grad(lambda x, s: rms_norm(x, s, eps)), grad(textbook)
        assert d_x.dtype == x.dtype and d_scale.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(rms_norm(x, scale, eps), np.float32),
                                      np.asarray(textbook(x, scale), np.float32))
        x64, s64, g64 = (np.asarray(a, np.float64) for a in (x, scale, weights))
        r = 1 / np.sqrt(np.mean(x64 ** 2, axis=-1, keepdims=True) + eps)
        normed = np.asarray(jnp.asarray(x64 * r, dtype), np.float64)  # rounded to the compute dtype, as the forward
        dn = g64 * np.asarray(jnp.asarray(s64, dtype), np.float64)
        want_x = r * (dn - x64 * r * np.mean(dn * x64 * r, axis=-1, keepdims=True))
        want_scale = np.sum(g64 * normed, axis=(0, 1, 2))
        if dtype == "float32":
            np.testing.assert_allclose(d_x, want_x, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(d_scale, want_scale, rtol=1e-4, atol=1e-3)
            np.testing.assert_allclose(d_x, ref_x, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(d_scale, ref_scale, rtol=1e-4, atol=1e-3)
        else:
            np.testing.assert_allclose(np.asarray(d_x, np.float32), want_x, rtol=2 ** -7, atol=2 ** -7)
            ours_err = np.abs(np.asarray(d_scale) - want_scale).max()
            autodiff_err = np.abs(np.asarray(ref_scale, np.float64) - want_scale).max()
            assert ours_err < 1e-3 * np.abs(want_scale).max() and ours_err < autodiff_err, (ours_err, autodiff_err)


def test_causal_block_splits_have_autodiff_gradients():
    """split_blocks / causal_prefixes: the slices of plain indexing, and VJPs equal to autodiff's pads and adds."""
    from searchjax.models.kernels import causal_prefixes, split_blocks
    rng = np.random.default_rng(6)
    q = jnp.asarray(rng.standard_normal((2, 3, 2, 12, 4)), jnp.float32)  # [B, K, G, T, D]
    k = jnp.asarray(rng.standard_normal((2, 3, 12, 4)), jnp.float32)  # [B, K, S, D]
    plain_split = lambda x, n: tuple(x[:, :, :, i * 4:(i + 1) * 4] for i in range(n))
    plain_prefixes = lambda x, n: tuple(x[:, :, :(i + 1) * 4] for i in range(n))
    for ours, plain, x in ((split_blocks, plain_split, q), (causal_prefixes, plain_prefixes, k)):
        parts = ours(x, 3)
        for a, b in zip(parts, plain(x, 3)):
            np.testing.assert_array_equal(a, b)
        weights = [jnp.asarray(rng.standard_normal(p.shape), jnp.float32) for p in parts]
        loss = lambda f: jax.grad(lambda x: sum(jnp.sum(p * w) for p, w in zip(f(x, 3), weights)))(x)
        np.testing.assert_allclose(loss(ours), loss(plain), rtol=1e-6, atol=1e-6)


def _stacked_f32_gate(model, params, ids, mask) -> bool:
    """Whether the compiled bf16 forward holds a float32 copy of the stacked [L, H, F] gate kernels."""
    cfg = model.config
    text = jax.jit(model.apply).lower({"params": params}, ids, positions_from_mask(mask), mask).compile().as_text()
    return f"f32[{cfg.num_layers},{cfg.hidden_size},{cfg.intermediate_size}]" in text


def test_bf16_weights_are_scanned_as_bits_and_differentiate_as_weights(tiny_loaded, padded_batch):
    """XLA:CPU converts stacked bf16 weights sliced by a scan to float32 whole (`kernels.with_scan_bits`); the
    model scans their bits instead, and its gradients are those of the same weights held in float32: the bf16
    forward is the same computation, and the cotangent of a float32 weight cast to bf16 is the bf16 one, widened."""
    model, params = tiny_loaded["tiny-qwen3"]
    ids, mask = (jnp.asarray(x) for x in padded_batch)
    bf16 = Transformer(model.config.replace(dtype="bfloat16", param_dtype="bfloat16"))
    params_bf16 = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
    params_rounded = jax.tree.map(lambda p: p.astype(jnp.float32), params_bf16)
    gate = params_bf16["layers"]["mlp"]["gate_proj"]["kernel"]
    assert gate.shape == (2, 32, 64)
    plain_scan = jax.jit(lambda w, x: jax.lax.scan(lambda x, w: (x @ w @ w.T, None), x, w)[0])
    assert f"f32[{','.join(map(str, gate.shape))}]" in plain_scan.lower(gate, gate[0, :, :3].T).compile().as_text()
    assert not _stacked_f32_gate(bf16, params_bf16, ids, mask)

    loss, grads = _loss_and_grads(bf16, params_bf16, ids, mask)
    reference_loss, reference_grads = _loss_and_grads(Transformer(bf16.config.replace(param_dtype="float32")),
                                                      params_rounded, ids, mask)
    np.testing.assert_allclose(loss, reference_loss, rtol=1e-6)
    for path, g, reference in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(grads),
                                  jax.tree.leaves(reference_grads)):
        assert g.dtype == jnp.bfloat16 and float(jnp.abs(g.astype(jnp.float32)).max()) > 0, path[0]
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(reference.astype(jnp.bfloat16), np.float32),
                                   rtol=1e-2, atol=1e-3, err_msg=jax.tree_util.keystr(path[0]))

"""The decode step on a CPU: per-layer weights and cache windows made once per decode launch, the layers
unrolled over them, and the hand-written kernels where they run (`searchjax.models.native`).

`decode_steps.decode_loop` runs this step on a CPU target (`per_layer_decode`) and the stacked one
(`decode_steps.decode_forward_stacked`) on accelerators; `decode_steps`' docstring says why and what a step
costs. Here: `layer_weights` (per-layer weights in the compute dtype, packed for the skinny-matmul kernel at 2-32
rows, 1-32 in bf16: `packed_decode`), `split_cache` / `merge_cache` (the window out of the stacked cache and the
launch's new slots back into it), and `decode_forward` (one token per row through the layers).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from searchjax.models import KVCache, lm_head_weight, native, transformer
from searchjax.models.decode_attention import (KEY_BLOCK, KEY_PAIRS, WINDOW_BITS, block_values, decode_attention,
                                               from_key_window, from_window, kernel_runs, key_slot, key_window_dtype,
                                               key_window_part, pairs_values, to_key_window, to_window,
                                               unblock_values, value_block)
from searchjax.models.kernels import matmul, silu_times, swiglu, update_slice, update_slice_in_dim


def layer_weights(params, config, pack: bool = False) -> list:
    """params["layers"] (stacked [L, ...]) as L per-layer trees in the compute dtype, made once per decode launch,
    before its loop (every layer weight is used in the compute dtype, so the cast changes no result). With
    `pack`, the projections' matrices are in `native.pack_columns`' form instead ([N / NB, K, NB]) for the
    skinny-matmul kernel (`packed_decode`): attn["qkv_packed"] is q, k and v side by side ([H, (N + 2K) x D]),
    mlp["gate_up_packed"] gate and up ([H, 2I]), each one kernel call where there were three and two (every
    output column is its own dot product, so side by side changes no value), and o_proj ([heads x D, H]) and
    down_proj keep their names. The projections' biases stay where they are.

    Why: XLA:CPU cannot hand a dot a slice of a bigger buffer, so a step that slices layer i's weights out of
    the stacked tree (a scan over layers) copies every weight before using it: each step then reads the
    weights twice and writes them once (and with float32 storage and bfloat16 compute, converts them too).
    Made outside the loop, the copies cost one more set of layer weights in memory while decoding, once per
    call, and every step reads each weight once. Packing is the same copy in another order. Fewer, wider
    calls: a call costs its dispatch and a wake-up of the pool's other thread, and at batch 8 the k and v
    products read 0.2 MB each (~6 us at 37 GB/s): SmolLM2's 211 calls a step became 121, and its bf16 step at
    batch 8 over 2,000 slots went from 26.0-26.9 to 24.7-25.1 ms on a 2-core AMD EPYC, with bitwise the same
    logits (`docs/performance.md`, "Fewer kernel calls a step")."""
    dt = config.compute_dtype
    layers = [jax.tree.map(lambda w: w[i].astype(dt), params["layers"]) for i in range(config.num_layers)]
    if not pack:
        return layers
    for layer in layers:
        attn, mlp = layer["attn"], layer["mlp"]
        qkv = [attn[name].pop("kernel") for name in ("q_proj", "k_proj", "v_proj")]  # [H, heads, D] each
        attn["qkv_packed"] = native.pack_columns(jnp.concatenate([w.reshape(w.shape[0], -1) for w in qkv], axis=1))
        kernel = attn["o_proj"]["kernel"]  # [heads, D, H]
        attn["o_proj"] = {**attn["o_proj"], "kernel": native.pack_columns(kernel.reshape(-1, kernel.shape[-1]))}
        gate_up = [mlp.pop(name)["kernel"] for name in ("gate_proj", "up_proj")]  # [H, I] each
        mlp["gate_up_packed"] = native.pack_columns(jnp.concatenate(gate_up, axis=1))
        mlp["down_proj"] = {**mlp["down_proj"], "kernel": native.pack_columns(mlp["down_proj"]["kernel"])}
    return layers


def packed_decode(config, batch: int, mesh: Optional[Mesh]) -> bool:
    """Whether a CPU decode launch runs its projections and LM head through the skinny-matmul kernel
    (`native.skinny_matmul`): on one device (XLA cannot partition the kernel's call), for 2-32 rows, 1-32 with
    bf16 weights (`native.skinny_rows`: one row of f32 weights is a matrix-vector product XLA:CPU streams at
    bandwidth already, of bf16 weights not), every output width a multiple of 8, and the kernel built here. At
    batch 8 it took SmolLM2's 30 layers and head from 80 to 46 ms a step in float32 on a 2-core AMD EPYC
    (`docs/performance.md`)."""
    low, high = native.skinny_rows(config.compute_dtype)
    widths = (config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim, config.hidden_size,
              config.intermediate_size, config.vocab_size)
    return (one_device(mesh) and low <= batch <= high
            and all(native.column_block(width) for width in widths) and native.skinny_matmul_target() is not None)


def one_device(mesh: Optional[Mesh]) -> bool:
    """Whether a step runs on one device, the condition of the CPU kernels: XLA cannot partition their calls."""
    return mesh is None or mesh.devices.size == 1


def packed_lm_head(params, config) -> jax.Array:
    """The LM head in the compute dtype, in `native.pack_columns`' form: `decode_forward`'s packed_head."""
    return native.pack_columns(lm_head_weight(params, config).astype(config.compute_dtype))


# The dtype of the per-layer decode windows on a CPU where the step's attention runs the jnp form. XLA:CPU (jax
# 0.10.2) runs decode attention's bf16 products (3 query rows per kv head against the window) on one thread at
# ~5 GB/s of window, its f32 ones at ~14 GB/s: 30 layers of it at batch 8 over 4,096 slots took 140-166 ms with
# bf16 windows and 106 ms with f32 ones holding twice the bytes (2-core AMD EPYC with AVX-512 BF16). The windows
# are copies made once per decode launch anyway; in f32 they hold a bf16 cache's values exactly. The kernel reads
# the cache's own values instead (`window_layout`).
CPU_WINDOW_DTYPE = jnp.float32


def split_cache(cache: Optional[KVCache], window: int, dtype=None, value_block: Optional[int] = None
                ) -> Optional[KVCache]:
    """The cache's first `window` slots as one heads-major buffer per layer: k = a tuple of L arrays [B, K, D, W]
    (keys slot-minor), v = L arrays [B, K, W, D] (copies, once per decode launch; with `value_block` CB,
    [B, K, D / CB, W, CB], the CPU kernel's layout: `window_layout`), in `dtype` (default: the cache's; a wider
    one holds the cache's values exactly, and `merge_cache` rounds nothing when it writes them back;
    `WINDOW_BITS` holds a bf16 cache's bits: `to_window`, its keys as pairs of head dims in blocks of 16 slots
    where the kernels multiply bf16 pairs: `decode_attention.KEY_PAIRS`, [B, K, W / 16, D / 2, 16], and then its
    values in slot pairs where CB is 16: `decode_attention.pairs_values`, [B, K, D / 16, W / 2, 16, 2]). Per-layer
    buffers let each step's products read a layer's window in place and write only the new slot into it (a slice of
    the stacked [L, ...] cache would be a copy per layer and step); heads-major makes those products plain batched
    matmuls, and slot-minor keys make q k^T a [G, D] x [D, W] product (`decode_attention`, "Layout")."""
    if cache is None:
        return None
    count, dtype = cache.k.shape[0], cache.k.dtype if dtype is None else dtype

    key_dtype = key_window_dtype(dtype, cache.k.shape[-1], window)
    pairs = pairs_values(key_dtype, value_block)

    def values(layer):  # [B, W, K, D] -> [B, K, W, D], [B, K, D / CB, W, CB] or in slot pairs
        heads_major = layer.transpose(0, 2, 1, 3)
        return heads_major if value_block is None else block_values(heads_major, value_block, pairs)

    return KVCache(k=tuple(to_key_window(cache.k[i, :, :window].transpose(0, 2, 3, 1), key_dtype)
                           for i in range(count)),
                   v=tuple(to_window(values(cache.v[i, :, :window]), dtype) for i in range(count)),
                   mask=cache.mask[:, :window], index=cache.index)


def window_layout(config, mesh: Optional[Mesh], cache_dtype) -> tuple:
    """(dtype, value block) of a CPU decode launch's windows (`split_cache`'s dtype and value_block). Where the
    step's attention runs the kernel (one device, `decode_attention.kernel_runs`): the cache's own values (None;
    a bf16 cache's as their bits, `WINDOW_BITS`), which the kernel widens to f32 as it loads (bf16 -> f32 is
    exact) or, where it multiplies bf16 pairs, reads in pairs (`split_cache`), and `decode_attention.value_block`'s
    columns per block. A bf16 cache's window is then read as half
    the bytes of an f32 copy, and the step's attention is bound by that read: batch 8 at 2,000 filled slots,
    bf16, 54.7 -> 38.0-43.0 ms a step on a 2-core AMD EPYC with AVX-512 BF16 (`docs/performance.md`, "bf16
    windows for the kernel"). Elsewhere (`CPU_WINDOW_DTYPE`, [B, K, W, D]): the jnp form's float32 windows;
    (None, None) where the step is not per-layer (TPU, GPU, several devices: `per_layer_decode`)."""
    if not per_layer_decode(mesh):
        return None, None
    if one_device(mesh) and kernel_runs(config.compute_dtype, cache_dtype, config.num_heads, config.num_kv_heads,
                                        config.head_dim):
        bits = jnp.dtype(cache_dtype) == jnp.bfloat16
        return (WINDOW_BITS if bits else None), value_block(config.head_dim)
    return CPU_WINDOW_DTYPE, None


# Slots per block when `merge_cache` writes a launch's new slots back (one block covers a short launch).
MERGE_BLOCK = 128


def merge_cache(full: Optional[KVCache], part: Optional[KVCache], written_from,
                block: int = MERGE_BLOCK) -> Optional[KVCache]:
    """Write the slots a decode launch wrote into `split_cache`'s per-layer windows, [written_from, part.index),
    back into the stacked cache (in place: the full one is donated), `block` slots at a time.

    Only those slots: every other window slot still holds the stacked cache's value (`split_cache` copied it
    exactly and the steps wrote only at the index), so writing the whole window back (as this did before) moved
    W slots per launch where a launch writes at most its steps. On a 2-core VM that whole-window write back (a
    377 MB stacked temporary for 8 rows x 2,048 slots, first touched after the loop) cost 0.2-5 s per launch
    (`docs/performance.md`, "Decode launches"). A block past the window's end starts earlier instead, at W -
    block: it rewrites slots already equal, which changes nothing."""
    if full is None:
        return None
    window = part.mask.shape[1]
    # whole key blocks of a `KEY_PAIRS` window, whole slot pairs of values in pairs (`KEY_BLOCK` is even): from a
    # slot that starts one, whole ones at a time (the slots before, already equal, are written again)
    whole = KEY_BLOCK if part.k[0].dtype == KEY_PAIRS else 2
    block = min(-(-block // whole) * whole, window)
    written_from = written_from // whole * whole

    def write(j, kv):
        at = jnp.minimum(written_from + j * block, window - block)
        # one update of all layers' block, not one per layer: XLA:CPU copied the whole cache for each of those
        k_new = jnp.stack([from_key_window(key_window_part(layer, at, block), full.k.dtype).transpose(0, 3, 1, 2)
                           for layer in part.k])
        v_new = jnp.stack([from_window(_value_slots(layer, at, block), full.v.dtype) for layer in part.v])
        return update_slice_in_dim(kv[0], k_new, at, axis=2), update_slice_in_dim(kv[1], v_new, at, axis=2)

    blocks = (part.index - written_from + block - 1) // block
    k, v = jax.lax.fori_loop(0, blocks, write, (full.k, full.v))
    return KVCache(k=k, v=v, mask=jax.lax.dynamic_update_slice_in_dim(full.mask, part.mask, 0, axis=1),
                   index=part.index)


def _value_slots(layer, at, block: int) -> jax.Array:
    """Slots [at, at + block) of a value window (any `split_cache` layout; at and block even) as [B, block, K, D]."""
    if layer.ndim == 6:  # [B, K, D / CB, W / 2, CB, 2]
        return unblock_values(jax.lax.dynamic_slice_in_dim(layer, at // 2, block // 2, axis=3)).transpose(0, 2, 1, 3)
    if layer.ndim == 5:  # [B, K, D / CB, W, CB]
        return unblock_values(jax.lax.dynamic_slice_in_dim(layer, at, block, axis=3)).transpose(0, 2, 1, 3)
    return jax.lax.dynamic_slice_in_dim(layer, at, block, axis=2).transpose(0, 2, 1, 3)


def _decode_layer(config, weights, x, k_window, v_window, visible, index, cos, sin, native_attention, packed):
    """One decoder layer for one token per row: x [B, 1, H], windows k [B, K, D, W] (or `KEY_PAIRS`' [B, K, W / 16,
    D / 2, 16]), v [B, K, W, D] (or the kernel's [B, K, D / CB, W, CB]) -> (x, windows with slot `index` written).
    packed: the weights are `layer_weights(..., pack=True)`'s, for the skinny-matmul kernel.

    The same maths as `transformer.DecoderLayer` over a cache (projections through `kernels.matmul` with the
    same casts, RMSNorm via the model's module, RoPE, SwiGLU), but attention is `decode_attention` over the
    window plus the token itself, and only the token's slot is written (after the window is read)."""
    dt, eps, N, K, D = config.compute_dtype, config.rms_norm_eps, config.num_heads, config.num_kv_heads, config.head_dim
    attn = weights["attn"]

    def norm(scale_params, h, axis="embed"):
        return transformer.RMSNorm(eps, axis, config.weight_dtype).apply({"params": scale_params}, h)

    h = norm(weights["attn_norm"], x)
    if packed:  # q, k and v side by side in one product (`layer_weights`)
        y = native.skinny_matmul(h[:, 0].astype(dt), attn["qkv_packed"])
        ys = y[:, :N * D], y[:, N * D:(N + K) * D], y[:, (N + K) * D:]
    else:
        ys = tuple(matmul("bth,hnd->btnd", h.astype(dt), attn[name]["kernel"].astype(dt))
                   for name in ("q_proj", "k_proj", "v_proj"))

    def split_heads(y, heads, name):  # [B, 1, heads, D], with the projection's bias where the model has one
        y = y.reshape(h.shape[0], 1, heads, D)
        return y + attn[name]["bias"].astype(dt) if config.qkv_bias else y

    q, k, v = (split_heads(y, heads, name) for y, heads, name in zip(ys, (N, K, K), ("q_proj", "k_proj", "v_proj")))
    if config.qk_norm:
        q, k = norm(attn["q_norm"], q, "head_dim"), norm(attn["k_norm"], k, "head_dim")
    q, k = transformer.apply_rope(q, cos, sin), transformer.apply_rope(k, cos, sin)
    # as stored in the cache (which holds the compute dtype, `init_cache`'s default); written in the window's form
    k, v = k.astype(dt), v.astype(dt)
    out = decode_attention(q[:, 0], k[:, 0], v[:, 0], k_window, v_window, visible, D ** -0.5, native_attention)
    (k_slot, k_at), v = key_slot(k[:, 0], k_window.dtype, index), to_window(v, v_window.dtype)
    # Then write the slot, with values routed through the attention output (a select on `out > +inf`, false
    # for every number, NaN included: the values are k and v). That data dependency is what lets XLA write in
    # place: with none between the window's reads and the write, XLA cannot order them and copies the window
    # for the reads (2-3 copies per layer and step on XLA:CPU, also with an optimization barrier or with the
    # write first). Per row, so a batch-sharded step needs no communication for it.
    never = (out[:, 0, 0] > jnp.inf)[:, None, None, None]
    k_window = update_slice(k_window, jnp.where(never.reshape(-1, *(1,) * (k_slot.ndim - 1)), 0, k_slot), k_at)
    v_slot = v.transpose(0, 2, 1, 3)  # [B, K, 1, D]
    if v_window.ndim == 6:  # [B, K, D / CB, 1, CB, 1]: this slot's half of each pair, its partner's untouched
        CB = v_window.shape[4]
        v_slot = v_slot.reshape(*v_slot.shape[:2], D // CB, 1, CB, 1)
        v_window = update_slice(v_window, jnp.where(never[..., None, None], 0, v_slot),
                                (0, 0, 0, index // 2, 0, index % 2))
    elif v_window.ndim == 5:  # [B, K, D / CB, 1, CB]
        v_slot = block_values(v_slot, v_window.shape[4])
        v_window = update_slice(v_window, jnp.where(never[..., None], 0, v_slot), (0, 0, 0, index, 0))
    else:
        v_window = update_slice(v_window, jnp.where(never, 0, v_slot), (0, 0, index, 0))
    mlp = weights["mlp"]
    if packed:  # swiglu's maths and casts, each product through the kernel
        x = x + native.skinny_matmul(out.reshape(out.shape[0], N * D), attn["o_proj"]["kernel"])[:, None]
        h = norm(weights["mlp_norm"], x).astype(dt)[:, 0]
        gate_up = native.skinny_matmul(h, mlp["gate_up_packed"])
        gate, up = gate_up[:, :config.intermediate_size], gate_up[:, config.intermediate_size:]
        x = x + native.skinny_matmul(silu_times(gate, up), mlp["down_proj"]["kernel"])[:, None]
        return x, k_window, v_window
    # as one [B, N * D] x [N * D, H] product: with the two contracted axes (n, d) XLA:CPU chose to transpose the
    # weight to [D, N, H] (a copy per layer and step) rather than order the small activation
    x = x + matmul("be,eh->bh", out.reshape(out.shape[0], N * D),
                   attn["o_proj"]["kernel"].astype(dt).reshape(N * D, -1))[:, None]
    h = norm(weights["mlp_norm"], x).astype(dt)
    x = x + swiglu(h, *(mlp[name]["kernel"].astype(dt) for name in ("gate_proj", "up_proj", "down_proj")))
    return x, k_window, v_window


def decode_forward(params, weights, model, token, position, running, cache: KVCache, native_attention: bool = True,
                   packed_head=None):
    """One token per row (token/position/running [B]) through the model -> (logits [B, V] f32, cache).

    `cache` is `split_cache`'s per-layer form (L heads-major buffers, k [B, K, D, W], v [B, K, W, D] or in
    blocks of columns) and `weights` is `layer_weights`' per-layer list, both made once per decode launch.
    The layers run unrolled (whatever config.scan_layers says: that switch is for the full forward; SmolLM2's
    30 compile in ~12-16 s here):
    each reads its own weights and window in place, attends over the window read-only plus the token itself
    (`decode_attention`: the two softmax parts merged exactly) and writes just the token's slot, so a step
    reads every weight once and the window's keys/values once and writes L x 2 slots; no window and no weight
    is copied. Visible window slots: the occupied ones before the write index (cache.mask & s < index); the
    token's own slot is always visible, which is `transformer.attention_mask` for a one-token block.
    native_attention: attention by the CPU kernel where it is built (`decode_attention`); only for a step on one
    device, since XLA cannot partition the kernel's call over a mesh. packed_head: the LM head in
    `native.pack_columns`' form, given with `layer_weights(..., pack=True)`'s weights (`packed_decode`).
    """
    config = model.config
    index = cache.index
    x = transformer.Embedding(config).apply({"params": params["embed"]}, token[:, None])  # [B, 1, H]
    cos, sin = transformer.rope_cos_sin(position[:, None], config)
    visible = cache.mask & (jnp.arange(cache.mask.shape[1]) < index)[None]
    ks, vs = list(cache.k), list(cache.v)
    for i in range(config.num_layers):
        x, ks[i], vs[i] = _decode_layer(config, weights[i], x, ks[i], vs[i], visible, index, cos, sin,
                                        native_attention, packed_head is not None)
    hidden = transformer.RMSNorm(config.rms_norm_eps, "embed", config.weight_dtype).apply(
        {"params": params["final_norm"]}, x)
    if packed_head is not None:
        logits = native.skinny_matmul(hidden[:, -1].astype(config.compute_dtype), packed_head, jnp.float32)
    else:
        head = lm_head_weight(params, config).astype(config.compute_dtype)
        logits = matmul("bh,hv->bv", hidden[:, -1].astype(config.compute_dtype), head, jnp.float32)
    slot_mask = jax.lax.dynamic_update_slice_in_dim(cache.mask, running[:, None], index, axis=1)
    return logits, KVCache(k=tuple(ks), v=tuple(vs), mask=slot_mask, index=index + 1)


def per_layer_decode(mesh: Optional[Mesh]) -> bool:
    """Whether the decode loop runs on per-layer weights and windows (`decode_forward`) rather than on the
    stacked ones (`decode_forward_stacked`): on the CPU, the target where a slice of a stacked buffer is a copy.

    XLA:CPU copies each layer's weight and cache slice out of the stacked [L, ...] arrays every step (a
    long-window step spent most of its time there); per-layer buffers made once per call avoid it, at the cost
    of one more set of compute-dtype weights while decoding and an unrolled loop to compile. On TPU and GPU a
    slice feeds the matrix unit in place, so those costs would buy nothing: one more copy of the weights in
    HBM would shrink the room for the rollout's cache. The target is the mesh's devices (the compile check
    builds TPU programs on a CPU host), else JAX's default backend."""
    platform = mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()
    return platform == "cpu"

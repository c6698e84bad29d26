"""The jitted parts of generation: prefill, the on-device decode loop, append, and the state they carry.

`searchjax.generation` is the host side (sessions, buckets, capacity checks, results); this module is what
runs on the device. Prefill and append run the model's own forward (`Transformer.__call__` with the cache);
the decode step (`decode_forward`) is its own function over the same parameters and the same maths.

Compilations. Parameters, the state, the budget, temperature, top-p and the stop table are traced
arguments; the static ones are the model (its config), `logits_fn`, `logits_processor`, the sampling mode (greedy / top-k
value / nucleus on-off), the EOS ids, the decode window and the mesh. Shapes are bucketed:
  batch B  -> d * 2^k (d = the mesh's batch shard count, 1 without a mesh),
  prompt P -> 2^k >= 8 (only if that leaves no free slot: a multiple of 16, else the exact length),
  append A -> 2^k >= 16 (`append_bucket`; only if that does not fit: a multiple of 16),
  window W -> 2^k >= 16 up to 1,024 slots, then quarter octaves (1280, 1536, ..., 2560, 3072, ...), covering
    the slots used after the call (prefill, append) or the launch (decode: `generation.decode_segments`
    splits a long call into launches whose window grows with the text), capped at S (`decode_window`):
    what decode, prefill and append attend over (slots past it are empty),
  stop-automaton states -> 2^k >= 8, and for `generate` the cache S = P + 2^k >= P + max_new_tokens.
Bound: for a fixed (B, S), model and mesh, a session compiles prefill once per prompt bucket (<= log2(S) - 2
of them; its window is its bucket's), append once per (block bucket, window) pair it meets, and decode at
most once per (sampling mode, stop-state bucket, window): 7 windows up to 1,024 slots, 4 per octave above,
plus S itself. A rollout with one observation bucket, one sampling setting and one stop set thus compiles a
bounded set (S = 2048: <= 9 prefill + 11 append + 11 decode; S = 6144: 6 more windows), and every later
batch of the same (B, S) reuses them.

Decode step cost. Each step reads every weight once and the window's keys and values once, and writes one
slot per layer; it copies no weight and no layer's window (a test checks the optimized HLO of the loop
body). How: `decode_loop` makes per-layer weights (`layer_weights`) and per-layer window buffers
(`split_cache`, heads-major) once per launch, before its loop, and writes the slots the launch wrote back
afterwards (`merge_cache`, in place). The step (`decode_forward`) runs the layers unrolled; each attends over its
window read-only plus the new token, the two softmax parts merged exactly (`searchjax.models.decode_attention`),
and writes just the token's slot. (The former step sliced each layer's cache and weights out of the stacked
[L, ...] arrays in a layer scan and let attention write the token into the layer's cache: on XLA:CPU those
slices and the write are copies, ~60 % of a step with a 2,000-slot window.) The window W rather than all S
slots bounds the reads, and sampling does not sort the vocabulary (`searchjax.sampling`), so a step's time
grows with the text so far (`searchjax.bench.decode_window` measures how much), not with max_cache_len. The
per-call copies cost one more set of layer weights and one window of memory while decoding (the window copy
was made before too). On one CPU device the step's attention and, at 2-32 rows, its products and LM head run as
hand-written kernels (`searchjax.models.native`, `packed_decode`): XLA:CPU's code for those shapes read the
window and the weights at a third of the host's bandwidth.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import flax
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from searchjax import sampling, sharding
from searchjax.models import KVCache, init_cache, lm_head_weight, native, positions_from_mask, transformer
from searchjax.models.decode_attention import decode_attention
from searchjax.models.kernels import matmul, swiglu, update_slice, update_slice_in_dim

RUNNING, EOS, STOP, LENGTH = 0, 1, 2, 3

LogitsFn = Callable[[jax.Array, jax.Array], jax.Array]
LogitsProcessor = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]  # (logits, tokens, lengths) -> logits



@flax.struct.dataclass
class SamplerState:
    """Everything the jitted prefill / decode / append functions carry. B rows (incl. padding), S slots."""
    cache: Optional[KVCache]   # k, v [L, B, S, K, D]; None when decoding from a logits_fn without a model
    tokens: jax.Array          # [B, S] int32: row b's real tokens are tokens[b, :lengths[b]]
    lengths: jax.Array         # [B] int32: real tokens so far (= RoPE position of the next token)
    logprobs: jax.Array        # [B, S] float32: sampler log-prob of generated tokens (0 for prompt/appended)
    next_logits: jax.Array     # [B, V] float32: logits for each row's next token
    done: jax.Array            # [B] bool: stopped (or a padding row)
    stop_reason: jax.Array     # [B] int32: RUNNING / EOS / STOP / LENGTH
    stop_state: jax.Array      # [B] int32: stop-string automaton state
    turn_start: jax.Array      # [B] int32: lengths when the current decode call began
    step: jax.Array            # int32 scalar: decode steps taken in the current call
    row_keys: jax.Array        # [B] PRNG keys: fold_in(key(seed), row)


# -------------------------------------------------------------------------------------------- sharding

def constrain_state(state: SamplerState, mesh: Optional[Mesh], rules) -> SamplerState:
    """Pin every [B, ...] array of the state to the batch mesh axes."""
    if mesh is None:
        return state
    batch_axes = sharding.batch_sharding(mesh, rules, ndim=1).spec[0]

    def pin(x, batch_dim):
        spec = [None] * x.ndim
        spec[batch_dim] = batch_axes
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(*spec)))

    replicated = NamedSharding(mesh, PartitionSpec())
    cache = state.cache
    if cache is not None:
        # stacked [L, B, S, K, D] (batch is dimension 1), or split_cache's per-layer [B, K, W, D] (dimension 0)
        layer_batch_dim = 0 if isinstance(cache.k, tuple) else 1
        cache = KVCache(k=jax.tree.map(lambda x: pin(x, layer_batch_dim), cache.k),
                        v=jax.tree.map(lambda x: pin(x, layer_batch_dim), cache.v), mask=pin(cache.mask, 0),
                        index=jax.lax.with_sharding_constraint(cache.index, replicated))
    fields = {f: pin(getattr(state, f), 0) for f in ("tokens", "lengths", "logprobs", "next_logits", "done",
                                                     "stop_reason", "stop_state", "turn_start", "row_keys")}
    return state.replace(cache=cache, step=jax.lax.with_sharding_constraint(state.step, replicated), **fields)


# ------------------------------------------------------------------------------------------ jitted parts

def next_logits(params, model, logits_fn, ids, positions, mask, cache, tokens, lengths, logits_processor=None):
    """Feed ids/positions/mask [B, T] (real tokens right-aligned in the block) -> (logits [B, V] f32 for the
    last column, updated cache). logits_fn, when given, replaces the model's logits; logits_processor, when
    given, then maps them (`process_logits`)."""
    logits = None
    if model is not None:
        hidden, cache = model.apply({"params": params}, ids, positions, mask, cache=cache, return_hidden=True)
        config = model.config
        head = lm_head_weight(params, config).astype(config.compute_dtype)
        logits = matmul("bh,hv->bv", hidden[:, -1].astype(config.compute_dtype), head, jnp.float32)
    return process_logits(logits, logits_fn, logits_processor, tokens, lengths), cache


def process_logits(logits, logits_fn, logits_processor, tokens, lengths):
    """The next-token logits [B, V] f32 sampling uses: the model's `logits` (None without a model), replaced by
    logits_fn(tokens, lengths) when given, then mapped by logits_processor(logits, tokens, lengths) when given.
    Unlike `logits_fn` the processor sees the model's logits, so the LM head stays in the compiled step (a
    scripted policy that only biases them costs what the policy's own step costs)."""
    if logits_fn is not None:
        logits = logits_fn(tokens, lengths).astype(jnp.float32)
    if logits_processor is not None:
        logits = logits_processor(logits, tokens, lengths).astype(jnp.float32)
    return logits


def layer_weights(params, config, pack: bool = False) -> list:
    """params["layers"] (stacked [L, ...]) as L per-layer trees in the compute dtype, made once per decode launch,
    before its loop (every layer weight is used in the compute dtype, so the cast changes no result). With
    `pack`, each projection's matrix is in `native.pack_columns`' form instead ([N / NB, K, NB], q/k/v as
    [H, heads x D], o_proj as [heads x D, H]) for the skinny-matmul kernel (`packed_decode`).

    Why: XLA:CPU cannot hand a dot a slice of a bigger buffer, so a step that slices layer i's weights out of
    the stacked tree (a scan over layers) copies every weight before using it: each step then reads the
    weights twice and writes them once (and with float32 storage and bfloat16 compute, converts them too).
    Made outside the loop, the copies cost one more set of layer weights in memory while decoding, once per
    call, and every step reads each weight once. Packing is the same copy in another order."""
    dt = config.compute_dtype
    layers = [jax.tree.map(lambda w: w[i].astype(dt), params["layers"]) for i in range(config.num_layers)]
    if not pack:
        return layers
    for layer in layers:
        attn = layer["attn"]
        for name in ("q_proj", "k_proj", "v_proj"):
            kernel = attn[name]["kernel"]  # [H, heads, D]
            attn[name] = {**attn[name], "kernel": native.pack_columns(kernel.reshape(kernel.shape[0], -1))}
        kernel = attn["o_proj"]["kernel"]  # [heads, D, H]
        attn["o_proj"] = {**attn["o_proj"], "kernel": native.pack_columns(kernel.reshape(-1, kernel.shape[-1]))}
        layer["mlp"] = {name: {**leaf, "kernel": native.pack_columns(leaf["kernel"])} if name.endswith("_proj")
                        else leaf for name, leaf in layer["mlp"].items()}
    return layers


def packed_decode(config, batch: int, mesh: Optional[Mesh]) -> bool:
    """Whether a CPU decode launch runs its projections and LM head through the skinny-matmul kernel
    (`native.skinny_matmul`): on one device (XLA cannot partition the kernel's call), for 2-32 rows
    (`native.SKINNY_ROWS`: one row is a matrix-vector product XLA:CPU streams at bandwidth already), every
    output width a multiple of 8, and the kernel built here. At batch 8 it took SmolLM2's 30 layers and head
    from 80 to 46 ms a step in float32 on a 2-core AMD EPYC (`docs/performance.md`)."""
    low, high = native.SKINNY_ROWS
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


# The dtype of the per-layer decode windows on a CPU. XLA:CPU (jax 0.10.2) runs decode attention's bf16 products
# (3 query rows per kv head against the window) on one thread at ~5 GB/s of window, its f32 ones at ~14 GB/s: 30
# layers of it at batch 8 over 4,096 slots took 140-166 ms with bf16 windows and 106 ms with f32 ones holding
# twice the bytes (2-core AMD EPYC with AVX-512 BF16). The windows are copies made once per decode launch
# anyway; in f32 they take twice the memory of a bf16 cache's window and hold its values exactly.
CPU_WINDOW_DTYPE = jnp.float32


def split_cache(cache: Optional[KVCache], window: int, dtype=None) -> Optional[KVCache]:
    """The cache's first `window` slots as one heads-major buffer per layer: k = a tuple of L arrays [B, K, D, W]
    (keys slot-minor), v = L arrays [B, K, W, D] (copies, once per decode launch), in `dtype` (default: the
    cache's; a wider one holds the cache's values exactly, and `merge_cache` rounds nothing when it writes
    them back). Per-layer buffers let each step's products read a layer's window in place and write only the
    new slot into it (a slice of the stacked [L, ...] cache would be a copy per layer and step); heads-major
    makes those products plain batched matmuls, and slot-minor keys make q k^T a [G, D] x [D, W] product
    (`decode_attention`, "Layout")."""
    if cache is None:
        return None
    count, dtype = cache.k.shape[0], cache.k.dtype if dtype is None else dtype
    return KVCache(k=tuple(cache.k[i, :, :window].transpose(0, 2, 3, 1).astype(dtype) for i in range(count)),
                   v=tuple(cache.v[i, :, :window].transpose(0, 2, 1, 3).astype(dtype) for i in range(count)),
                   mask=cache.mask[:, :window], index=cache.index)


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
    block = min(block, window)

    def write(j, kv):
        at = jnp.minimum(written_from + j * block, window - block)
        # one update of all layers' block, not one per layer: XLA:CPU copied the whole cache for each of those
        k_new = jnp.stack([jax.lax.dynamic_slice_in_dim(layer, at, block, axis=3).transpose(0, 3, 1, 2)
                           for layer in part.k])
        v_new = jnp.stack([jax.lax.dynamic_slice_in_dim(layer, at, block, axis=2).transpose(0, 2, 1, 3)
                           for layer in part.v])
        return update_slice_in_dim(kv[0], k_new, at, axis=2), update_slice_in_dim(kv[1], v_new, at, axis=2)

    blocks = (part.index - written_from + block - 1) // block
    k, v = jax.lax.fori_loop(0, blocks, write, (full.k, full.v))
    return KVCache(k=k, v=v, mask=jax.lax.dynamic_update_slice_in_dim(full.mask, part.mask, 0, axis=1),
                   index=part.index)


def _decode_layer(config, weights, x, k_window, v_window, visible, index, cos, sin, native_attention, packed):
    """One decoder layer for one token per row: x [B, 1, H], windows k [B, K, D, W], v [B, K, W, D] -> (x,
    windows with slot `index` written). packed: the weights are `layer_weights(..., pack=True)`'s, for the
    skinny-matmul kernel.

    The same maths as `transformer.DecoderLayer` over a cache (projections through `kernels.matmul` with the
    same casts, RMSNorm via the model's module, RoPE, SwiGLU), but attention is `decode_attention` over the
    window plus the token itself, and only the token's slot is written (after the window is read)."""
    dt, eps, N, K, D = config.compute_dtype, config.rms_norm_eps, config.num_heads, config.num_kv_heads, config.head_dim
    attn = weights["attn"]

    def norm(scale_params, h, axis="embed"):
        return transformer.RMSNorm(eps, axis, config.weight_dtype).apply({"params": scale_params}, h)

    def project(name, h, heads):
        if packed:
            y = native.skinny_matmul(h[:, 0].astype(dt), attn[name]["kernel"]).reshape(h.shape[0], 1, heads, D)
        else:
            y = matmul("bth,hnd->btnd", h.astype(dt), attn[name]["kernel"].astype(dt))
        return y + attn[name]["bias"].astype(dt) if config.qkv_bias else y

    h = norm(weights["attn_norm"], x)
    q, k, v = project("q_proj", h, N), project("k_proj", h, K), project("v_proj", h, K)  # [B, 1, N | K, D]
    if config.qk_norm:
        q, k = norm(attn["q_norm"], q, "head_dim"), norm(attn["k_norm"], k, "head_dim")
    q, k = transformer.apply_rope(q, cos, sin), transformer.apply_rope(k, cos, sin)
    # as stored in the cache (which holds the compute dtype, `init_cache`'s default), then in the window's dtype
    k, v = k.astype(dt).astype(k_window.dtype), v.astype(dt).astype(v_window.dtype)
    out = decode_attention(q[:, 0], k[:, 0], v[:, 0], k_window, v_window, visible, D ** -0.5, native_attention)
    # Then write the slot, with values routed through the attention output (a select on `out > +inf`, false
    # for every number, NaN included: the values are k and v). That data dependency is what lets XLA write in
    # place: with none between the window's reads and the write, XLA cannot order them and copies the window
    # for the reads (2-3 copies per layer and step on XLA:CPU, also with an optimization barrier or with the
    # write first). Per row, so a batch-sharded step needs no communication for it.
    never = (out[:, 0, 0] > jnp.inf)[:, None, None, None]
    k_window = update_slice(k_window, jnp.where(never, 0, k.transpose(0, 2, 3, 1)), (0, 0, 0, index))
    v_window = update_slice(v_window, jnp.where(never, 0, v.transpose(0, 2, 1, 3)), (0, 0, index, 0))
    mlp = weights["mlp"]
    if packed:  # swiglu's maths and casts, each product through the kernel
        x = x + native.skinny_matmul(out.reshape(out.shape[0], N * D), attn["o_proj"]["kernel"])[:, None]
        h = norm(weights["mlp_norm"], x).astype(dt)[:, 0]
        gate, up = (native.skinny_matmul(h, mlp[name]["kernel"]) for name in ("gate_proj", "up_proj"))
        x = x + native.skinny_matmul(jax.nn.silu(gate) * up, mlp["down_proj"]["kernel"])[:, None]
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

    `cache` is `split_cache`'s per-layer form (L heads-major buffers, k [B, K, D, W], v [B, K, W, D]) and `weights` is
    `layer_weights`' per-layer list, both made once per decode launch. The layers run unrolled (whatever
    config.scan_layers says: that switch is for the full forward; SmolLM2's 30 compile in ~12-16 s here):
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


def decode_forward_stacked(params, model, token, position, running, cache: KVCache):
    """`decode_forward` for accelerators (`per_layer_decode`): the model's own layers scanned over the stacked
    parameters, the stacked [L, B, W, K, D] cache a loop carry of which each layer writes only its new slot
    (in place), attention over the layer's window with the new token written first (`transformer.Attention`)."""
    config = model.config
    index = cache.index
    x = transformer.Embedding(config).apply({"params": params["embed"]}, token[:, None])  # [B, 1, H]
    cos, sin = transformer.rope_cos_sin(position[:, None], config)
    slot_mask = jax.lax.dynamic_update_slice_in_dim(cache.mask, running[:, None], index, axis=1)
    attn_mask = transformer.attention_mask(running[:, None], slot_mask, index)
    layer = transformer.DecoderLayer(config)

    def body(carry, layer_params_and_index):
        x, k_all, v_all = carry
        layer_params, i = layer_params_and_index
        layer_cache = (jax.lax.dynamic_index_in_dim(k_all, i, 0, keepdims=False),
                       jax.lax.dynamic_index_in_dim(v_all, i, 0, keepdims=False))
        x, (k_layer, v_layer) = layer.apply({"params": layer_params}, x, layer_cache, cos, sin, attn_mask, index)
        start = (i, 0, index, 0, 0)
        k_all = jax.lax.dynamic_update_slice(k_all, jax.lax.dynamic_slice_in_dim(k_layer, index, 1, 1)[None], start)
        v_all = jax.lax.dynamic_update_slice(v_all, jax.lax.dynamic_slice_in_dim(v_layer, index, 1, 1)[None], start)
        return (x, k_all, v_all), None

    layer_ids = jnp.arange(config.num_layers, dtype=jnp.int32)
    (x, k_all, v_all), _ = jax.lax.scan(body, (x, cache.k, cache.v), (params["layers"], layer_ids),
                                        unroll=1 if config.scan_layers else config.num_layers)
    hidden = transformer.RMSNorm(config.rms_norm_eps, "embed", config.weight_dtype).apply(
        {"params": params["final_norm"]}, x)
    head = lm_head_weight(params, config).astype(config.compute_dtype)
    logits = matmul("bh,hv->bv", hidden[:, -1].astype(config.compute_dtype), head, jnp.float32)
    return logits, KVCache(k=k_all, v=v_all, mask=slot_mask, index=index + 1)


def window_cache(cache: Optional[KVCache], window: int) -> Optional[KVCache]:
    """The first `window` slots of the stacked cache (a copy, once per decode launch; accelerators)."""
    if cache is None or window >= cache.mask.shape[1]:
        return cache
    return KVCache(k=cache.k[:, :, :window], v=cache.v[:, :, :window], mask=cache.mask[:, :window],
                   index=cache.index)


def unwindow_cache(full: Optional[KVCache], part: Optional[KVCache]) -> Optional[KVCache]:
    """Write a windowed stacked cache back over the first slots of the full one (in place: it is donated)."""
    if full is None or part.mask.shape[1] == full.mask.shape[1]:
        return part
    return KVCache(k=update_slice_in_dim(full.k, part.k, 0, axis=2), v=update_slice_in_dim(full.v, part.v, 0, axis=2),
                   mask=jax.lax.dynamic_update_slice_in_dim(full.mask, part.mask, 0, axis=1), index=part.index)


@functools.partial(jax.jit, static_argnames=("model", "logits_fn", "cache_len", "mesh", "rules", "logits_processor",
                                             "window"))
def prefill(params, prompt_ids, prompt_mask, tokens, lengths, done, row_keys, *, model, logits_fn,
             cache_len, mesh, rules, logits_processor=None, window=None) -> SamplerState:
    """prompt_ids/prompt_mask [B, P] left-padded; tokens [B, S] the same prompts left-aligned. The prompts
    attend over the cache's first `window` slots (>= P; None: all of them), as `append_block`'s blocks do."""
    batch = prompt_ids.shape[0]
    full = init_cache(model.config, batch, cache_len) if model is not None else None
    logits, cache = next_logits(params, model, logits_fn, prompt_ids, positions_from_mask(prompt_mask),
                                 prompt_mask, window_cache(full, window or cache_len), tokens, lengths,
                                 logits_processor)
    cache = unwindow_cache(full, cache)
    zeros = jnp.zeros((batch,), jnp.int32)
    state = SamplerState(cache=cache, tokens=tokens, lengths=lengths,
                         logprobs=jnp.zeros(tokens.shape, jnp.float32), next_logits=logits, done=done,
                         stop_reason=jnp.where(done, LENGTH, RUNNING).astype(jnp.int32), stop_state=zeros,
                         turn_start=lengths, step=jnp.zeros((), jnp.int32), row_keys=row_keys)
    return constrain_state(state, mesh, rules)


@functools.partial(jax.jit, static_argnames=("model", "logits_fn", "mode", "eos_token_ids", "window", "mesh",
                                             "rules", "logits_processor"), donate_argnames=("state",))
def decode_loop(params, state: SamplerState, budget, segment, first, temperature, top_p, stop_next_state, stop_match,
                *, model, logits_fn, mode, eos_token_ids, window, mesh, rules, logits_processor=None) -> SamplerState:
    """One launch of a decode call: sample until every row has stopped or `segment` steps ran. One step =
    sample a token for each running row from next_logits, advance its stop automaton, write it, and feed it
    to get the next logits. `budget` is the steps the call has left (a row reaching it stops, "length"); a
    row still running after `segment` steps stays running for the call's next launch, and only the first
    launch (`first`) starts a new turn (turn_start, the stop automaton). `state.step` counts this launch's
    steps. The loop runs on the cache's first `window` slots (`generation.decode_segments`; the host
    guarantees the launch stays inside): on a CPU as per-layer copies with per-layer weights (`split_cache`,
    `layer_weights`, `decode_forward`), on TPU and GPU on the stacked cache and weights
    (`decode_forward_stacked`); `per_layer_decode` says why. Static: model, logits_fn, mode, window
    (recompile); dynamic: budget, segment, first, temperature, top_p, the stop table."""
    batch, width = state.tokens.shape
    rows = jnp.arange(batch)
    eos = jnp.asarray(eos_token_ids if eos_token_ids else (-1,), jnp.int32)
    full_cache = state.cache
    written_from = full_cache.index if full_cache is not None else None  # the launch's first slot
    per_layer = per_layer_decode(mesh)
    packed = model is not None and per_layer and packed_decode(model.config, batch, mesh)
    weights = layer_weights(params, model.config, pack=packed) if model is not None and per_layer else None
    packed_head = packed_lm_head(params, model.config) if packed else None
    cache = split_cache(full_cache, window, CPU_WINDOW_DTYPE) if per_layer else window_cache(full_cache, window)
    state = state.replace(cache=cache, step=jnp.zeros((), jnp.int32),
                          turn_start=jnp.where(first, state.lengths, state.turn_start),
                          stop_state=jnp.where(first, 0, state.stop_state))

    def keep_going(st: SamplerState):
        return (st.step < segment) & ~jnp.all(st.done)

    def step(st: SamplerState) -> SamplerState:
        running = ~st.done
        keys = jax.vmap(jax.random.fold_in)(st.row_keys, st.lengths)
        token, logprob = sampling.sample(st.next_logits, keys, temperature, top_p, mode)
        automaton = stop_next_state[st.stop_state, token]
        reason = jnp.where(jnp.isin(token, eos), EOS,
                           jnp.where(automaton == stop_match, STOP,
                                     jnp.where(st.step + 1 >= budget, LENGTH, RUNNING)))
        slot = jnp.where(running, st.lengths, width)  # out of range -> dropped for stopped rows
        tokens = st.tokens.at[rows, slot].set(token, mode="drop")
        logprobs = st.logprobs.at[rows, slot].set(logprob, mode="drop")
        lengths = st.lengths + running.astype(jnp.int32)
        logits, cache = None, st.cache
        if model is not None:
            if per_layer:
                logits, cache = decode_forward(params, weights, model, token, st.lengths, running, st.cache,
                                               native_attention=one_device(mesh), packed_head=packed_head)
            else:
                logits, cache = decode_forward_stacked(params, model, token, st.lengths, running, st.cache)
        logits = process_logits(logits, logits_fn, logits_processor, tokens, lengths)
        new = st.replace(cache=cache, tokens=tokens, lengths=lengths, logprobs=logprobs,
                         next_logits=jnp.where(running[:, None], logits, st.next_logits),
                         done=st.done | (running & (reason != RUNNING)),
                         stop_reason=jnp.where(running, reason, st.stop_reason).astype(jnp.int32),
                         stop_state=jnp.where(running, automaton, st.stop_state), step=st.step + 1)
        return constrain_state(new, mesh, rules)

    state = jax.lax.while_loop(keep_going, step, constrain_state(state, mesh, rules))
    merged = (merge_cache(full_cache, state.cache, written_from) if per_layer
              else unwindow_cache(full_cache, state.cache))
    return constrain_state(state.replace(cache=merged), mesh, rules)


@functools.partial(jax.jit, static_argnames=("model", "logits_fn", "mesh", "rules", "logits_processor", "window"),
                   donate_argnames=("state",))
def append_block(params, state: SamplerState, block_ids, block_lengths, *, model, logits_fn, mesh,
            rules, logits_processor=None, window=None) -> SamplerState:
    """block_ids [B, A] with row b's block_lengths[b] new tokens right-aligned (left padding masked).

    The block attends over the cache's first `window` slots (`decode_window` of the slots used after it; None:
    all S), sliced out and written back once: slots past them are empty, so the result is the same, but the
    block's [B, N, A, S] attention logits over the whole cache made an append's cost grow with the cache, not
    the text (a 512-token observation for 4 rows of SmolLM2 in f32: 4.6 s into 768 slots, 17.1 s into 6,144)."""
    batch, width = state.tokens.shape
    block = block_ids.shape[1]
    column = jnp.arange(block)[None, :]
    first = block - block_lengths[:, None]  # first real column of each row
    mask = column >= first
    positions = state.lengths[:, None] + jnp.maximum(column - first, 0)
    slot = jnp.where(mask, positions, width)
    rows = jnp.arange(batch)[:, None]
    tokens = state.tokens.at[rows, slot].set(block_ids, mode="drop")
    logprobs = state.logprobs.at[rows, slot].set(0.0, mode="drop")
    lengths = state.lengths + block_lengths
    logits, cache = next_logits(params, model, logits_fn, block_ids, positions, mask,
                                window_cache(state.cache, window or width), tokens, lengths, logits_processor)
    cache = unwindow_cache(state.cache, cache)
    resumed = block_lengths > 0
    new = state.replace(cache=cache, tokens=tokens, logprobs=logprobs, lengths=lengths,
                        next_logits=jnp.where(resumed[:, None], logits, state.next_logits),
                        done=state.done & ~resumed, stop_reason=jnp.where(resumed, RUNNING, state.stop_reason))
    return constrain_state(new, mesh, rules)

"""Layers with hand-written backward passes: what autodiff plus XLA compile poorly, written once.

Each is a pure function over arrays (the modules in transformer.py own the parameters) whose forward is the
plain math, so decoding and scoring without gradients run exactly the textbook computation; only the VJP
differs from what `jax.grad` would derive. Tests compare values and gradients against the autodiff versions
(tests/models/test_transformer_options.py) and the whole model's gradients against torch autograd
(tests/models/test_model_parity.py).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp


MIN_LOW_PRECISION_ROWS = 4  # the fewest rows XLA:CPU sends to its bf16 GEMM (1 row: converted to f32 instead)


def matmul(equation: str, x: jax.Array, w: jax.Array, out_dtype=None) -> jax.Array:
    """einsum(equation, x, w) accumulated in float32 and returned in out_dtype (default: x's dtype).

    Why every product goes through here: XLA:CPU sends a bfloat16 x bfloat16 -> float32 dot to its fast
    low-precision GEMM (AMX / AVX-512 BF16: 1.04 TFLOP/s for a 2048^3 product on a 2-core Xeon), but a
    bfloat16 -> bfloat16 dot to a generic loop (0.19 TFLOP/s there, slower than its float32 GEMM at 0.21).
    Asking for float32 accumulation is also what the maths wants (torch's bf16 GEMMs accumulate in float32
    too) and is free on TPU and GPU, whose matrix units accumulate in float32 anyway. For float32 inputs
    this is the plain einsum.

    Low-precision inputs get a VJP of their own (`_low_precision_matmul`): autodiff would carry the float32
    cotangent of the float32 accumulation into the backward products, float32 x bfloat16 dots that XLA runs
    as float32 GEMMs after converting the weights. The backward here casts the cotangent to the inputs' dtype
    first, as torch.autocast's backward does (its bf16 products return bf16, so their gradients arrive in
    bf16), and both backward products take the fast path.
    """
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if x.dtype == jnp.float32 or x.dtype != w.dtype:
        return jnp.einsum(equation, x, w, preferred_element_type=jnp.float32).astype(out_dtype)
    inputs, output = equation.split("->")
    x_axes, w_axes = inputs.split(",")
    rows = math.prod(n for axis, n in zip(x_axes, x.shape) if axis not in w_axes)  # x's free (row) axes
    if rows < MIN_LOW_PRECISION_ROWS and x_axes[0] not in w_axes and output.startswith(x_axes[0]):
        # A bf16 matrix-vector product (one decode row) is not XLA:CPU's GEMM: it converts the whole weight to
        # float32 first (hoisted out of the layer loop, every stacked weight, every step). Padding the rows to
        # MIN_LOW_PRECISION_ROWS keeps it a GEMM that reads the bf16 weight as it is; the extra rows are free in
        # a product bound by reading the weight.
        padded = jnp.pad(x, [(0, MIN_LOW_PRECISION_ROWS - x.shape[0])] + [(0, 0)] * (x.ndim - 1))
        return jnp.einsum(equation, padded, w, preferred_element_type=jnp.float32)[:x.shape[0]].astype(out_dtype)
    return _low_precision_matmul(equation, jnp.dtype(out_dtype), x, w)


def transposed_equations(equation: str) -> tuple[str, str]:
    """The einsums of a product's two input gradients: for O = einsum("X,W->O"), dX = einsum("O,W->X") and
    dW = einsum("X,O->W"). Valid when every axis of each input is in the other input or the output (nothing
    summed within one operand), which `matmul` checks."""
    inputs, out = equation.split("->")
    x_axes, w_axes = inputs.split(",")
    lonely = [a for a in x_axes if a not in w_axes + out] + [a for a in w_axes if a not in x_axes + out]
    if lonely:
        raise ValueError(f"matmul: {equation!r} sums axes {lonely} within one operand; write that sum out first")
    return f"{out},{w_axes}->{x_axes}", f"{x_axes},{out}->{w_axes}"


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _low_precision_matmul(equation, out_dtype, x, w):
    return jnp.einsum(equation, x, w, preferred_element_type=jnp.float32).astype(out_dtype)


def _low_precision_matmul_fwd(equation, out_dtype, x, w):
    transposed_equations(equation)  # fail at trace time, not in the backward pass
    return _low_precision_matmul(equation, out_dtype, x, w), (x, w)


def _low_precision_matmul_bwd(equation, out_dtype, residuals, d_out):
    x, w = residuals
    for_x, for_w = transposed_equations(equation)
    d_out = d_out.astype(x.dtype)  # the bf16 cotangent: both products below are bf16 x bf16 -> f32 GEMMs
    d_x = jnp.einsum(for_x, d_out, w, preferred_element_type=jnp.float32).astype(x.dtype)
    d_w = jnp.einsum(for_w, x, d_out, preferred_element_type=jnp.float32).astype(w.dtype)
    return d_x, d_w


_low_precision_matmul.defvjp(_low_precision_matmul_fwd, _low_precision_matmul_bwd)


def rotate_half(x: jax.Array) -> jax.Array:
    """[a, b] -> [-b, a] over the last axis."""
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


@jax.custom_vjp
def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, T, heads, D]; cos/sin [B, T, D]. Result in x.dtype (tables cast first, as HF does).

    The VJP is RoPE's own form: with rotate_half(z) = [-z_b, z_a], whose transpose is -rotate_half,
        y = x cos + rotate_half(x) sin   =>   dx = dy cos - rotate_half(dy sin),
    one elementwise map over dy. Autodiff's transpose of the concatenate and slices is pads and adds, which
    XLA:CPU fused with the attention's gradient blocks into a loop that evaluated them once per use.
    """
    c, s = _rope_tables(x, cos, sin)
    return x * c + rotate_half(x) * s


def _rope_tables(x, cos, sin):
    """cos/sin [B, T, D] -> [B, T, 1, D] in x's dtype, broadcast over the heads."""
    return cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)


def _apply_rope_fwd(x, cos, sin):
    return apply_rope(x, cos, sin), (x, cos, sin)


def _apply_rope_bwd(residuals, d_y):
    x, cos, sin = residuals
    c, s = _rope_tables(x, cos, sin)
    d_x = d_y * c - rotate_half(d_y * s)
    # the tables' cotangents (positions are integers, so nothing uses them; written for completeness)
    d_cos = jnp.sum((d_y * x).astype(jnp.float32), axis=2).astype(cos.dtype)
    d_sin = jnp.sum((d_y * rotate_half(x)).astype(jnp.float32), axis=2).astype(sin.dtype)
    return d_x, d_cos, d_sin


apply_rope.defvjp(_apply_rope_fwd, _apply_rope_bwd)


def update_slice(operand: jax.Array, update: jax.Array, start_indices) -> jax.Array:
    """`jax.lax.dynamic_update_slice(operand, update.astype(operand.dtype), start_indices)`, in place for 16-bit
    floats too. XLA:CPU (jax 0.10.2) has no bfloat16 dynamic-update-slice: it converts the whole operand to
    float32, updates it and converts it back, i.e. a KV cache written one slot per layer and decode step was
    read and written twice over in float32 per write (per decode call, merging the 30 layers' windows back into
    a 6,144-slot cache of 8 rows took ~23 s). The update is a bit copy, so on the 16-bit integers of the same
    bits it is the same result with no conversion."""
    update = update.astype(operand.dtype)
    if not _is_16_bit_float(operand.dtype):
        return jax.lax.dynamic_update_slice(operand, update, start_indices)
    as_bits = lambda x: jax.lax.bitcast_convert_type(x, jnp.uint16)  # noqa: E731
    out = jax.lax.dynamic_update_slice(as_bits(operand), as_bits(update), start_indices)
    return jax.lax.bitcast_convert_type(out, operand.dtype)


def _is_16_bit_float(dtype) -> bool:
    return jnp.dtype(dtype).itemsize == 2 and jnp.issubdtype(dtype, jnp.floating)


def with_scan_bits(stacked):
    """Each 16-bit float leaf w of a layer-stacked tree -> (w's bits as uint16, w), for a scan over layers; the
    scanned slice goes back through `from_scan_bits`. XLA:CPU (jax 0.10.2) has no bfloat16 dynamic-slice either
    (see `update_slice`): a scan over stacked bf16 weights converted every stacked weight to float32, once per
    call outside the loop (hoisted as loop-invariant), and each layer's slice back to bf16 inside it: a bf16
    scoring pass of SmolLM2-135M at 8 x 256 ran 5 % faster without them (10 % under glibc's default allocator,
    where the copies were fresh memory each call). On the bits the slice is a plain copy. The weight itself rides
    along for differentiation only: forward-only programs drop its slice as dead code."""
    return jax.tree.map(lambda w: (jax.lax.bitcast_convert_type(w, jnp.uint16), w)
                        if isinstance(w, jax.Array) and _is_16_bit_float(w.dtype) else w, stacked)


def from_scan_bits(layer):
    """The inverse of `with_scan_bits` on one layer's slice: each (bits, w) pair -> w from its bits."""
    return jax.tree.map(lambda leaf: _from_bits(*leaf) if isinstance(leaf, tuple) else leaf, layer,
                        is_leaf=lambda leaf: isinstance(leaf, tuple))


@jax.custom_jvp
def _from_bits(bits: jax.Array, weight: jax.Array) -> jax.Array:
    """`weight`, read from its bits; its tangent is weight's (integers carry none), so gradients reach the
    stacked weights as scan outputs, as without the bits."""
    return jax.lax.bitcast_convert_type(bits, weight.dtype)


@_from_bits.defjvp
def _from_bits_jvp(primals, tangents):
    return _from_bits(*primals), tangents[1]


def update_slice_in_dim(operand: jax.Array, update: jax.Array, index, axis: int) -> jax.Array:
    """`update_slice` at `index` along `axis` (0 elsewhere), as `jax.lax.dynamic_update_slice_in_dim`."""
    starts = [jnp.zeros((), jnp.int32)] * operand.ndim
    starts[axis] = jnp.asarray(index, jnp.int32)
    return update_slice(operand, update, tuple(starts))


def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float, *,
                      causal_blocks: int = 1, query_block: int = 0) -> jax.Array:
    """softmax(scale * q k^T, masked) v with K key/value heads shared by groups of G = N / K query heads.

    q [B, T, N, D]; k, v [B, S, K, D]; mask [B, 1, T, S] bool (every query must see at least one slot).
    Query head n uses key/value head n // G (HF's repeat_kv order). Logits and softmax in float32, the
    probabilities cast to v's dtype for the second product (as jax.nn.dot_product_attention does).

    Why not jax.nn.dot_product_attention: its XLA path maps the group axis with vmap, which leaves XLA:CPU
    transposing the [B, N, T, S] logits around every product, and autodiff keeps every layer's [B, N, T, S]
    probabilities for the backward pass (0.57 GB per 2 x 512-token micro-batch of SmolLM2, zero-filled
    and written every step). Here both products are plain batched matmuls in the heads-major layout
    [B, K, G, T, D] x [B, K, S, D], and `_attention` saves only the output and the per-query log-sum-exp,
    recomputing the probabilities in the backward pass (the FlashAttention backward of Dao et al. 2022):
        P = exp(scale q k^T - lse),  dV = P^T dO,  dS = P * (dO V^T - rowsum(dO * O)),
        dQ = scale dS K,  dK = scale dS^T Q.
    causal_blocks > 1 (no cache: T == S and the mask hides every slot s > t from query t) splits the queries
    into that many equal blocks and gives block i only the keys [0, (i + 1) T / blocks): the products skip the
    blocks above the diagonal (10 of 16 computed at 4 blocks); the result is the same.
    query_block > 0 runs the queries (of the whole block, or of each causal block) in consecutive blocks of
    that many, one after another (`lax.map`), so that the [B, N, T, S] float32 logits never exist whole: an
    8,192-token observation appended to a 35,840-slot cache would otherwise need 1.1 GB per row and kv head,
    and a causal block of CCS's 37,376-token update 1.4 GB per row and head. The queries it splits must be a
    multiple of query_block; the result is the same.
    """
    B, T, N, D = q.shape
    K = k.shape[2]
    q = q.reshape(B, T, K, N // K, D).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, D]
    k, v, mask = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask[:, :, None]
    if causal_blocks == 1:
        out = _query_blocks(q, k, v, mask, scale, query_block)
    else:
        if T != k.shape[2] or T % causal_blocks:
            raise ValueError(f"grouped_attention: causal_blocks={causal_blocks} needs T == S divisible by it, "
                             f"got T={T}, S={k.shape[2]}")
        size = T // causal_blocks
        keys, values = causal_prefixes(k, causal_blocks), causal_prefixes(v, causal_blocks)
        out = jnp.concatenate([_query_blocks(q_i, keys[i], values[i],
                                             mask[..., i * size:(i + 1) * size, :(i + 1) * size], scale, query_block)
                               for i, q_i in enumerate(split_blocks(q, causal_blocks))], axis=3)
    return out.transpose(0, 3, 1, 2, 4).reshape(B, T, N, D)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def split_blocks(x: jax.Array, blocks: int) -> tuple[jax.Array, ...]:
    """x [B, K, G, T, D] cut along T into `blocks` equal blocks. Its VJP concatenates the blocks' cotangents;
    autodiff's would pad each one to T and sum them, and XLA:CPU fuses that sum of padded blocks with the layout
    transpose and RoPE's backward after it into one loop it runs on one thread, re-evaluating the padded sum for
    each use (5.4 ms per call at 2 x 512 tokens of SmolLM2's 9 query heads: ~1.2 s of a 10 s bf16 update)."""
    size = x.shape[3] // blocks
    return tuple(x[:, :, :, i * size:(i + 1) * size] for i in range(blocks))


split_blocks.defvjp(lambda x, blocks: (split_blocks(x, blocks), None),
                    lambda blocks, _, d_blocks: (jnp.concatenate(d_blocks, axis=3),))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def causal_prefixes(x: jax.Array, blocks: int) -> tuple[jax.Array, ...]:
    """The keys (or values) x [B, K, S, D] that causal block i sees: x[:, :, :(i + 1) S / blocks]. Its VJP
    forms block j of the cotangent as the sum, over the prefixes i >= j that hold it, of their slices for that
    block, then concatenates the blocks: no prefix is padded to S (autodiff's pad-and-add, see split_blocks)."""
    size = x.shape[2] // blocks
    return tuple(x[:, :, :(i + 1) * size] for i in range(blocks))


def _causal_prefixes_bwd(blocks, _, d_prefixes):
    size = d_prefixes[0].shape[2]
    return (jnp.concatenate([sum(d[:, :, j * size:(j + 1) * size] for d in d_prefixes[j:])
                             for j in range(blocks)], axis=2),)


causal_prefixes.defvjp(lambda x, blocks: (causal_prefixes(x, blocks), None), _causal_prefixes_bwd)


def _query_blocks(q, k, v, mask, scale, query_block: int):
    """`_attention` of q [B, K, G, T, D] over k/v [B, K, S, D], in blocks of query_block queries (0: one)."""
    B, K, G, T, D = q.shape
    if not query_block or T <= query_block:
        return _attention(q, k, v, mask, scale)
    if T % query_block:
        raise ValueError(f"grouped_attention: query_block={query_block} must divide the {T} queries it splits")
    n = T // query_block
    blocks_q = q.reshape(B, K, G, n, query_block, D).transpose(3, 0, 1, 2, 4, 5)
    blocks_mask = mask.reshape(*mask.shape[:3], n, query_block, mask.shape[-1]).transpose(3, 0, 1, 2, 4, 5)
    out = jax.lax.map(lambda qm: _attention(qm[0], k, v, qm[1], scale), (blocks_q, blocks_mask))
    return out.transpose(1, 2, 3, 0, 4, 5).reshape(B, K, G, T, D)


def _masked_logits(q, k, mask, scale):
    logits = jnp.einsum("bkgtd,bksd->bkgts", q, k, preferred_element_type=jnp.float32) * scale
    return jnp.where(mask, logits, jnp.float32(-1e30))  # mask [B, 1, 1, T, S]


def _attention_forward(q, k, v, mask, scale):
    """(out [B, K, G, T, D], lse [B, K, G, T, 1]) for q [B, K, G, T, D], k/v [B, K, S, D]."""
    logits = _masked_logits(q, k, mask, scale)
    peak = logits.max(axis=-1, keepdims=True)
    shifted = jnp.exp(logits - peak)
    total = shifted.sum(axis=-1, keepdims=True)
    out = matmul("bkgts,bksd->bkgtd", (shifted / total).astype(v.dtype), v)
    return out, peak + jnp.log(total)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q, k, v, mask, scale):
    return _attention_forward(q, k, v, mask, scale)[0]


def _attention_fwd(q, k, v, mask, scale):
    out, lse = _attention_forward(q, k, v, mask, scale)
    return out, (q, k, v, mask, out, lse)


def _attention_bwd(scale, residuals, d_out):
    q, k, v, mask, out, lse = residuals
    probs = jnp.exp(_masked_logits(q, k, mask, scale) - lse)  # masked slots: exp(-1e30 - lse) = 0
    # The four products take the inputs' dtype with float32 accumulation (bf16 models: XLA:CPU's fast GEMM,
    # as FlashAttention's backward feeds P and dS to its bf16 matmuls); the softmax algebra stays float32.
    dt = q.dtype
    d_out = d_out.astype(dt)
    d_v = matmul("bkgts,bkgtd->bksd", probs.astype(dt), d_out, v.dtype)
    d_probs = matmul("bkgtd,bksd->bkgts", d_out, v, jnp.float32)
    row = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
    d_logits = (probs * (d_probs - row) * scale).astype(dt)
    d_q = matmul("bkgts,bksd->bkgtd", d_logits, k, q.dtype)
    d_k = matmul("bkgts,bkgtd->bksd", d_logits, q, k.dtype)
    return d_q, d_k, d_v, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def silu_times(gate: jax.Array, up: jax.Array) -> jax.Array:
    """silu(gate) * up as transformers computes it in 16-bit floats: silu in float32 from the rounded gate, rounded
    once, then the product in gate's dtype. `jax.nn.silu` on a bf16 array has XLA:CPU round after each of its ops
    (negate, exp, add, divide, multiply): 35 % of the elements of a [2048, 1536] product differed from torch's, and
    the fusion took 4.3 ms against 3.1 (2-core Xeon). In float32 the two are the same."""
    return jax.nn.silu(gate.astype(jnp.float32)).astype(gate.dtype) * up


@jax.custom_vjp
def swiglu(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
    """The SwiGLU MLP (Shazeer 2020), W_down(silu(x W_gate) * x W_up), for x [B, T, H], W_gate/W_up [H, F],
    W_down [F, H], with the backward pass written out:

        g = x W_gate,  u = x W_up,  s = sigmoid(g),  a = g s u,  y = a W_down
        da = dy W_down^T,   dg = da u s (1 + g (1 - s)),   du = da g s
        dW_down = a^T dy,   dW_gate = x^T dg,   dW_up = x^T du,   dx = dg W_gate^T + du W_up^T

    Why by hand: XLA:CPU feeds a weight-gradient matmul the token-major operand it must transpose through the
    elementwise fusion that produces it, and that fusion then runs unvectorised over a strided layout. Autodiff
    of silu(g) * u put the sigmoid's derivative there (about 20 ms of a SmolLM2 layer's 140 ms fwd+bwd at
    2 x 512 tokens). Here dg and du are plain elementwise maps, and dW_down is
    formed as (dy^T a)^T so that the operand transposed is the narrow dy (H wide), not a (F wide, with the
    sigmoid in it). Together about 1.9 s less per 2 x 512-token micro-batch of SmolLM2 (30 layers) than
    autodiff's 6.6 s forward + backward of the layers (probes: 1.36 s from the first two, 0.5 s from the last).
    dg and du meet x in two products rather than one over [dg | du]: the concatenation is written in float32
    and converted (XLA:CPU's bf16 elementwise maps run in float32), which cost more than the wider GEMM gains
    (a layer's forward + backward at 2 x 512 tokens: 33.7 -> 29.8 ms in bf16, 88.8 -> 85.8 ms in float32).
    dx sums its two products in float32. Same residual memory as autodiff's (g and u per token).
    """
    return _swiglu_forward(x, w_gate, w_up, w_down)[0]


def _swiglu_forward(x, w_gate, w_up, w_down):
    gate = matmul("bth,hf->btf", x, w_gate)
    up = matmul("bth,hf->btf", x, w_up)
    return matmul("btf,fh->bth", silu_times(gate, up), w_down), gate, up


def _swiglu_fwd(x, w_gate, w_up, w_down):
    y, gate, up = _swiglu_forward(x, w_gate, w_up, w_down)
    return y, (x, w_gate, w_up, w_down, gate, up)


def _swiglu_bwd(residuals, d_y):
    x, w_gate, w_up, w_down, gate, up = residuals
    # in float32 from the rounded operands, each result rounded once (as the forward's `silu_times`)
    gate32, d_act = gate.astype(jnp.float32), matmul("bth,fh->btf", d_y, w_down)
    sig = jax.nn.sigmoid(gate32)
    silu = (gate32 * sig).astype(gate.dtype)
    act = silu * up
    d_gate = (d_act.astype(jnp.float32) * up.astype(jnp.float32) * sig * (1 + gate32 * (1 - sig))).astype(gate.dtype)
    d_up = d_act * silu
    d_w_down = matmul("bth,btf->hf", d_y, act).T
    d_w_gate = matmul("bth,btf->hf", x, d_gate)
    d_w_up = matmul("bth,btf->hf", x, d_up)
    d_x = matmul("btf,hf->bth", d_gate, w_gate, jnp.float32) + matmul("btf,hf->bth", d_up, w_up, jnp.float32)
    return (d_x.astype(x.dtype), d_w_gate.astype(w_gate.dtype), d_w_up.astype(w_up.dtype),
            d_w_down.astype(w_down.dtype))


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis, in x's dtype: scale * n with n = x r, r = 1 / sqrt(mean(x^2) + eps) computed
    in float32 and rounded to x's dtype before the scale (HF's order). The backward pass written out:

        dn = dy scale,   dx = r (dn - n mean(dn n)),   dscale = sum over every leading axis of dy n

    Why by hand: autodiff sums dscale over the B x T tokens in the compute dtype, which XLA:CPU rewrites for
    bf16 into a windowed tree reduction it runs on one thread (1.7 ms per call at 2 x 512 tokens of SmolLM2,
    61 norms per micro-batch); here it is one product accumulated in float32 (the library's reduction, also
    the more accurate sum).
    """
    return _rms_norm_forward(x, scale, eps)[0]


def _rms_norm_forward(x, scale, eps):
    x32 = x.astype(jnp.float32)
    rsqrt = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    normed = (x32 * rsqrt).astype(x.dtype)
    return scale.astype(x.dtype) * normed, rsqrt


def _rms_norm_fwd(x, scale, eps):
    y, rsqrt = _rms_norm_forward(x, scale, eps)
    return y, (x, scale, rsqrt)


def _rms_norm_bwd(eps, residuals, d_y):
    x, scale, rsqrt = residuals
    normed32 = x.astype(jnp.float32) * rsqrt
    d_normed = (d_y * scale.astype(x.dtype)).astype(jnp.float32)
    d_x = rsqrt * (d_normed - normed32 * jnp.mean(d_normed * normed32, axis=-1, keepdims=True))
    rows = x.size // x.shape[-1]
    d_scale = jnp.einsum("th,th->h", d_y.reshape(rows, -1), normed32.astype(x.dtype).reshape(rows, -1),
                         preferred_element_type=jnp.float32)
    return d_x.astype(x.dtype), d_scale.astype(scale.dtype)


rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)

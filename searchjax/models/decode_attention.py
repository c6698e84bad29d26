"""Attention of one new token per row over a read-only cache window plus itself, for the decode step.

The full forward (`transformer.Attention` with a cache) first writes the new key/value into the layer's cache
and then attends over all of it. In a decode step that is two full copies of the layer's [B, S, K, D] cache
per layer and token (the write makes a new cache; the softmax reads the written one), which dominated a
long-window step. Here the window's keys/values are only read, the new token's key/value enter as a separate
part, and the caller writes just the one new slot.

Merge. With window logits l_s = scale q.k_s (s visible) and the new token's l_* = scale q.k_*, the softmax over
the union is exact from the two parts with one shared shift m = max(max_s l_s, l_*):

    p_s = exp(l_s - m),  p_* = exp(l_* - m),  Z = sum_s p_s + p_*
    out = sum_s (p_s / Z) v_s + (p_* / Z) v_*

i.e. the log-sum-exp combination of the window's softmax and the one-slot softmax (lse = m + log Z). Logits,
the shift and Z are float32; the normalised probabilities are cast to the compute dtype before the product
with V, as `kernels.grouped_attention` does, so bfloat16 rounds the same way the full forward does.

Layout. The window comes heads-major, keys [B, K, D, W] (slot-minor) and values [B, K, W, D]
(`cpu_decode.split_cache` transposes them once per decode call), so both products are plain batched matmuls
over (B, K) that XLA runs on the window in place: logits [B, K, G, W] = q [B, K, G, D] x keys [B, K, D, W],
out = P [B, K, G, W] x values [B, K, W, D]. Slot-minor keys make the first a [G, D] x [D, W] product: with keys
[B, K, W, D] (q k^T against a slot-major operand) XLA:CPU read the window at 4.4 GB/s in float32 and 3.3 in
bfloat16, slot-minor at 7.2 and 4.0 (30 layers, batch 8, 2,048 slots, 2 cores of a Xeon). Query head n uses
key/value head n // G (HF's repeat_kv order). On the cache's own [B, W, K, D] layout a product batched over
(B, K) needs that transpose per layer and step (a copy of the window); the alternative of one [B, W, K * D]
product against block-diagonal queries avoids it but does K times the multiply-adds, which made it compute
bound here (SmolLM2, K = 3: 30 layers at batch 8 and 2,048 slots took 150-180 ms in float32 and 340 ms in
bfloat16 against 125-150 ms heads-major).

On a CPU the same maths runs as a hand-written kernel (`native.decode_attention_target`, C++ in
`native/decode_attention.cc`) when the caller asks (`native=True`, which `decode_steps` does for a step on one
CPU device) and the kernel is built: XLA:CPU's two skinny products read a float32 window at 9 GB/s, the
kernel streams it at 18-20 GB/s (30 layers at batch 8 over 2,048 slots: 80-83 ms as products, 37-41 ms as the
kernel, 2-core AMD EPYC with AVX2; `docs/performance.md`, "CPU kernels for the decode step"). It computes the
same softmax with one shared shift, in float32, with the probabilities rounded to the compute dtype before the
product with V as here; only the order of float32 sums and its exp polynomial (relative error < 3e-7) differ.
It reads the values in blocks of columns, [B, K, D / CB, W, CB] (`block_values`), which `split_cache` makes
for a step that runs it; a bf16 window on a CPU with AVX-512 BF16 holds its keys in pairs of head dims and its
values in pairs of slots (`KEY_PAIRS`, `pairs_values`), and both products run as bf16 pair dot products.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from searchjax.models import native as native_kernels
from searchjax.models.kernels import matmul


VALUE_BLOCK = 16  # value columns per block in the kernel's value layout (`block_values`)


def value_block(head_dim: int) -> int:
    """Columns per block of `block_values`' layout: VALUE_BLOCK when head_dim is a multiple of twice it (the
    kernel reads two blocks per pass), else 8."""
    return VALUE_BLOCK if head_dim % (2 * VALUE_BLOCK) == 0 else 8


def block_values(v: jax.Array, block: Optional[int] = None, pairs: bool = False) -> jax.Array:
    """Values [B, K, W, D] -> [B, K, D / CB, W, CB] (CB = block, default `value_block(D)`): the kernel's
    layout, each block of CB columns over all the slots one contiguous stretch, so each of the kernel's P V
    passes (two blocks, the 32 columns its registers hold) reads two sequential streams. Over [W, D] rows each
    pass read CB of every D columns, and the values streamed at ~18 GB/s against the keys' ~33 (30 layers,
    batch 8, 2,048 slots: 36.5 -> 30.9 ms with one block of 32 per pass); two blocks of 16 per pass read them at
    ~30 GB/s where one block of 32 read ~25 (`docs/performance.md`, "Several streams per thread").

    pairs: [B, K, D / CB, W / 2, CB, 2], each column's values of slots 2j and 2j + 1 side by side (`pairs_values`:
    a bf16 window's bits, what one vdpbf16ps lane multiplies by those slots' probability pair)."""
    B, K, W, D = v.shape
    block = block or value_block(D)
    if pairs:
        return v.reshape(B, K, W // 2, 2, D // block, block).transpose(0, 1, 4, 2, 5, 3)
    return v.reshape(B, K, W, D // block, block).transpose(0, 1, 3, 2, 4)


def unblock_values(v: jax.Array) -> jax.Array:
    """`block_values`' inverse: [B, K, D / CB, W, CB] or [B, K, D / CB, W / 2, CB, 2] -> [B, K, W, D]."""
    if v.ndim == 6:
        B, K, blocks, half, block, _ = v.shape
        return v.transpose(0, 1, 3, 5, 2, 4).reshape(B, K, 2 * half, blocks * block)
    B, K, blocks, W, block = v.shape
    return v.transpose(0, 1, 3, 2, 4).reshape(B, K, W, blocks * block)


# A window may hold a bf16 cache's values as their bits (`cpu_decode.window_layout` makes them so for the kernel,
# which reads them as the bf16 they are). XLA:CPU writes a 16-bit float slot through a bit cast to uint16
# (`kernels.update_slice`), and inside the decode loop the casts around each write copied the whole window (30
# layers' bf16 windows at batch 8 x 2,048 slots, one slot written per step: 5.6 ms a step against 0.2 with uint16
# windows in the loop's carry).
WINDOW_BITS = jnp.uint16


def to_window(x: jax.Array, window_dtype) -> jax.Array:
    """Keys/values in the cache's dtype -> a window's storage: `WINDOW_BITS` holds bf16 bits, any other dtype
    the values converted (a wider float holds them exactly)."""
    if jnp.dtype(window_dtype) == WINDOW_BITS:
        return jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), WINDOW_BITS)
    return x.astype(window_dtype)


def from_window(x: jax.Array, dtype) -> jax.Array:
    """`to_window`'s inverse: a window's storage -> values in `dtype`."""
    if x.dtype == WINDOW_BITS:
        x = jax.lax.bitcast_convert_type(x, jnp.bfloat16)
    return x.astype(dtype)


# A bf16 window's keys on a CPU whose kernels multiply bf16 pairs (`native.bf16_pairs`): each uint32 holds the
# bits of two adjacent head dims of one slot (dim 2i in the low half), what one vdpbf16ps lane multiplies by q's
# pair (q[2i], q[2i + 1]), in blocks of KEY_BLOCK slots: [B, K, W / 16, D / 2, 16], each block's D / 2 rows of 16
# slots' pairs contiguous (2 KB at D = 64). The kernel's q k^T then reads the keys without widening them to f32
# (bound by those instructions, a bf16 window's attention read it at ~17 GB/s where an f32 one reads ~28) and in
# one pass: a block's whole dot products stay in registers, one sequential stream per (row, kv head). As rows
# [B, K, D / 2, W] the same sums took four passes of eight rows, each reading and writing the logits: 30 layers
# of decode attention at batch 8 over 2,000 of 2,048 slots took 14.9 ms as rows and 12.8 blocked (medians of
# eight alternated runs on a 2-core AMD EPYC with AVX-512 BF16; `docs/performance.md`, "Keys in blocks of 16
# slots"). A slot's write stays one dynamic-update-slice, [B, K, 1, D / 2, 1] (`key_slot`).
KEY_PAIRS = jnp.uint32
KEY_BLOCK = 16  # slots per block of a `KEY_PAIRS` window


# With `KEY_PAIRS` keys and 16-column value blocks, a bf16 window's values are paired too, along slots:
# `block_values(..., pairs=True)`, [B, K, D / 16, W / 2, 16, 2] bits, so P V runs as bf16 pair products as well
# (each lane: one column's values of two slots times their two probabilities, rounded to bf16 as the jnp form
# rounds them; the products are exact in f32, so only the order of f32 sums differs). A slot's write is a
# [B, K, D / 16, 1, 16, 1] dynamic-update-slice, every other bf16 in place (`cpu_decode._decode_layer`).
VALUE_PAIR_BLOCK = 16


def pairs_values(key_dtype, block: Optional[int]) -> bool:
    """Whether a window with keys of `key_dtype` and values in blocks of `block` columns holds its values in slot
    pairs (`VALUE_PAIR_BLOCK`)."""
    return key_dtype is not None and jnp.dtype(key_dtype) == KEY_PAIRS and block == VALUE_PAIR_BLOCK


def key_window_dtype(window_dtype, head_dim: int, slots: int):
    """The key window's storage for a window of `window_dtype` and `slots` slots: `KEY_PAIRS` for bf16 bits
    (`WINDOW_BITS`) where the kernels multiply bf16 pairs, head_dim is even and the slots fill whole
    `KEY_BLOCK`s, else `window_dtype` itself."""
    if (window_dtype is not None and jnp.dtype(window_dtype) == WINDOW_BITS and head_dim % 2 == 0
            and slots % KEY_BLOCK == 0 and native_kernels.bf16_pairs()):
        return KEY_PAIRS
    return window_dtype


def window_slots(k_window: jax.Array) -> int:
    """W of a key window: [B, K, D, W], or `KEY_PAIRS`' [B, K, W / KEY_BLOCK, D / 2, KEY_BLOCK]."""
    return k_window.shape[2] * KEY_BLOCK if k_window.dtype == KEY_PAIRS else k_window.shape[3]


def _pair_rows(keys: jax.Array) -> jax.Array:
    """Keys [..., D, W] in bf16 (or its bits) -> [..., D / 2, W] uint32, dims 2i and 2i + 1 of a slot in one word."""
    *lead, D, W = keys.shape
    halves = to_window(keys, WINDOW_BITS).reshape(*lead, D // 2, 2, W).swapaxes(-1, -2)  # [..., D / 2, W, 2]
    return jax.lax.bitcast_convert_type(halves, KEY_PAIRS)


def to_key_window(keys: jax.Array, window_dtype) -> jax.Array:
    """Keys [..., D, W] (slot-minor) in the cache's dtype -> the key window's storage: `KEY_PAIRS`
    [..., W / KEY_BLOCK, D / 2, KEY_BLOCK], else `to_window`'s."""
    if jnp.dtype(window_dtype) != KEY_PAIRS:
        return to_window(keys, window_dtype)
    *lead, D, W = keys.shape
    return _pair_rows(keys).reshape(*lead, D // 2, W // KEY_BLOCK, KEY_BLOCK).swapaxes(-3, -2)


def from_key_window(x: jax.Array, dtype) -> jax.Array:
    """`to_key_window`'s inverse: the key window's storage -> keys [..., D, W] in `dtype`."""
    if x.dtype == KEY_PAIRS:
        *lead, blocks, half, _ = x.shape
        rows = x.swapaxes(-3, -2).reshape(*lead, half, blocks * KEY_BLOCK)
        halves = jax.lax.bitcast_convert_type(rows, WINDOW_BITS)  # [..., D / 2, W, 2]
        x = halves.swapaxes(-1, -2).reshape(*lead, 2 * half, blocks * KEY_BLOCK)
    return from_window(x, dtype)


def key_slot(k: jax.Array, window_dtype, index) -> tuple:
    """The token's key k [B, K, D] in the key window's form, and where a dynamic-update-slice writes it for slot
    `index`: (slot [B, K, D, 1], (0, 0, 0, index)), or for `KEY_PAIRS` (slot [B, K, 1, D / 2, 1], (0, 0, index //
    KEY_BLOCK, 0, index % KEY_BLOCK))."""
    if jnp.dtype(window_dtype) != KEY_PAIRS:
        return to_window(k[..., None], window_dtype), (0, 0, 0, index)
    B, K, D = k.shape
    return _pair_rows(k[..., None]).reshape(B, K, 1, D // 2, 1), (0, 0, index // KEY_BLOCK, 0, index % KEY_BLOCK)


def key_window_part(k_window: jax.Array, at, count: int) -> jax.Array:
    """Slots [at, at + count) of a key window, in its own form (for `KEY_PAIRS`, at and count multiples of
    KEY_BLOCK)."""
    if k_window.dtype == KEY_PAIRS:
        return jax.lax.dynamic_slice_in_dim(k_window, at // KEY_BLOCK, count // KEY_BLOCK, axis=2)
    return jax.lax.dynamic_slice_in_dim(k_window, at, count, axis=3)


def kernel_runs(dtype, window_dtype, num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether `decode_attention(..., native=True)` runs the CPU kernel for these: a compute dtype of f32 or bf16,
    a window of f32, bf16 or bf16 bits (`WINDOW_BITS`, its keys possibly `KEY_PAIRS`), head_dim a multiple of 8,
    at most 8 query heads per kv head, and the kernel built here (the window's slots must be a multiple of 8 too:
    decode windows are multiples of 16)."""
    kernel_dtypes = (jnp.float32, jnp.bfloat16)
    return bool(jnp.dtype(dtype) in kernel_dtypes
                and jnp.dtype(window_dtype) in (*kernel_dtypes, WINDOW_BITS, KEY_PAIRS)
                and head_dim % 8 == 0 and num_heads // num_kv_heads <= 8 and native_kernels.decode_attention_target())


def decode_attention(q: jax.Array, k_new: jax.Array, v_new: jax.Array, k_window: jax.Array,
                     v_window: jax.Array, visible: jax.Array, scale: float, native: bool = False) -> jax.Array:
    """softmax(scale q [k_window; k_new]^T) [v_window; v_new] for one query per row, merged exactly (above).

    q [B, N, D]; k_new, v_new [B, K, D] (the token's own key/value, always visible); k_window [B, K, D, W] and
    v_window [B, K, W, D] heads-major, or [B, K, D / CB, W, CB] (`block_values`, the kernel's layout; in slot
    pairs [B, K, D / 16, W / 2, 16, 2] with `KEY_PAIRS` keys), read
    only, in q's dtype or a wider one holding q's dtype's values, or bf16 bits (`WINDOW_BITS`; the keys then
    possibly as `KEY_PAIRS`, [B, K, W / 16, D / 2, 16]); visible [B, W]
    bool (window slot s is attended iff visible[b, s]). native: run the CPU kernel where it is built and takes
    the shapes (`kernel_runs`); the caller says the step runs on one CPU device. A window in the other form's
    layout is converted (a copy: `cpu_decode.split_cache` makes the layout the step's form reads). Returns
    [B, N, D] in q's dtype.
    """
    B, N, D = q.shape
    K, W = k_window.shape[1], window_slots(k_window)
    G = N // K
    dt = q.dtype
    paired = k_window.dtype == KEY_PAIRS
    value_pairs = dt == jnp.bfloat16 and pairs_values(k_window.dtype, value_block(D))  # the kernel's forms
    if (native and v_window.dtype == (WINDOW_BITS if paired else k_window.dtype) and W % 8 == 0
            and kernel_runs(dt, k_window.dtype, N, K, D) and (paired or v_window.ndim < 6)):
        f32 = jnp.float32
        values = v_window
        if values.ndim != (6 if value_pairs else 5):  # another layout: a copy
            values = block_values(unblock_values(values) if values.ndim > 4 else values, pairs=value_pairs)
        out = jax.ffi.ffi_call(native_kernels.DECODE_ATTENTION_TARGET, jax.ShapeDtypeStruct((B, K, G, D), f32))(
            q.reshape(B, K, G, D).astype(f32), k_new.astype(dt).astype(f32), v_new.astype(dt).astype(f32),
            k_window, values, visible, scale=np.float32(scale), round_p=bool(dt == jnp.bfloat16))
        return out.astype(dt).reshape(B, N, D)
    if v_window.ndim > 4:
        v_window = unblock_values(v_window)
    if paired:
        k_window = from_key_window(k_window, jnp.bfloat16)
    if k_window.dtype == WINDOW_BITS or v_window.dtype == WINDOW_BITS:
        k_window, v_window = from_window(k_window, jnp.bfloat16), from_window(v_window, jnp.bfloat16)
    # The window's products run in the wider of the two dtypes: a float32 window of a bfloat16 model holds
    # bfloat16 values exactly (`cpu_decode.split_cache`), so q and the probabilities, rounded to dt first,
    # give the products of the compute dtype with float32 accumulation, as the bfloat16 window does.
    wide = jnp.promote_types(dt, k_window.dtype)
    q_groups = q.reshape(B, K, G, D)
    logits = matmul("bkgd,bkds->bkgs", q_groups.astype(wide), k_window.astype(wide), jnp.float32) * scale
    logits = jnp.where(visible[:, None, None, :], logits, jnp.float32(-1e30))  # [B, K, G, W]
    own = jnp.einsum("bkgd,bkd->bkg", q_groups, k_new.astype(dt), preferred_element_type=jnp.float32) * scale
    peak = jnp.maximum(logits.max(axis=-1), own)  # [B, K, G]
    p_window = jnp.exp(logits - peak[..., None])
    p_own = jnp.exp(own - peak)
    total = p_window.sum(axis=-1) + p_own
    window_out = matmul("bkgs,bksd->bkgd", (p_window / total[..., None]).astype(dt).astype(wide),
                        v_window.astype(wide), jnp.float32)
    own_prob = (p_own / total).astype(dt).astype(jnp.float32)[..., None]
    own_out = own_prob * v_new.astype(dt).astype(jnp.float32)[:, :, None, :]
    return (window_out + own_out).astype(dt).reshape(B, N, D)

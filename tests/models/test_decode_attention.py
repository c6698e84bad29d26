"""`decode_attention` (one query per row over a read-only window plus the token, merged by log-sum-exp) against
a numpy softmax over the visible window slots and the token, per row and query head: the jnp form and the CPU
kernel (`native=True`, `searchjax/models/native/decode_attention.cc`), which must be built on this machine."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.models import native
from searchjax.models.decode_attention import (KEY_PAIRS, WINDOW_BITS, block_values, decode_attention,
                                               from_key_window, from_window, key_slot, key_window_dtype,
                                               key_window_part, to_key_window, to_window, unblock_values)

B = 3


def _reference(q, k_new, v_new, k_window, v_window, visible, scale, round_probs=False):
    """Per row and query head n (key/value head n // G): softmax over the visible window slots and the token
    (its normalised weights rounded to bfloat16 first with round_probs, as a bf16 model does)."""
    G = q.shape[1] // k_window.shape[1]
    out = np.zeros(q.shape)
    for b in range(q.shape[0]):
        for n in range(q.shape[1]):
            head = n // G
            keys = np.concatenate([k_window[b, head].T[visible[b]], k_new[b, head][None]])  # [s, D]
            values = np.concatenate([v_window[b, head][visible[b]], v_new[b, head][None]])
            logits = scale * keys @ q[b, n]
            weights = np.exp(logits - logits.max())
            weights = weights / weights.sum()
            if round_probs:
                weights = weights.astype(jnp.bfloat16).astype(np.float64)
            out[b, n] = weights @ values
    return out


def _inputs(seed, K, G, D, W, filled):
    rng = np.random.default_rng(seed)
    shapes = dict(q=(B, K * G, D), k_new=(B, K, D), v_new=(B, K, D), k_window=(B, K, D, W), v_window=(B, K, W, D))
    inputs = {name: 2 * rng.normal(size=shape) for name, shape in shapes.items()}
    visible = np.repeat(np.arange(W)[None] < filled, B, axis=0)
    visible[1, :7] = False  # a left-padded row
    visible[2, filled // 2:] = False  # a row that stopped earlier
    return inputs, visible


def test_the_native_kernel_builds_here_and_is_what_native_calls():
    """CI runs the kernel, not the fallback: it builds on this machine, and native=True lowers to its call."""
    assert native.decode_attention_target() == native.DECODE_ATTENTION_TARGET
    inputs, visible = _inputs(0, 2, 3, 8, 64, 40)
    args = {name: jnp.asarray(value, jnp.float32) for name, value in inputs.items()}
    lowered = {flag: jax.jit(lambda a, flag=flag: decode_attention(**a, visible=jnp.asarray(visible), scale=0.3,
                                                                   native=flag)).lower(args).as_text()
               for flag in (False, True)}
    assert native.DECODE_ATTENTION_TARGET in lowered[True] and native.DECODE_ATTENTION_TARGET not in lowered[False]


# (K, G, D, W): SmolLM2's 3 query heads per kv head on a small window, then with its head dimension (values in
# blocks of 16 columns, read two at a time), then Qwen2.5-0.5B's 7 per kv head with a head dimension that is not
# a multiple of 32 (the kernel's values in blocks of 8 columns), then one per kv head (multi-head attention).
# The bf16 test below has D = 64: blocks of 16, read in pairs.
SHAPES = [(2, 3, 8, 64), (2, 3, 64, 48), (2, 7, 48, 40), (3, 1, 16, 16)]


@pytest.mark.parametrize("form", ["jnp", "native"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "K%d-G%d-D%d-W%d" % s)
@pytest.mark.parametrize("filled", [0, 1, 13, None])
def test_decode_attention_equals_the_softmax_over_window_and_token(form, shape, filled):
    K, G, D, W = shape
    filled = W if filled is None else filled
    inputs, visible = _inputs(filled, K, G, D, W, filled)
    want = _reference(**inputs, visible=visible, scale=0.3)
    got = decode_attention(**{name: jnp.asarray(value, jnp.float32) for name, value in inputs.items()},
                           visible=jnp.asarray(visible), scale=0.3, native=form == "native")
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("window_dtype", [jnp.float32, jnp.bfloat16])
def test_bfloat16_attention_of_the_kernel_equals_the_jnp_form(window_dtype):
    """A bf16 model: q, the token's key/value and the normalised probabilities are rounded to bf16 before the
    products (f32 accumulation), over a bf16 window or an f32 one holding bf16 values; both forms agree to the
    order of float32 sums (all but a few outputs bitwise), and both are the numpy softmax with the same roundings
    to within one bf16 step of each output (half a step is the output's own rounding)."""
    inputs, visible = _inputs(5, 2, 3, 64, 256, 200)
    args = {name: jnp.asarray(value, jnp.bfloat16) for name, value in inputs.items()}
    args["k_window"], args["v_window"] = args["k_window"].astype(window_dtype), args["v_window"].astype(window_dtype)
    got = {flag: np.asarray(decode_attention(**args, visible=jnp.asarray(visible), scale=0.125, native=flag),
                            np.float32) for flag in (False, True)}
    rounded = {name: np.asarray(value, np.float64) for name, value in args.items()}
    want = _reference(**rounded, visible=visible, scale=0.125, round_probs=True)
    step = 2.0 ** (np.floor(np.log2(np.abs(want) + 1e-30)) - 7)  # one bf16 step at each output's magnitude
    for flag in (False, True):
        assert np.all(np.abs(got[flag] - want) <= step), flag
    assert np.mean(got[True] != got[False]) < 0.05
    np.testing.assert_allclose(got[True], got[False], rtol=2 ** -7, atol=1e-6)


def test_a_window_of_bf16_bits_is_the_bf16_window():
    """`WINDOW_BITS` windows (a bf16 cache's bits as uint16, what `cpu_decode.window_layout` gives the kernel)
    round-trip the bf16 values bitwise (`to_window` / `from_window`) and give both forms the results of the bf16
    window bitwise; the bits are not read as integers (the kernel would see values near 1e4, not the keys)."""
    inputs, visible = _inputs(7, 2, 3, 64, 128, 100)
    args = {name: jnp.asarray(value, jnp.bfloat16) for name, value in inputs.items()}
    bits = dict(args, **{name: to_window(args[name], WINDOW_BITS) for name in ("k_window", "v_window")})
    assert bits["k_window"].dtype == WINDOW_BITS
    np.testing.assert_array_equal(np.asarray(from_window(bits["v_window"], jnp.bfloat16), np.float32),
                                  np.asarray(args["v_window"], np.float32))
    for flag in (False, True):
        want, got = (np.asarray(decode_attention(**a, visible=jnp.asarray(visible), scale=0.125, native=flag),
                                np.float32) for a in (args, bits))
        np.testing.assert_array_equal(got, want)
        assert np.abs(want).max() < 20  # the values' attention, not the bit patterns'


def test_keys_paired_by_head_dims_are_the_bf16_window():
    """`KEY_PAIRS` key windows ([B, K, W / 16, D / 2, 16] uint32, dims 2i and 2i + 1 of a slot in one word, 2i low,
    in blocks of 16 slots: what `cpu_decode.split_cache` makes for the kernel where it multiplies bf16 pairs)
    round-trip the bf16 keys bitwise, and a slot's write (`key_slot`) and a part of the window (`key_window_part`)
    are the same keys in that form; the jnp form reads them as the bf16 window (bitwise equal results), the
    kernel's vdpbf16ps q k^T within one bf16 step of the rounded numpy softmax and within the order of f32 sums of
    the unpaired kernel. Values in slot pairs ([B, K, D / 16, W / 2, 16, 2], column c of slots 2j and 2j + 1 side
    by side) give the kernel's P V as pair products too: bitwise what it converts unpaired values to. Where the
    host has no AVX-512 BF16, or the window's slots are not whole blocks of 16, bit windows keep unpaired keys
    (`key_window_dtype`)."""
    inputs, visible = _inputs(9, 2, 3, 64, 128, 100)
    args = {name: jnp.asarray(value, jnp.bfloat16) for name, value in inputs.items()}
    bits = dict(args, **{name: to_window(args[name], WINDOW_BITS) for name in ("k_window", "v_window")})
    pairs = dict(bits, k_window=to_key_window(args["k_window"], KEY_PAIRS))
    assert pairs["k_window"].shape == (B, 2, 8, 32, 16) and pairs["k_window"].dtype == KEY_PAIRS
    words, key_bits = np.asarray(pairs["k_window"]), np.asarray(bits["k_window"])  # [B, K, D, W] bits
    for slot, i in ((0, 0), (37, 5), (127, 31)):  # block slot // 16, row i, lane slot % 16: dims 2i, 2i + 1
        np.testing.assert_array_equal(words[:, :, slot // 16, i, slot % 16] & 0xFFFF, key_bits[:, :, 2 * i, slot])
        np.testing.assert_array_equal(words[:, :, slot // 16, i, slot % 16] >> 16, key_bits[:, :, 2 * i + 1, slot])
    np.testing.assert_array_equal(np.asarray(from_key_window(pairs["k_window"], jnp.bfloat16), np.float32),
                                  np.asarray(args["k_window"], np.float32))
    slot, at = key_slot(args["k_window"][..., 37], KEY_PAIRS, 37)
    written = jax.lax.dynamic_update_slice(jnp.zeros_like(pairs["k_window"]), slot, at)
    np.testing.assert_array_equal(np.asarray(written)[:, :, 2, :, 5], words[:, :, 2, :, 5])
    assert np.count_nonzero(np.asarray(written)) == np.count_nonzero(words[:, :, 2, :, 5])
    np.testing.assert_array_equal(np.asarray(from_key_window(key_window_part(pairs["k_window"], 32, 48),
                                                             jnp.float32)),
                                  np.asarray(args["k_window"][..., 32:80], np.float32))
    assert key_window_dtype(WINDOW_BITS, 64, 128) == (KEY_PAIRS if native.bf16_pairs() else WINDOW_BITS)
    assert key_window_dtype(jnp.float32, 64, 128) == jnp.float32
    assert key_window_dtype(WINDOW_BITS, 63, 128) == key_window_dtype(WINDOW_BITS, 64, 120) == WINDOW_BITS
    attend = lambda a, flag: np.asarray(decode_attention(**a, visible=jnp.asarray(visible), scale=0.125,  # noqa: E731
                                                         native=flag), np.float32)
    np.testing.assert_array_equal(attend(pairs, False), attend(bits, False))
    if native.bf16_pairs():
        got, unpaired = attend(pairs, True), attend(bits, True)
        want = _reference(**{name: np.asarray(value, np.float64) for name, value in args.items()}, visible=visible,
                          scale=0.125, round_probs=True)
        step = 2.0 ** (np.floor(np.log2(np.abs(want) + 1e-30)) - 7)
        assert np.all(np.abs(got - want) <= step)
        np.testing.assert_allclose(got, unpaired, rtol=2 ** -7, atol=1e-6)
        assert np.abs(got).max() < 20
        value_pairs = block_values(bits["v_window"], pairs=True)
        assert value_pairs.shape == (B, 2, 4, 64, 16, 2)
        np.testing.assert_array_equal(np.asarray(value_pairs[:, :, 1, 5]),  # slots 10 and 11, columns 16-31
                                      np.asarray(bits["v_window"][:, :, 10:12, 16:32]).swapaxes(-1, -2))
        np.testing.assert_array_equal(np.asarray(unblock_values(value_pairs)), np.asarray(bits["v_window"]))
        np.testing.assert_array_equal(attend(dict(pairs, v_window=value_pairs), True), got)


@pytest.mark.parametrize("D", [8, 40])
def test_paired_keys_of_any_even_head_dim_in_any_stretch(D):
    """Paired keys in blocks of 16 slots where a block's dot products run in parts of 8 pairs and a last part of
    4 (D = 40: 8 + 8 + 4 pairs; D = 8: one part of 4), with values unpaired (D not a multiple of 32), over
    stretches that start and end mid-block (slots 8-40, 24-88 and 56-80 of 96): the kernel's vdpbf16ps q k^T
    within one bf16 step of the rounded numpy softmax and within the order of f32 sums of the unpaired kernel."""
    inputs, visible = _inputs(13, 2, 3, D, 96, 90)
    visible[:] = False
    visible[0, 8:40], visible[1, 30:85], visible[2, 60:77] = True, True, True
    args = {name: jnp.asarray(value, jnp.bfloat16) for name, value in inputs.items()}
    bits = dict(args, **{name: to_window(args[name], WINDOW_BITS) for name in ("k_window", "v_window")})
    pairs = dict(bits, k_window=to_key_window(args["k_window"], KEY_PAIRS))
    attend = lambda a: np.asarray(decode_attention(**a, visible=jnp.asarray(visible), scale=0.2,  # noqa: E731
                                                   native=True), np.float32)
    got = attend(pairs)
    want = _reference(**{name: np.asarray(value, np.float64) for name, value in args.items()}, visible=visible,
                      scale=0.2, round_probs=True)
    step = 2.0 ** (np.floor(np.log2(np.abs(want) + 1e-30)) - 7)
    assert np.all(np.abs(got - want) <= step)
    np.testing.assert_allclose(got, attend(bits), rtol=2 ** -7, atol=1e-6)


@pytest.mark.parametrize("K, G, D", [(3, 3, 64), (1, 8, 128), (2, 1, 32)])
def test_paired_bf16_windows_on_amx_tiles_are_the_rounded_softmax(K, G, D):
    """Paired keys with values in slot pairs (what a bf16 decode step hands the kernel on a CPU with AVX-512 BF16)
    over a 256-slot window whose stretches start and end off the 32-slot tiles: on a CPU with AMX
    (`native.amx_tiles`) the kernel runs the tiles' interior through TDPBF16PS and the ends through vdpbf16ps.
    Within one bf16 step of the numpy softmax with rounded weights (as the vdpbf16ps form is held above), within
    the order of f32 sums of the jnp form, and NaN keys and values outside each row's stretch are never read.
    Rows: filled to 200, left-padded to 13, stopped at 100, and one of 20 slots inside one 32-slot tile (no
    tile of its own: all by vdpbf16ps)."""
    W = 256
    inputs, visible = _inputs(11, K, G, D, W, 200)
    visible[1, :13] = False
    visible = np.concatenate([visible, np.zeros((1, W), bool)])
    visible[3, 40:60] = True
    inputs = {name: np.concatenate([value, value[:1]]) for name, value in inputs.items()}
    clean = {name: jnp.asarray(value, jnp.bfloat16) for name, value in inputs.items()}  # the jnp form reads all
    for b in range(len(visible)):
        seen = np.flatnonzero(visible[b])
        outside = np.ones(W, bool)
        outside[seen[0] // 8 * 8:-(-(seen[-1] + 1) // 8) * 8] = False
        inputs["k_window"][b][..., outside] = np.nan
        inputs["v_window"][b][:, outside] = np.nan
    args = {name: jnp.asarray(value, jnp.bfloat16) for name, value in inputs.items()}
    bits = dict(args, **{name: to_window(args[name], WINDOW_BITS) for name in ("k_window", "v_window")})
    tiles = dict(bits, k_window=to_key_window(args["k_window"], KEY_PAIRS),
                 v_window=block_values(bits["v_window"], pairs=True))
    attend = lambda a, flag: np.asarray(decode_attention(**a, visible=jnp.asarray(visible), scale=D ** -0.5,  # noqa: E731
                                                         native=flag), np.float64)
    exact = {name: np.asarray(value, np.float64) for name, value in args.items()}
    want = _reference(**exact, visible=visible, scale=D ** -0.5, round_probs=True)
    # a weight's bf16 rounding may go the other way than numpy's (f32 logits): up to 2^-8 of it, so the bound is
    # 2^-7 of sum |w| |v| (with the result's own rounding); one bf16 step of `want` fails where terms cancel
    size = _reference(**dict(exact, v_window=np.abs(exact["v_window"]), v_new=np.abs(exact["v_new"])),
                      visible=visible, scale=D ** -0.5, round_probs=True)
    assert np.isfinite(want).all()
    got = attend(tiles, native.bf16_pairs())
    assert np.isfinite(got).all()
    assert np.all(np.abs(got - want) <= 2.0 ** -7 * size)
    np.testing.assert_allclose(got, attend(clean, False), rtol=2 ** -7, atol=1e-6)
    # against the kernel's vdpbf16ps form of the same key pairs (values unpaired, f32 FMAs in P V)
    keys_only = dict(bits, k_window=tiles["k_window"])
    np.testing.assert_allclose(got, attend(keys_only, native.bf16_pairs()), rtol=2 ** -7, atol=1e-6)


def test_the_blocked_value_layout_gives_the_same_attention_in_both_forms():
    """`block_values` ([B, K, D / 16, W, 16], what `cpu_decode.split_cache` makes for the kernel) and [B, K, W, D]
    are the same values: each form converts the layout it does not read, and the results are bitwise equal."""
    inputs, visible = _inputs(3, 2, 3, 64, 64, 50)
    args = {name: jnp.asarray(value, jnp.float32) for name, value in inputs.items()}
    blocked = dict(args, v_window=block_values(args["v_window"]))
    assert blocked["v_window"].shape == (B, 2, 4, 64, 16)
    np.testing.assert_array_equal(np.asarray(blocked["v_window"][:, :, 1, 5]),  # slot 5, columns 16-31
                                  np.asarray(args["v_window"][:, :, 5, 16:32]))
    np.testing.assert_array_equal(np.asarray(unblock_values(blocked["v_window"])), np.asarray(args["v_window"]))
    for flag in (False, True):
        plain, block = (np.asarray(decode_attention(**a, visible=jnp.asarray(visible), scale=0.3, native=flag))
                        for a in (args, blocked))
        np.testing.assert_array_equal(plain, block)


def test_the_kernel_reads_only_the_stretch_from_the_first_visible_slot_to_the_last():
    """A decode launch's window runs past the slots written so far, and a short prompt's row starts with left
    padding: the kernel skips both ends (whole groups of 8 slots) with their bytes. NaN keys and values there
    leave its result the softmax over the visible slots (read, they would make it NaN: 0 x NaN), while slots
    inside the stretch are still masked one by one."""
    K, G, D, W = 2, 3, 64, 96
    inputs, visible = _inputs(7, K, G, D, W, 70)  # row 2 ends at slot 35
    visible[1, :12] = False  # row 1 starts at slot 12: slots 0-7 are skipped, 8-11 masked
    visible[0, 40] = False  # a hole inside the stretch: masked, not skipped
    for b in range(B):
        seen = np.flatnonzero(visible[b])
        outside = np.ones(W, bool)
        outside[seen[0] // 8 * 8:-(-(seen[-1] + 1) // 8) * 8] = False
        assert outside.any()
        inputs["k_window"][b][..., outside] = np.nan
        inputs["v_window"][b][:, outside] = np.nan
    want = _reference(**inputs, visible=visible, scale=0.3)
    assert np.isfinite(want).all()
    got = decode_attention(**{name: jnp.asarray(value, jnp.float32) for name, value in inputs.items()},
                           visible=jnp.asarray(visible), scale=0.3, native=True)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)

"""The CPU kernels' build and the skinny matmul (`searchjax.models.native`): the product against numpy in float64
for the decode step's row counts and column blocks, in both weight dtypes; the packed layout; the build's cache
and its failure. (Decode attention's kernel: `test_decode_attention.py`; both inside the decode step:
`tests/generation/test_decode_step.py`; the block-attention kernel: `test_block_attention.py`.)"""

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.models import native


def test_pack_columns_puts_each_block_of_columns_in_one_contiguous_stretch():
    w = np.arange(6 * 48, dtype=np.float32).reshape(6, 48)
    packed = np.asarray(native.pack_columns(jnp.asarray(w)))
    assert native.column_block(48) == 24 and packed.shape == (2, 6, 24)
    np.testing.assert_array_equal(packed[1], w[:, 24:])  # block 1 = columns 24..47, row by row
    assert [native.column_block(n) for n in (576, 192, 896, 40, 12)] == [24, 24, 16, 8, None]
    # weights in bf16 row pairs: 512-bit tiles of 48 or 32 columns first
    assert [native.column_block(n, pairs=True) for n in (576, 192, 896, 40, 12)] == [48, 48, 32, 8, None]


def test_bf16_weights_are_packed_in_row_pairs_where_the_build_multiplies_bf16_pairs():
    """On a CPU with AVX-512 BF16 (the build's -march=native gives it vdpbf16ps) a bf16 weight with even K is
    packed as [N / NB, K / 2, NB, 2]; elsewhere, and for odd K or f32, in rows as above. On a CPU with AMX the
    same packed pairs are what the kernel loads as AMX tiles (`native.amx_tiles`; the shapes below run there)."""
    flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    assert native.bf16_pairs() == ("avx512_bf16" in flags)
    # Linux grants AMX's tile state on request from 5.16 (arch_prctl ARCH_REQ_XCOMP_PERM)
    release = tuple(int(part) for part in os.uname().release.split("-")[0].split(".")[:2])
    amx_cpu = "avx512_bf16" in flags and "amx_bf16" in flags and "amx_tile" in flags
    assert native.amx_tiles() == (amx_cpu and release >= (5, 16))
    w = (np.arange(6 * 48) % 256).astype(np.float32).reshape(6, 48)  # integers < 256: exact in bf16
    packed = np.asarray(native.pack_columns(jnp.asarray(w[:, :40], jnp.bfloat16)), np.float32)
    assert packed.shape == (5, 6, 8)  # 40 columns: blocks of 8 either way
    if native.bf16_pairs():
        pairs = packed[1].reshape(3, 8, 2)  # block 1, [K / 2, NB, 2]
        np.testing.assert_array_equal(pairs[:, :, 0], w[0::2, 8:16])
        np.testing.assert_array_equal(pairs[:, :, 1], w[1::2, 8:16])
        wide = np.asarray(native.pack_columns(jnp.asarray(w, jnp.bfloat16)), np.float32)
        assert wide.shape == (1, 6, 48)  # pairs take one block of 48 columns (512-bit tiles)
        np.testing.assert_array_equal(wide[0].reshape(3, 48, 2).transpose(0, 2, 1).reshape(6, 48), w)
    else:
        np.testing.assert_array_equal(packed[1], w[:, 8:16])
    odd = np.asarray(native.pack_columns(jnp.asarray(w[:5], jnp.bfloat16)), np.float32)
    np.testing.assert_array_equal(odd[1], w[:5, 24:])  # odd K: rows, never pairs


# (rows, K, N): a decode step's batches (1-32 rows; 4-row tiles and the 1-3 rows left over, 8-row tiles of bf16
# pairs and 1-7 left over) against blocks of 24, 16 and 8 columns, and of 48 and 32 for bf16 pairs (512-bit
# tiles; 160 columns: 32); K = 43 and 5 leave k steps after the kernel's 8 stretches of K // 8 (all of them at
# 5), and keep bf16 weights in rows (odd K: no pairs); K = 36 leaves pairs after the 8 stretches of the pairs.
# On a CPU with AMX, bf16 pairs in blocks of 32 or 48 columns with K a multiple of 32 run as tiles of up to 16
# rows: (2, 64, 48), (8, 576, 192), (32, 96, 1536) (two groups of 16), (11, 1536, 96), (17, 64, 32) (16 + 1).
SHAPES = [(1, 40, 24), (2, 64, 48), (3, 43, 32), (5, 24, 40), (4, 5, 16), (8, 576, 192), (13, 64, 24),
          (32, 96, 1536), (6, 36, 160), (11, 1536, 96), (17, 64, 32)]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("rows, K, N", SHAPES)
def test_skinny_matmul_equals_the_float64_product(rows, K, N, dtype):
    """f32 accumulation: within float32's sum error of the exact product; bf16 inputs are exact in f32, so only
    the result's rounding to bf16 (half a step) is added."""
    assert native.skinny_matmul_target() == native.SKINNY_MATMUL_TARGET  # built here: CI runs the kernel
    rng = np.random.default_rng(rows * N)
    x, w = (jnp.asarray(rng.standard_normal(shape), dtype) for shape in ((rows, K), (K, N)))
    want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    got = jax.jit(native.skinny_matmul)(x, native.pack_columns(w))
    assert got.dtype == dtype and got.shape == (rows, N)
    bound = 1e-6 * K * np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(w, np.float64))
    if dtype == jnp.bfloat16:
        bound = bound + 2.0 ** (np.floor(np.log2(np.abs(want) + 1e-30)) - 8)
    assert np.all(np.abs(np.asarray(got, np.float64) - want) <= bound)
    f32 = native.skinny_matmul(x, native.pack_columns(w), jnp.float32)  # out_dtype, as kernels.matmul takes it
    assert f32.dtype == jnp.float32


def test_the_build_is_cached_per_source_and_a_failing_compiler_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SEARCHJAX_CACHE", str(tmp_path))
    source = native.SOURCE_DIR / "skinny_matmul.cc"
    built = native._build(source)
    assert built.parent == tmp_path / "native" and built.name.startswith("skinny_matmul-")
    stamp = built.stat().st_mtime_ns
    assert native._build(source) == built and built.stat().st_mtime_ns == stamp  # reused, not rebuilt
    monkeypatch.setenv("CXX", "false")  # a compiler that fails: a new key, a build that raises
    with pytest.raises(RuntimeError, match="false .*skinny_matmul.cc.* failed"):
        native._build(source)
    assert sorted(p.name for p in (tmp_path / "native").iterdir()) == [built.name]  # nothing half-written


def test_kernels_off_means_the_jnp_forms(monkeypatch, caplog):
    monkeypatch.setenv("SEARCHJAX_NATIVE", "0")
    assert native.skinny_matmul_target() is None and native.decode_attention_target() is None
    monkeypatch.setenv("SEARCHJAX_NATIVE", "1")
    assert native.skinny_matmul_target() == native.SKINNY_MATMUL_TARGET
    with caplog.at_level(logging.WARNING):
        assert native._target("searchjax_test_missing", "skinny_matmul.cc", "NoSuchSymbol") is None
    assert "searchjax_test_missing unavailable" in caplog.text

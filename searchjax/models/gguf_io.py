"""GGUF (llama.cpp) checkpoints in: hyperparameters from the metadata, tensors dequantised to float32 under HF names.

llama.cpp's converter permutes the rows of Llama's q and k projections so that RoPE pairs are interleaved
(x_0, x_{D/2}, x_1, ...) instead of HF's halves: per head, W_gguf = W_hf.reshape(2, D/2, in).swapaxes(0, 1). We
invert that here, so the GGUF tensors land in the HF layout and go through the same key table as safetensors.
Every ggml type gguf.quants can dequantise is accepted (F32, F16, Q8_0, Q4_0, Q4_1, K-quants, ...). Only
general.architecture = "llama" (SmolLM2, Llama) is read; other architectures raise (Qwen GGUFs are untested).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Optional

import numpy as np

from searchjax.models.transformer import ModelConfig

# GGUF tensor name -> HF tensor name ("{layer}" is the block index).
_GGUF_TO_HF = (
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
    ("blk.{layer}.attn_norm.weight", "model.layers.{layer}.input_layernorm.weight"),
    ("blk.{layer}.ffn_norm.weight", "model.layers.{layer}.post_attention_layernorm.weight"),
    ("blk.{layer}.attn_q.weight", "model.layers.{layer}.self_attn.q_proj.weight"),
    ("blk.{layer}.attn_k.weight", "model.layers.{layer}.self_attn.k_proj.weight"),
    ("blk.{layer}.attn_v.weight", "model.layers.{layer}.self_attn.v_proj.weight"),
    ("blk.{layer}.attn_output.weight", "model.layers.{layer}.self_attn.o_proj.weight"),
    ("blk.{layer}.ffn_gate.weight", "model.layers.{layer}.mlp.gate_proj.weight"),
    ("blk.{layer}.ffn_up.weight", "model.layers.{layer}.mlp.up_proj.weight"),
    ("blk.{layer}.ffn_down.weight", "model.layers.{layer}.mlp.down_proj.weight"),
)
_RULES = [(re.compile(re.escape(g).replace(re.escape("{layer}"), r"(?P<layer>\d+)") + r"\Z"), h)
          for g, h in _GGUF_TO_HF]
SUPPORTED_GGUF_ARCHITECTURES = ("llama",)


_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
            12: "<f8"}  # GGUF value type -> numpy dtype (8 = string, 9 = array)


@dataclasses.dataclass(frozen=True)
class GGUFTensor:
    name: str
    ggml_type: int
    shape: tuple  # numpy (row-major) order: ggml dims reversed
    data: np.ndarray  # raw bytes [rows, bytes per row] (a view of the memory-mapped file)


def read_gguf_file(path) -> tuple:
    """(metadata dict, {name: GGUFTensor}) from a GGUF v2/v3 file, by its published layout.

    Our own header walk instead of gguf.GGUFReader: the reader builds a numpy view per element of every array
    (100k vocabulary strings and merges), which costs seconds; we parse scalars and numeric arrays, and keep only
    the length of string arrays (the tokenizer is built by transformers from the same file). Tensor bytes stay
    memory-mapped and are dequantised with gguf.quants.
    """
    import gguf
    buffer = np.memmap(path, dtype=np.uint8, mode="r")
    offset = 0

    def take(dtype, count=1):
        nonlocal offset
        dtype = np.dtype(dtype)
        value = np.frombuffer(buffer, dtype=dtype, count=count, offset=offset)
        offset += dtype.itemsize * count
        return value

    def string():
        length = int(take("<u8")[0])
        nonlocal offset
        text = bytes(buffer[offset:offset + length]).decode("utf-8", errors="replace")
        offset += length
        return text

    def value(kind):
        if kind in _SCALARS:
            return take(_SCALARS[kind])[0].item()
        if kind == 8:
            return string()
        if kind == 9:
            item_kind, count = int(take("<u4")[0]), int(take("<u8")[0])
            if item_kind in _SCALARS:
                items = take(_SCALARS[item_kind], count)  # always consumed, kept only when short
                return items.tolist() if count <= 64 else _Skipped(count)
            for _ in range(count):
                value(item_kind)
            return _Skipped(count)
        raise ValueError(f"{path}: unknown GGUF value type {kind} at byte {offset}")

    if bytes(buffer[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (magic {bytes(buffer[:4])!r})")
    offset = 4
    version = int(take("<u4")[0])
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    tensor_count, kv_count = int(take("<u8")[0]), int(take("<u8")[0])
    meta = {}
    for _ in range(kv_count):
        key = string()
        meta[key] = value(int(take("<u4")[0]))
    infos = []
    for _ in range(tensor_count):
        name = string()
        dims = take("<u8", int(take("<u4")[0])).tolist()
        infos.append((name, tuple(reversed(dims)), int(take("<u4")[0]), int(take("<u8")[0])))
    alignment = int(meta.get("general.alignment", 32))
    data_start = -(-offset // alignment) * alignment
    tensors = {}
    for name, shape, ggml_type, tensor_offset in infos:
        block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
        row_bytes = shape[-1] // block * block_bytes
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        start = data_start + tensor_offset
        data = buffer[start:start + rows * row_bytes].reshape(rows, row_bytes)
        tensors[name] = GGUFTensor(name, ggml_type, shape, data)
    return meta, tensors


class _Skipped(int):
    """Length of a metadata array whose elements were skipped."""


def unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation: rows per head go from interleaved pairs back to HF's two halves."""
    out_dim = weight.shape[0]
    head_dim = out_dim // num_heads
    return (weight.reshape(num_heads, head_dim // 2, 2, *weight.shape[1:]).swapaxes(1, 2)
            .reshape(weight.shape))


def config_from_gguf(meta: dict, *, source: str, dtype: str, param_dtype: str, has_output: bool,
                     vocab_size: int) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ValueError(f"{source}: metadata field 'general.architecture' = {arch!r} is not supported; "
                         f"supported: {SUPPORTED_GGUF_ARCHITECTURES}")

    def need(key):
        full = f"{arch}.{key}"
        if full not in meta:
            raise ValueError(f"{source}: metadata field {full!r} is missing")
        return meta[full]

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", meta.get(f"{arch}.rope.dimension_count",
                                                                       hidden // heads)))
    scaling_type = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling_type not in ("none", None):
        raise ValueError(f"{source}: metadata field '{arch}.rope.scaling.type' = {scaling_type!r} is not supported")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        architecture="llama",
        vocab_size=int(meta.get(f"{arch}.vocab_size", vocab_size)),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        tie_embeddings=not has_output,
        max_position_embeddings=int(meta.get(f"{arch}.context_length", 2048)),
        dtype=dtype,
        param_dtype=param_dtype,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )


class ArraySource:
    """Tensors already in host memory under HF names (e.g. dequantised from a GGUF file)."""

    def __init__(self, arrays: dict, origin: str, origin_names: Optional[dict] = None):
        self.arrays, self.origin, self.origin_names = arrays, origin, origin_names or {}

    @property
    def names(self):
        return list(self.arrays)

    def where(self, name: str) -> str:
        return f"{self.origin} (tensor {self.origin_names[name]!r})" if name in self.origin_names else self.origin

    def shape(self, name: str) -> tuple:
        return tuple(self.arrays[name].shape)

    def read(self, name: str, index: tuple) -> np.ndarray:
        return self.arrays[name][index]


def read_gguf(path, *, dtype: str = "float32", param_dtype: str = "float32"):
    """(ModelConfig, ArraySource of float32 tensors under HF names) from a GGUF file."""
    import gguf

    path = Path(path)
    meta, tensors = read_gguf_file(path)
    vocab = int(meta.get("tokenizer.ggml.tokens", 0))
    config = config_from_gguf(meta, source=str(path), dtype=dtype, param_dtype=param_dtype,
                              has_output="output.weight" in tensors, vocab_size=vocab)
    arrays, origin_names = {}, {}
    for name, tensor in tensors.items():
        for regex, hf_template in _RULES:
            match = regex.match(name)
            if match:
                hf_name = hf_template.format(**match.groupdict())
                break
        else:
            raise ValueError(f"{path}: tensor {name!r} has no HF equivalent in gguf_io._GGUF_TO_HF")
        # Row-major numpy order is HF's [out, in] layout.
        value = gguf.quants.dequantize(tensor.data, gguf.GGMLQuantizationType(tensor.ggml_type))
        value = value.astype(np.float32).reshape(tensor.shape)
        if name.endswith("attn_q.weight"):
            value = unpermute_rope_rows(value, config.num_heads)
        elif name.endswith("attn_k.weight"):
            value = unpermute_rope_rows(value, config.num_kv_heads)
        arrays[hf_name], origin_names[hf_name] = value, name
    return config, ArraySource(arrays, str(path), origin_names)

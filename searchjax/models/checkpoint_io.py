"""Hugging Face checkpoints in and out of our parameter pytree, without torch.

Conversion is one key table (`TENSOR_RULES`): each row names an HF tensor (a regex with the layer index as a group),
the parameter path it fills, and a layout saying how HF's torch `nn.Linear` weight [out, in] becomes our einsum
kernel. Every tensor's shape is asserted against the config before anything is read, every parameter of the
model must be filled by exactly one row, and checkpoint tensors that no row claims are an error (they mean the
config and the weights disagree). Per-layer HF tensors are stacked on the leading [L] axis of params["layers"].

With a mesh, each parameter is created by `jax.make_array_from_callback`; the callback for a shard reads only
that shard's slice (and only the layers it holds) from the safetensors files, so every process of a multi-host
job touches only its own bytes.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Callable, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from searchjax.models.transformer import ModelConfig, Transformer, abstract_params

HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


class CheckpointError(ValueError):
    """A checkpoint that does not match its config or our model (message names the file and the tensor)."""


# ---------------------------------------------------------------------------------------------------------------
# Layouts: how one HF tensor (per layer) maps onto our parameter (per layer). `n` = heads of that projection.
#   copy:       same shape.
#   linear:     HF [out, in] -> ours [in, out].
#   heads_out:  HF [n*D, in] -> ours [in, n, D]      (q/k/v projections)
#   heads_in:   HF [out, n*D] -> ours [n, D, out]    (o projection)
#   heads:      HF [n*D] -> ours [n, D]              (q/k/v biases)
# ---------------------------------------------------------------------------------------------------------------
LAYOUTS = ("copy", "linear", "heads_out", "heads_in", "heads")


def hf_shape(layout: str, shape: tuple) -> tuple:
    """The HF tensor shape for our per-layer parameter shape."""
    if layout == "copy":
        return tuple(shape)
    if layout == "linear":
        return (shape[1], shape[0])
    if layout == "heads_out":
        return (shape[1] * shape[2], shape[0])
    if layout == "heads_in":
        return (shape[2], shape[0] * shape[1])
    if layout == "heads":
        return (shape[0] * shape[1],)
    raise ValueError(f"unknown layout {layout!r}")


def _head_rows(s: slice, n: int, d: int) -> slice:
    start, stop, _ = s.indices(n)
    return slice(start * d, stop * d)


def read_converted(read: Callable[[tuple], np.ndarray], layout: str, shape: tuple, index: tuple) -> np.ndarray:
    """Our per-layer parameter of `shape`, restricted to `index` (a tuple of slices), reading only what it needs.

    `read(hf_index)` returns the HF tensor sliced by a tuple of slices in HF's axis order.
    """
    if layout == "copy":
        return read(index)
    if layout == "linear":
        return read((index[1], index[0])).T
    if layout == "heads_out":  # ours (in, n, D) <- HF rows = heads (whole head_dim), cols = in
        s_in, s_n, s_d = index
        n, d = shape[1], shape[2]
        block = read((_head_rows(s_n, n, d), s_in)).T  # [in', n'*D]
        return block.reshape(block.shape[0], -1, d)[:, :, s_d]
    if layout == "heads_in":  # ours (n, D, out) <- HF rows = out, cols = heads
        s_n, s_d, s_out = index
        n, d = shape[0], shape[1]
        block = read((s_out, _head_rows(s_n, n, d))).T  # [n'*D, out']
        return block.reshape(-1, d, block.shape[1])[:, s_d, :]
    if layout == "heads":
        s_n, s_d = index
        n, d = shape
        return read((_head_rows(s_n, n, d),)).reshape(-1, d)[:, s_d]
    raise ValueError(f"unknown layout {layout!r}")


def to_hf(layout: str, value: np.ndarray) -> np.ndarray:
    """Inverse of the layout for a whole per-layer parameter (used by save_pretrained)."""
    if layout == "copy":
        return value
    if layout == "linear":
        return value.T
    if layout == "heads_out":
        return value.reshape(value.shape[0], -1).T
    if layout == "heads_in":
        return value.reshape(-1, value.shape[-1]).T
    if layout == "heads":
        return value.reshape(-1)
    raise ValueError(f"unknown layout {layout!r}")


@dataclasses.dataclass(frozen=True)
class TensorRule:
    hf_name: str  # "{layer}" stands for the layer index
    param_path: tuple
    layout: str

    @property
    def per_layer(self) -> bool:
        return "{layer}" in self.hf_name

    @property
    def regex(self) -> re.Pattern:
        return re.compile(re.escape(self.hf_name).replace(re.escape("{layer}"), r"(\d+)") + r"\Z")


_L = "model.layers.{layer}."
TENSOR_RULES = (
    TensorRule("model.embed_tokens.weight", ("embed", "embedding"), "copy"),
    TensorRule(_L + "input_layernorm.weight", ("layers", "attn_norm", "scale"), "copy"),
    TensorRule(_L + "self_attn.q_proj.weight", ("layers", "attn", "q_proj", "kernel"), "heads_out"),
    TensorRule(_L + "self_attn.k_proj.weight", ("layers", "attn", "k_proj", "kernel"), "heads_out"),
    TensorRule(_L + "self_attn.v_proj.weight", ("layers", "attn", "v_proj", "kernel"), "heads_out"),
    TensorRule(_L + "self_attn.q_proj.bias", ("layers", "attn", "q_proj", "bias"), "heads"),
    TensorRule(_L + "self_attn.k_proj.bias", ("layers", "attn", "k_proj", "bias"), "heads"),
    TensorRule(_L + "self_attn.v_proj.bias", ("layers", "attn", "v_proj", "bias"), "heads"),
    TensorRule(_L + "self_attn.q_norm.weight", ("layers", "attn", "q_norm", "scale"), "copy"),
    TensorRule(_L + "self_attn.k_norm.weight", ("layers", "attn", "k_norm", "scale"), "copy"),
    TensorRule(_L + "self_attn.o_proj.weight", ("layers", "attn", "o_proj", "kernel"), "heads_in"),
    TensorRule(_L + "post_attention_layernorm.weight", ("layers", "mlp_norm", "scale"), "copy"),
    TensorRule(_L + "mlp.gate_proj.weight", ("layers", "mlp", "gate_proj", "kernel"), "linear"),
    TensorRule(_L + "mlp.up_proj.weight", ("layers", "mlp", "up_proj", "kernel"), "linear"),
    TensorRule(_L + "mlp.down_proj.weight", ("layers", "mlp", "down_proj", "kernel"), "linear"),
    TensorRule("model.norm.weight", ("final_norm", "scale"), "copy"),
    TensorRule("lm_head.weight", ("lm_head", "kernel"), "linear"),
)
# Tensors some checkpoints carry that the model does not need (recomputed buffers).
_IGNORED_TENSORS = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq\Z")


# ---------------------------------------------------------------------------------------------------------------
# HF config.json <-> ModelConfig
# ---------------------------------------------------------------------------------------------------------------
def config_from_hf(hf: dict, *, source: str = "config.json", dtype: str = "float32",
                   param_dtype: Optional[str] = None) -> ModelConfig:
    """ModelConfig from an HF config dict (transformers 4.x `rope_theta`/`rope_scaling` or 5.x `rope_parameters`)."""

    def need(field):
        if hf.get(field) is None:
            raise CheckpointError(f"{source}: required field {field!r} is missing")
        return hf[field]

    model_type = hf.get("model_type")
    if model_type not in HF_ARCHITECTURES:
        raise CheckpointError(f"{source}: field 'model_type' = {model_type!r} (architectures="
                              f"{hf.get('architectures')}) is not supported; supported: {sorted(HF_ARCHITECTURES)}")
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{source}: field 'hidden_act' = {hf['hidden_act']!r}; only 'silu' is supported")
    if hf.get("use_sliding_window"):
        raise CheckpointError(f"{source}: field 'use_sliding_window' = true is not supported")
    if model_type in ("llama", "qwen3") and hf.get("attention_bias"):
        raise CheckpointError(f"{source}: field 'attention_bias' = true (bias on q/k/v/o) is not supported "
                              f"for {model_type}")
    if hf.get("mlp_bias"):
        raise CheckpointError(f"{source}: field 'mlp_bias' = true is not supported")
    rope = dict(hf.get("rope_parameters") or {})
    rope_theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
    if not rope and hf.get("rope_scaling"):
        rope = dict(hf["rope_scaling"])
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "linear", "llama3"):
        field = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
        raise CheckpointError(f"{source}: field {field!r} has rope_type {rope_type!r}; supported: default, linear, "
                              "llama3")
    rope_scaling = None if rope_type == "default" else {**rope, "rope_type": rope_type}
    num_heads = need("num_attention_heads")
    eos = hf.get("eos_token_id")
    eos_ids = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
    return ModelConfig(
        architecture=model_type,
        vocab_size=need("vocab_size"),
        hidden_size=need("hidden_size"),
        intermediate_size=need("intermediate_size"),
        num_layers=need("num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=hf.get("head_dim") or need("hidden_size") // num_heads,
        rope_theta=float(rope_theta),
        rope_scaling=rope_scaling,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qkv_bias=model_type == "qwen2",
        qk_norm=model_type == "qwen3",
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
        dtype=dtype,
        param_dtype=param_dtype or dtype,
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos_ids,
        pad_token_id=hf.get("pad_token_id"),
    )


def config_to_hf(config: ModelConfig) -> dict:
    """config.json contents transformers reads back as the same model (4.x keys; 5.x converts them)."""
    if (config.qkv_bias != (config.architecture == "qwen2")) or (config.qk_norm != (config.architecture == "qwen3")):
        raise CheckpointError(f"ModelConfig(architecture={config.architecture!r}, qkv_bias={config.qkv_bias}, "
                              f"qk_norm={config.qk_norm}) has no transformers equivalent")
    eos = list(config.eos_token_ids)
    hf = {
        "architectures": [HF_ARCHITECTURES[config.architecture]],
        "model_type": config.architecture,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rope_theta": config.rope_theta,
        "rope_scaling": dict(config.rope_scaling) if config.rope_scaling is not None else None,
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": config.tie_embeddings,
        "max_position_embeddings": config.max_position_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": (eos[0] if len(eos) == 1 else eos) if eos else None,
        "pad_token_id": config.pad_token_id,
        "torch_dtype": config.param_dtype,
        "attention_bias": False,
        "mlp_bias": False,
        "use_sliding_window": False,
    }
    if config.architecture != "llama":
        del hf["mlp_bias"]
    return hf


# ---------------------------------------------------------------------------------------------------------------
# Tensor sources: something with .names, .shape(name), .read(name, index), .where(name)
# ---------------------------------------------------------------------------------------------------------------
class SafetensorsSource:
    """The tensors of an HF directory: model.safetensors or the shards listed by model.safetensors.index.json."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        index_file = self.directory / "model.safetensors.index.json"
        single = self.directory / "model.safetensors"
        if index_file.exists():
            weight_map = json.loads(index_file.read_text())["weight_map"]
            self.file_of = {name: self.directory / f for name, f in weight_map.items()}
            self.listing = index_file
        elif single.exists():
            from safetensors import safe_open
            with safe_open(single, "numpy") as f:
                self.file_of = {name: single for name in f.keys()}
            self.listing = single
        else:
            raise CheckpointError(
                f"{self.directory}: neither model.safetensors nor model.safetensors.index.json exists")
        self._handles = {}

    @property
    def names(self):
        return list(self.file_of)

    def where(self, name: str) -> str:
        return str(self.file_of.get(name, self.listing))

    def _slice(self, name):
        from safetensors import safe_open
        path = self.file_of[name]
        if path not in self._handles:
            if not path.exists():
                raise CheckpointError(
                    f"{self.listing}: lists {path.name} for tensor {name!r}, but {path} does not exist")
            # numpy cannot hold bfloat16 through safetensors' numpy backend; the flax backend can (kept on the
            # host CPU).
            self._handles[path] = (safe_open(path, "numpy"), safe_open(path, "flax"))
        numpy_handle, flax_handle = self._handles[path]
        sl = numpy_handle.get_slice(name)
        return (sl, False) if sl.get_dtype() not in ("BF16", "F8_E4M3", "F8_E5M2") else (flax_handle.get_slice(name),
                                                                                            True)

    def shape(self, name: str) -> tuple:
        return tuple(self._slice(name)[0].get_shape())

    def read(self, name: str, index: tuple) -> np.ndarray:
        sl, on_device = self._slice(name)
        if not on_device:
            return np.asarray(sl[index])
        with jax.default_device(jax.devices("cpu")[0]):
            return np.asarray(sl[index])


# ---------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------
def _plan(source, config: ModelConfig):
    """[(param_path, rule, ShapeDtypeStruct)] after checking names and shapes; raises CheckpointError."""
    flat = flax.traverse_util.flatten_dict(abstract_params(config))
    rules = {rule.param_path: rule for rule in TENSOR_RULES}
    available = set(source.names)
    plan = []
    for path, struct in flat.items():
        rule = rules.get(path)
        if rule is None:
            raise CheckpointError(f"parameter {'/'.join(path)} has no entry in TENSOR_RULES; it would be left unset")
        layer_shape = struct.shape[1:] if rule.per_layer else struct.shape
        expected = hf_shape(rule.layout, layer_shape)
        names = [rule.hf_name.format(layer=i) for i in range(config.num_layers)] if rule.per_layer else [rule.hf_name]
        for name in names:
            if name not in available:
                raise CheckpointError(f"{source.where(name)}: missing tensor {name!r} (needed for parameter "
                                      f"{'/'.join(path)})")
            got = source.shape(name)
            if got != expected:
                raise CheckpointError(f"{source.where(name)}: tensor {name!r} has shape {list(got)}, expected "
                                      f"{list(expected)} from the config (parameter {'/'.join(path)})")
        plan.append((path, rule, struct, names))
    claimed = {name for _, _, _, names in plan for name in names}
    unclaimed = sorted(n for n in available - claimed if not _IGNORED_TENSORS.match(n)
                       and not (n == "lm_head.weight" and config.tie_embeddings))
    if unclaimed:
        raise CheckpointError(f"{source.where(unclaimed[0])}: tensors not used by the {config.architecture} model "
                              f"described by the config: {unclaimed[:8]}{' ...' if len(unclaimed) > 8 else ''}")
    return plan


def _full_index(shape):
    return tuple(slice(0, n) for n in shape)


def load_params(source, config: ModelConfig, shardings=None, *, progress: bool = False):
    """Parameter dict from a tensor source; `shardings` (pytree like params of Sharding) or None (default device).

    progress: a tqdm bar over the parameters' bytes (a 7B model takes minutes to read)."""
    from tqdm import tqdm
    plan = _plan(source, config)
    flat_shardings = flax.traverse_util.flatten_dict(shardings) if shardings is not None else None
    dtype = config.weight_dtype
    out = {}
    total = sum(int(np.prod(struct.shape)) * np.dtype(dtype).itemsize for _, _, struct, _ in plan)
    bar = tqdm(total=total, desc="loading weights", unit="B", unit_scale=True, disable=not progress)
    for path, rule, struct, names in plan:

        def callback(index, rule=rule, struct=struct, names=names):
            index = tuple(index) + _full_index(struct.shape)[len(index):]
            if not rule.per_layer:
                return read_converted(lambda i: source.read(names[0], i), rule.layout, struct.shape,
                                      index).astype(dtype)
            layers = range(*index[0].indices(struct.shape[0]))
            return np.stack([read_converted(lambda i, n=names[layer]: source.read(n, i), rule.layout, struct.shape[1:],
                                            index[1:]) for layer in layers]).astype(dtype)

        if flat_shardings is None:
            out[path] = jnp.asarray(callback(_full_index(struct.shape)))
        else:
            out[path] = jax.make_array_from_callback(struct.shape, flat_shardings[path], callback)
        bar.update(int(np.prod(struct.shape)) * np.dtype(dtype).itemsize)
    bar.close()
    return flax.traverse_util.unflatten_dict(out)


def load_pretrained(path, *, dtype: str = "float32", param_dtype: Optional[str] = None, mesh=None, rules=None,
                    progress: bool = False):
    """(Transformer, params) from an HF directory (config.json + safetensors, sharded index ok) or a .gguf file.

    dtype: compute dtype, or "auto" for the host's fast one (`searchjax.runtime.host_compute_dtype`: bfloat16 on
    TPU, GPU and CPUs with a bf16 matrix unit, else float32); param_dtype: storage dtype (default: dtype, "auto"
    likewise). With `mesh`, parameters are created sharded
    by `searchjax.models.param_shardings(config, mesh, rules)`, each shard read from its own file slice.
    progress: a tqdm bar while the weights are read.
    """
    config, source = pretrained_config(path, dtype=dtype, param_dtype=param_dtype)
    shardings = None
    if mesh is not None:
        from searchjax.models.sharded import param_shardings  # imported lazily: the mesh path is optional
        shardings = param_shardings(config, mesh, rules)
    return Transformer(config), load_params(source, config, shardings, progress=progress)


def pretrained_config(path, *, dtype: str = "float32", param_dtype: Optional[str] = None) -> tuple:
    """(ModelConfig, its weights' source) of an HF directory or a .gguf file (`load_pretrained`'s arguments), no
    weight read: a GGUF's tensors stay memory-mapped, an HF directory's safetensors unopened."""
    from searchjax.runtime import resolve_dtype
    path = Path(path)
    dtype = resolve_dtype(dtype)
    param_dtype = resolve_dtype(param_dtype or dtype)
    if path.is_file() and path.suffix == ".gguf":
        from searchjax.models import gguf_io
        return gguf_io.read_gguf(path, dtype=dtype, param_dtype=param_dtype)
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.exists():
            raise CheckpointError(f"{config_file}: not found (expected an HF model directory)")
        config = config_from_hf(json.loads(config_file.read_text()), source=str(config_file), dtype=dtype,
                                param_dtype=param_dtype)
        return config, SafetensorsSource(path)
    raise CheckpointError(f"{path}: neither an HF model directory nor a .gguf file")


# ---------------------------------------------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------------------------------------------
def save_pretrained(model_or_config, params, out_dir, *, max_shard_bytes: int = 5 * 2 ** 30) -> Path:
    """Write config.json + safetensors (sharded with an index when larger than max_shard_bytes) for transformers.

    Multi-host: every process must call it with the same (global) params. Each parameter is gathered to the
    hosts one at a time (a collective: `searchjax.distributed.to_host`), process 0 alone keeps and writes the
    tensors, and every process returns only once the files are written (a barrier).
    """
    from safetensors.flax import save_file
    from searchjax.distributed import to_host
    config = model_or_config.config if isinstance(model_or_config, Transformer) else model_or_config
    out_dir = Path(out_dir)
    writer = jax.process_index() == 0
    flat = flax.traverse_util.flatten_dict(params)
    rules = {rule.param_path: rule for rule in TENSOR_RULES}
    tensors = {}
    for path, value in flat.items():
        if path not in rules:
            raise CheckpointError(f"parameter {'/'.join(path)} has no entry in TENSOR_RULES; cannot save it")
        rule = rules[path]
        value = to_host(value) if isinstance(value, jax.Array) else np.asarray(value)  # same order on every process
        if not writer:
            continue
        if rule.per_layer:
            for i in range(value.shape[0]):
                tensors[rule.hf_name.format(layer=i)] = np.ascontiguousarray(to_hf(rule.layout, value[i]))
        else:
            tensors[rule.hf_name] = np.ascontiguousarray(to_hf(rule.layout, value))
    if not writer:
        _barrier(f"save_pretrained {out_dir}")
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    shards, current, size = [], {}, 0
    for name, value in tensors.items():
        if current and size + value.nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name], size = value, size + value.nbytes
    shards.append(current)
    with jax.default_device(jax.devices("cpu")[0]):
        if len(shards) == 1:
            save_file({k: jnp.asarray(v) for k, v in shards[0].items()}, out_dir / "model.safetensors",
                      metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, shard in enumerate(shards):
                file_name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                save_file({k: jnp.asarray(v) for k, v in shard.items()}, out_dir / file_name, metadata={"format": "pt"})
                weight_map.update({k: file_name for k in shard})
            index = {"metadata": {"total_size": sum(v.nbytes for v in tensors.values())}, "weight_map": weight_map}
            (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (out_dir / "config.json").write_text(json.dumps(config_to_hf(config), indent=2))
    _barrier(f"save_pretrained {out_dir}")
    return out_dir


def _barrier(name: str) -> None:
    """Wait for every process (no-op in a single-process job)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)

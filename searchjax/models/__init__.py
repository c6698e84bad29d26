"""Decoder LMs (Llama / Qwen2 / Qwen3 / SmolLM2) in Flax, with HF safetensors and GGUF checkpoint interop."""

from searchjax.models.transformer import (KVCache, ModelConfig, Transformer, abstract_params, init_cache,
                                          init_params, lm_head_weight, param_logical_axes, positions_from_mask)
from searchjax.models.checkpoint_io import load_pretrained, save_pretrained, config_from_hf, config_to_hf
from searchjax.models.sharded import init_params_sharded, param_shardings

__all__ = ["KVCache", "ModelConfig", "Transformer", "abstract_params", "init_cache", "init_params",
           "lm_head_weight", "param_logical_axes", "positions_from_mask", "load_pretrained", "save_pretrained",
           "config_from_hf", "config_to_hf", "init_params_sharded", "param_shardings"]

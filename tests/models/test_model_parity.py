"""Parity with transformers (torch CPU, float32) on tiny random-weight Qwen3 / Qwen2 / Llama checkpoints."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.models import load_pretrained, positions_from_mask, save_pretrained
from searchjax.models.presets import get_preset

TINY = ("tiny-qwen3", "tiny-qwen2", "tiny-llama")


def our_logits(model, params, ids, mask):
    mask = jnp.asarray(mask)
    logits, cache = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), positions_from_mask(mask), mask)
    assert cache is None
    return np.asarray(logits)


@pytest.mark.parametrize("name", TINY)
def test_logits_match_transformers_on_left_padded_batch(name, tiny_hf_checkpoints, tiny_loaded, padded_batch,
                                                        hf_logits):
    _, hf_model = tiny_hf_checkpoints[name]
    model, params = tiny_loaded[name]
    ids, mask = padded_batch
    ours = our_logits(model, params, ids, mask)
    reference = hf_logits(hf_model, ids, mask)
    assert ours.dtype == np.float32 and ours.shape == reference.shape
    assert np.abs(reference[mask]).max() > 1.0  # random weights large enough that a wrong op would show
    np.testing.assert_allclose(ours[mask], reference[mask], rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", TINY)
def test_loaded_config_equals_preset(name, tiny_loaded):
    """config.json parsing (transformers 5 `rope_parameters`) gives exactly our preset for the same shapes."""
    model, _ = tiny_loaded[name]
    assert dataclasses.asdict(model.config) == dataclasses.asdict(get_preset(name))


@pytest.mark.parametrize("name", TINY)
def test_save_pretrained_round_trip_through_transformers(name, tiny_hf_checkpoints, tiny_loaded, padded_batch,
                                                         hf_logits, tmp_path):
    """load -> save_pretrained (sharded into several files with an index) -> transformers reload: same logits;
    and our own reload of the saved directory gives identical parameters."""
    import torch
    from transformers import AutoModelForCausalLM
    _, hf_model = tiny_hf_checkpoints[name]
    model, params = tiny_loaded[name]
    save_pretrained(model, params, tmp_path, max_shard_bytes=40_000)
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len(set(json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"].values())) > 1
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager", dtype=torch.float32).eval()
    ids, mask = padded_batch
    np.testing.assert_allclose(hf_logits(reloaded, ids, mask)[mask], hf_logits(hf_model, ids, mask)[mask],
                               rtol=0, atol=1e-5)
    _, params_again = load_pretrained(tmp_path)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params_again)


def test_bfloat16_load_keeps_dtypes(tiny_hf_checkpoints):
    """dtype / param_dtype: parameters stored in param_dtype, logits always float32."""
    directory, _ = tiny_hf_checkpoints["tiny-qwen3"]
    model, params = load_pretrained(directory, dtype="bfloat16", param_dtype="float32")
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype("float32")}
    model, params = load_pretrained(directory, dtype="bfloat16")
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype("bfloat16")}
    ids = jnp.ones((1, 4), jnp.int32)
    logits, _ = jax.jit(model.apply)({"params": params}, ids, positions_from_mask(ids > 0), ids > 0)
    assert logits.dtype == jnp.float32

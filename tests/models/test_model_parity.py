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


@pytest.mark.parametrize("name", TINY)
def test_gradients_match_torch_autograd(name, tiny_hf_checkpoints, tiny_loaded, tmp_path):
    """Every parameter's gradient of a weighted next-token log-likelihood against torch autograd through the
    transformers model, on 256 left-padded tokens: the length at which the forward splits its queries into
    causal blocks, so the hand-written VJPs (RoPE, RMSNorm, SwiGLU, attention and its block splits) all run.
    Our gradients are mapped to HF names by `save_pretrained`, the layout map the parameters use."""
    import torch
    from safetensors.numpy import load_file
    from searchjax.models.transformer import causal_blocks
    _, hf_model = tiny_hf_checkpoints[name]
    model, params = tiny_loaded[name]
    B, T = 2, 256
    assert causal_blocks(T) > 1
    rng = np.random.default_rng(5)
    ids = rng.integers(3, 256, size=(B, T)).astype(np.int32)
    mask = np.ones((B, T), bool)
    mask[1, :37] = False
    weights = (rng.standard_normal((B, T - 1)) * (mask[:, :-1] & mask[:, 1:])).astype(np.float32)

    def loss(p):
        m = jnp.asarray(mask)
        logits, _ = model.apply({"params": p}, jnp.asarray(ids), positions_from_mask(m), m)
        logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        return jnp.sum(jnp.take_along_axis(logp, jnp.asarray(ids)[:, 1:, None], axis=-1)[..., 0] * weights)
    grads = jax.jit(jax.grad(loss))(params)
    save_pretrained(model, grads, tmp_path)
    ours = load_file(tmp_path / "model.safetensors")

    hf_model.zero_grad(set_to_none=True)
    mask_t = torch.as_tensor(mask, dtype=torch.long)
    logits = hf_model(input_ids=torch.as_tensor(ids, dtype=torch.long), attention_mask=mask_t,
                      position_ids=(mask_t.cumsum(-1) - 1).clamp(min=0)).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, torch.as_tensor(ids[:, 1:, None], dtype=torch.long))
    (logp[..., 0] * torch.as_tensor(weights)).sum().backward()
    reference = {n: p.grad.numpy() for n, p in hf_model.named_parameters()}
    hf_model.zero_grad(set_to_none=True)
    assert set(ours) == set(reference)
    for hf_name, grad in reference.items():
        scale = float(np.abs(grad).max())
        assert scale > 0, hf_name
        np.testing.assert_allclose(ours[hf_name], grad, rtol=1e-3, atol=1e-4 * scale, err_msg=hf_name)

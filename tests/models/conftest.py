"""Fixtures for the model tests: tiny random-weight HF checkpoints and the transformers GGUF reference.

Tiny configs are written out here as transformers configs (independent of our presets); every tensor is
randomised before saving: transformers initialises biases to 0 and norm weights to 1, which would hide a dropped
bias or a swapped q/k norm.
"""

import numpy as np
import pytest

TINY_HF_CONFIGS = {
    # Qwen3: head_dim 16 != hidden / heads = 8, q/k norms, untied.
    "tiny-qwen3": ("Qwen3Config", dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                       max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
                                       pad_token_id=0)),
    # Qwen2: q/k/v bias, tied embeddings.
    "tiny-qwen2": ("Qwen2Config", dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, rope_theta=1_000_000.0,
                                       rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=128,
                                       bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    # Llama with llama3 rope scaling; original context 64 puts the 4 frequencies in all three bands.
    "tiny-llama": ("LlamaConfig", dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, rope_theta=10_000.0,
                                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 64},
                                       rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=512,
                                       bos_token_id=1, eos_token_id=2, pad_token_id=0)),
}


def randomise_(model, seed):
    """Every tensor random: matrices N(0, 0.2^2), biases N(0, 0.3^2), norm weights 1 + N(0, 0.3^2)."""
    import torch
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=param.dtype)
            if "norm" in name:
                param.copy_(1.0 + 0.3 * noise)
            elif name.endswith("bias"):
                param.copy_(0.3 * noise)
            else:
                param.copy_(0.2 * noise)


@pytest.fixture(scope="session")
def tiny_hf_checkpoints(tmp_path_factory):
    """{preset name: (checkpoint dir, transformers model in eval mode)} for the three tiny architectures."""
    import torch
    import transformers
    out = {}
    for seed, (name, (config_class, kwargs)) in enumerate(TINY_HF_CONFIGS.items()):
        config = getattr(transformers, config_class)(**kwargs)
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                              dtype=torch.float32).eval()
        randomise_(model, seed)
        directory = tmp_path_factory.mktemp(name)
        model.save_pretrained(directory)
        out[name] = (directory, model)
    return out


@pytest.fixture(scope="session")
def tiny_loaded(tiny_hf_checkpoints):
    """{preset name: (model, params)} loaded by our load_pretrained in float32."""
    from searchjax.models import load_pretrained
    return {name: load_pretrained(directory) for name, (directory, _) in tiny_hf_checkpoints.items()}


@pytest.fixture(scope="session")
def padded_batch():
    """A left-padded batch: ids [3, 12] int32 (pads = 0), mask [3, 12] bool; rows have 0, 3 and 7 pads."""
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 256, size=(3, 12)).astype(np.int32)
    mask = np.ones((3, 12), bool)
    for row, pads in enumerate((0, 3, 7)):
        mask[row, :pads] = False
        ids[row, :pads] = 0
    return ids, mask


def hf_forward(model, ids, mask):
    """transformers logits [B, T, V] float32 with HF's own left-padding convention (positions = cumsum - 1)."""
    import torch
    ids_t = torch.as_tensor(np.asarray(ids), dtype=torch.long)
    mask_t = torch.as_tensor(np.asarray(mask), dtype=torch.long)
    positions = (mask_t.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return model(input_ids=ids_t, attention_mask=mask_t, position_ids=positions).logits.float().numpy()


@pytest.fixture(scope="session")
def hf_logits():
    return hf_forward


@pytest.fixture(scope="session")
def smollm2_hf_reference(smollm2_gguf_path):
    """transformers' own GGUF loader on the same SmolLM2 file (dequantised to float32), eval mode."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_gguf_path.parent), gguf_file=smollm2_gguf_path.name,
                                                 dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def smollm2_hf_tokenizer(smollm2_gguf_path):
    """transformers' tokenizer built directly from the GGUF metadata (no cache)."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(smollm2_gguf_path.parent), gguf_file=smollm2_gguf_path.name)

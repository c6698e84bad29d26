"""Fixtures for the generation tests: tiny random-weight HF models (Qwen3, Llama) and their JAX loads.

Every tensor is randomised with a large scale (matrices N(0, 0.25^2) at hidden size 64, norm weights
1 + N(0, 0.3^2)), so next-token logits are spread over several units and greedy decoding has no near-ties
(the parity tests check that explicitly).
"""

import numpy as np
import pytest

TINY_CONFIGS = {
    # Qwen3: q/k norms, head_dim 16 != hidden / heads, untied.
    "qwen3": ("Qwen3Config", dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                  rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                  max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    # Llama: tied embeddings, plain rope.
    "llama": ("LlamaConfig", dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, rope_theta=10_000.0,
                                  rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=512,
                                  bos_token_id=1, eos_token_id=2, pad_token_id=0)),
}


def _randomise(model, seed):
    import torch
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=param.dtype)
            param.copy_(1.0 + 0.3 * noise if "norm" in name else 0.25 * noise)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """{"qwen3" | "llama": (transformers model in eval mode, our model, our params)}."""
    import torch
    import transformers
    from searchjax.models import load_pretrained
    out = {}
    for seed, (name, (config_class, kwargs)) in enumerate(TINY_CONFIGS.items()):
        config = getattr(transformers, config_class)(**kwargs)
        torch.manual_seed(seed)
        hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                           dtype=torch.float32).eval()
        _randomise(hf, 100 + seed)
        directory = tmp_path_factory.mktemp(f"gen-{name}")
        hf.save_pretrained(directory)
        model, params = load_pretrained(directory)
        out[name] = (hf, model, params)
    return out


@pytest.fixture(scope="session")
def tiny_prompts():
    """Four prompts of lengths 3, 9, 1 and 6 over ids [3, 256) (no BOS/EOS/pad ids)."""
    rng = np.random.default_rng(7)
    return [rng.integers(3, 256, size=n).tolist() for n in (3, 9, 1, 6)]


@pytest.fixture(scope="session")
def smollm2_hf_from_params(smollm2, tmp_path_factory):
    """transformers' LlamaForCausalLM holding exactly our SmolLM2 parameters (save_pretrained -> from_pretrained),
    so greedy parity isolates the decoding code (weight loading has its own parity tests under tests/models)."""
    import torch
    import transformers
    from searchjax.models import save_pretrained
    model, params, _ = smollm2
    directory = tmp_path_factory.mktemp("gen-smollm2")
    save_pretrained(model, params, directory)
    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                             attn_implementation="eager").eval()


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf_path):
    """The real SmolLM2 tokenizer alone (the stop-string tests need no weights)."""
    from searchjax.tokenization import load_tokenizer
    return load_tokenizer(smollm2_gguf_path)

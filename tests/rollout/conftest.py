"""Fixtures for the rollout tests: the SmolLM2 tokenizer (no weights) and a tiny random-weight Llama whose
vocabulary is SmolLM2's, so scripted policies can emit real tokens. Scripts and fakes: rollout_scripts.py."""

import pytest


@pytest.fixture(scope="session")
def rollout_tokenizer(smollm2_gguf_path):
    from searchjax.tokenization import load_tokenizer
    return load_tokenizer(smollm2_gguf_path)


@pytest.fixture(scope="session")
def tiny_policy(rollout_tokenizer):
    """(model, params): tiny-llama preset with SmolLM2's vocabulary, random init. Scripted tests replace its
    logits with a logits_fn, so the KV-cache bookkeeping runs for real while the outputs are known."""
    import jax
    from searchjax.models import Transformer, init_params
    from searchjax.models.presets import get_preset
    config = get_preset("tiny-llama", vocab_size=rollout_tokenizer.vocab_size, max_position_embeddings=4096,
                        eos_token_ids=tuple(rollout_tokenizer.eos_token_ids))
    return Transformer(config), init_params(config, jax.random.key(0))

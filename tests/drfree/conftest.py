"""Fixtures for the Dr.Free proposer tests (test_proposer_*, test_information_gain_anchor*, test_hrpo_*):
the SmolLM2 tokenizer (no weights) and a tiny random Llama with SmolLM2's vocabulary (policy / anchor of
the tiny tests; scripted tests replace its logits). Crafted chains, scripts and fakes: proposer_fakes.py.
The test_kg_* / test_synthetic_* files define their own fixtures and use none of these."""

import pytest


@pytest.fixture(scope="session")
def drfree_tokenizer(smollm2_gguf_path):
    from searchjax.tokenization import load_tokenizer
    return load_tokenizer(smollm2_gguf_path)


@pytest.fixture(scope="session")
def drfree_tiny_model(drfree_tokenizer):
    """(model, params): the tiny-llama preset (2 layers, hidden 32) with SmolLM2's vocabulary, random init."""
    import jax
    from searchjax.models import Transformer, init_params
    from searchjax.models.presets import get_preset
    config = get_preset("tiny-llama", vocab_size=drfree_tokenizer.vocab_size, max_position_embeddings=4096,
                        eos_token_ids=tuple(drfree_tokenizer.eos_token_ids),
                        pad_token_id=drfree_tokenizer.pad_token_id)
    return Transformer(config), init_params(config, jax.random.key(0))

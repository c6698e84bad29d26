"""A tiny random checkpoint for the evaluation tests (the scripted tests' byte-level tokenizer, saved as an HF
directory): cheap enough to run every system and the local judge on a few questions."""

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    import jax
    from scripted_lm import tiny_tokenizer
    from searchjax.models import ModelConfig, Transformer, init_params, save_pretrained
    directory = tmp_path_factory.mktemp("tiny-eval")
    tokenizer = tiny_tokenizer()
    config = ModelConfig(architecture="llama", vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                         num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, tie_embeddings=True,
                         max_position_embeddings=8192, eos_token_ids=tuple(tokenizer.eos_token_ids))
    # Scaled-up random weights: peaked next-token distributions, so greedy text is varied and EOS comes rarely.
    params = jax.tree.map(lambda p: p * 20 if p.ndim >= 2 else p, init_params(config, jax.random.key(5)))
    save_pretrained(Transformer(config), params, directory)
    tokenizer.hf.save_pretrained(str(directory))
    return directory

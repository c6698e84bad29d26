"""A tiny random checkpoint on disk (our save_pretrained of init_params): what the mesh tests load."""

import pytest

from searchjax.models import ModelConfig

# Every sharded dimension divisible by the meshes used (fsdp <= 4, tensor 2): embed 64, vocab 256, mlp 128,
# heads 4 / kv heads 2. Untied, so lm_head [embed, vocab] is sharded too.
TINY = ModelConfig(architecture="qwen3", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True, tie_embeddings=False, pad_token_id=0)


@pytest.fixture(scope="session")
def tiny_config():
    return TINY


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """Directory with config.json + model.safetensors of a random tiny Qwen3."""
    import jax
    from searchjax.models import Transformer, init_params, save_pretrained
    directory = tmp_path_factory.mktemp("tiny-sharding")
    params = init_params(TINY, jax.random.key(7))
    params = jax.tree.map(lambda p: p * 5 if p.ndim > 2 else p, params)  # livelier logits than init std 0.02
    save_pretrained(Transformer(TINY), params, directory)
    return directory


@pytest.fixture(scope="session")
def tiny_single(tiny_checkpoint):
    """(model, params) loaded on the default device: the single-device reference."""
    from searchjax.models import load_pretrained
    return load_pretrained(tiny_checkpoint)


@pytest.fixture(scope="session")
def scoring_batch():
    """A left-padded [5, 40] batch (5 rows: not a multiple of the mesh's batch shards)."""
    import numpy as np
    rng = np.random.default_rng(0)
    lengths = [40, 13, 27, 6, 33]
    ids = np.zeros((5, 40), np.int32)
    mask = np.zeros((5, 40), bool)
    for b, n in enumerate(lengths):
        ids[b, 40 - n:] = rng.integers(1, 256, n)
        mask[b, 40 - n:] = True
    return ids, mask

"""Fixtures for the trainer tests: a tiny random model and the synthetic task's tokenizer (the stand-in prompts,
trajectories and rollout are in trainer_fakes.py)."""

import pytest

from trainer_fakes import tiny_model_config


@pytest.fixture(scope="session")
def tiny_model():
    """(model, params): tiny Qwen3 shape (2 layers, hidden 32, 4 q / 2 kv heads), vocab 64, random weights."""
    import jax
    from searchjax.models import Transformer, init_params
    config = tiny_model_config()
    return Transformer(config), init_params(config, jax.random.key(0))


@pytest.fixture(scope="session")
def task_tokenizer(tmp_path_factory):
    """(directory, Tokenizer) of the synthetic search task's byte-level BPE (trainer_synthetic_task.py)."""
    import trainer_synthetic_task
    directory = tmp_path_factory.mktemp("task_tokenizer")
    return directory, trainer_synthetic_task.build_tokenizer(directory)

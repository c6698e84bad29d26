"""The host loop: N steps straight == k steps, SIGTERM, resume, N - k steps (bitwise); checkpoints; HF export."""

import importlib.util
import json
import os
import pathlib
import signal
import types

import jax
import numpy as np
import pytest
from trainer_fakes import TestPrompt, fake_rollout

from searchjax.rl import checkpoint, trainer
from searchjax.experiment import loop

REPO = pathlib.Path(__file__).resolve().parents[2]


def load_config_module(name: str):
    spec = importlib.util.spec_from_file_location(f"configs_{name}", REPO / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_loop_config(total_steps: int):
    config = load_config_module("quickstart").get_config()
    config.total_steps = total_steps
    config.prompts_per_step = 2
    config.mesh.fsdp = 2  # params, optimizer state and batches sharded over 2 devices; restored into the same
    config.rollout_fn = "fake"
    config.rollout.group_size = 2
    config.rollout.max_new_tokens_per_turn = 6
    config.loss.kl_coef = 0.01
    config.optim.learning_rate = 1e-2  # large enough that every step visibly moves the parameters
    config.batch.mini_batch_size = 2  # two optimizer steps per RL step
    config.batch.micro_batch_size = 2
    config.batch.prompt_buckets = (8,)
    config.batch.response_buckets = (8,)
    config.eval.every = 2
    config.eval.num_prompts = 2
    config.checkpoint.every = 1
    config.checkpoint.max_to_keep = 2
    config.logging.trajectories_per_step = -1
    config.logging.progress_bar = False
    return config


def tiny_components(model, params):
    prompts = [TestPrompt(uid=f"q{i}", question=f"q{i}", golden_answers=("0",)) for i in range(5)]
    return loop.Components(model=model, params=params, tokenizer=types.SimpleNamespace(pad_token_id=0),
                           retriever=None, train_prompts=prompts, eval_prompts=prompts[:2])


def _final_state(config, workdir, model, params):
    optimizer = trainer.make_optimizer(trainer.OptimConfig(**config.optim))
    abstract = jax.eval_shape(lambda p: trainer.init_train_state(p, optimizer, keep_reference=True), params)
    manager = checkpoint.make_manager(workdir / "checkpoints", max_to_keep=2)
    state, loop_state, step = checkpoint.restore(manager, checkpoint.abstract_like(abstract))
    steps = manager.all_steps()
    manager.close()
    return state, loop_state, step, steps


def _rows(workdir):
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "host/"))} for r in rows]  # machine-dependent


@pytest.mark.heavy
def test_sigterm_then_resume_is_bitwise_identical(tiny_model, tmp_path, monkeypatch):
    model, params = tiny_model
    monkeypatch.setitem(loop.ROLLOUT_FNS, "fake", fake_rollout)
    config = tiny_loop_config(total_steps=4)

    straight = tmp_path / "straight"
    config.checkpoint.export_hf = True
    loop.train(config, straight, components=tiny_components(model, params))
    config.checkpoint.export_hf = False

    calls = {"train": 0}

    def rollout_then_sigterm(components, policy, prompts, rollout_cfg, seed):
        if rollout_cfg["group_size"] > 1:  # training rollouts (evaluation uses group size 1)
            calls["train"] += 1
            if calls["train"] == 2:  # a scheduler's SIGTERM arrives during step 2
                os.kill(os.getpid(), signal.SIGTERM)
        return fake_rollout(components, policy, prompts, rollout_cfg, seed)

    monkeypatch.setitem(loop.ROLLOUT_FNS, "fake", rollout_then_sigterm)
    interrupted = tmp_path / "interrupted"
    loop.train(config, interrupted, components=tiny_components(model, params))
    _, loop_state, step, _ = _final_state(config, interrupted, model, params)
    assert step == 2 and loop_state["step"] == 2 and len(_rows(interrupted)) == 2
    loop.train(config, interrupted, resume=True, components=tiny_components(model, params))
    assert calls["train"] == 4  # steps 1, 2 before the stop; 3, 4 after the resume

    state_a, loop_a, step_a, kept = _final_state(config, straight, model, params)
    state_b, loop_b, step_b, _ = _final_state(config, interrupted, model, params)
    assert step_a == step_b == 4 and kept == [3, 4] and loop_a == loop_b
    for a, b in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))  # training did move the parameters
               for a, b in zip(jax.tree.leaves(state_a.params), jax.tree.leaves(params)))
    assert _rows(straight) == _rows(interrupted)
    for step in range(1, 5):
        name = f"trajectories/step_{step:06d}.jsonl"
        assert (straight / name).read_text() == (interrupted / name).read_text()
    assert int(state_a.step) == 8  # 4 RL steps x 2 mini-batches

    # Starting afresh in a workdir that holds a run is refused (it would interleave two runs' checkpoints).
    with pytest.raises(FileExistsError, match=r"latest step 4\): pass --resume"):
        loop.train(config, straight, components=tiny_components(model, params))
    assert _rows(straight) == _rows(interrupted)  # and nothing was written

    # The HF export of the last checkpoint loads back (through the models' own loader) to the same weights.
    from searchjax.models import load_pretrained
    _, exported = load_pretrained(straight / "hf" / "step_000004")
    for a, b in zip(jax.tree.leaves(exported), jax.tree.leaves(state_a.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_batch_arithmetic_is_rejected_before_running(tiny_model, tmp_path):
    model, params = tiny_model
    config = tiny_loop_config(total_steps=1)
    config.batch.mini_batch_size = 3
    with pytest.raises(ValueError, match="mini_batch_size=3 must divide the 4 trajectories"):
        loop.train(config, tmp_path, components=tiny_components(model, params))

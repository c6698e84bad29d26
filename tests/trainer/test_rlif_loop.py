"""RLIF inside the real trainer: one RL step of `searchjax.experiment.loop.train` with configs/ccs.py:quickstart_rlif
(shrunk) on a tiny random policy and the stand-in rollout (real sampling).

Checked against an independent computation: each trajectory's reward is the mean, over its final response
(the generated tokens after the last observation token), of KL(U || softmax(z / T)) = logsumexp(z / T) -
mean(z / T) - log V, in float64 numpy from the logits of a plain forward of the initial parameters over the
unpadded prompt + response (not the loop's chunked head pass over the padded batch); the advantages the update
trains on are GRPO of those rewards. And the pass costs no forward: the same step with exact_match runs as many
old-policy and reference calls, and the old log-probs the loss uses are the same.
"""

import importlib.util
import json
import pathlib
import types

import jax
import numpy as np
import pytest
from scipy.special import logsumexp
from trainer_fakes import TestPrompt, fake_rollout

from searchjax.experiment import loop
from searchjax.rewards import rlif
from searchjax.rl import trainer
from searchjax.rl.advantages import grpo_advantages

REPO = pathlib.Path(__file__).resolve().parents[2]
TEMPERATURE = 0.7


def _config(reward_fn: str):
    spec = importlib.util.spec_from_file_location("configs_ccs", REPO / "configs" / "ccs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config("quickstart_rlif")
    assert config.reward_fn == "rlif" and config.rlif.tokens == "final_response"
    config.reward_fn = reward_fn
    config.total_steps = 1
    config.prompts_per_step = 2
    config.rollout_fn = "fake"
    config.rollout.group_size = 2
    config.rollout.max_new_tokens_per_turn = 8
    config.rollout.temperature = TEMPERATURE  # the pass must score at the sampling temperature
    config.loss.kl_coef = 0.01  # a reference pass too
    config.batch.mini_batch_size = 4
    config.batch.micro_batch_size = 2  # two calls per pass
    config.batch.prompt_buckets = (8,)
    config.batch.response_buckets = (8,)
    config.eval.every = 0
    config.checkpoint.every = 0
    config.checkpoint.export_hf = False
    config.logging.trajectories_per_step = -1
    config.logging.progress_bar = False
    return config


@pytest.fixture(scope="module")
def peaked_model(tiny_model):
    """The tiny model with its weights scaled up x15 (norm scales kept): next-token distributions far from
    uniform, so self-certainty is O(1) and float32 round-off cannot hide a wrong position or temperature."""
    model, params = tiny_model
    scaled = jax.tree_util.tree_map_with_path(
        lambda path, x: x if "scale" in jax.tree_util.keystr(path) else x * 15.0, params)
    return model, scaled


def _components(model, params):
    prompts = [TestPrompt(uid=f"q{i}", question=f"q{i}", golden_answers=("0",)) for i in range(2)]
    return loop.Components(model=model, params=params, tokenizer=types.SimpleNamespace(pad_token_id=0),
                           retriever=None, train_prompts=prompts, eval_prompts=[])


def _train(reward_fn, model, params, workdir, monkeypatch):
    """One step; returns (metrics, dumped rows, forward calls per pass kind, the batches the update saw)."""
    calls = {"logprob": 0, "certainty": 0}
    updates = []

    def counted(make, kind):
        def build(*args, **kwargs):
            fn = make(*args, **kwargs)

            def call(*a, **k):
                calls[kind] += 1
                return fn(*a, **k)
            return call
        return build

    def recorded(make):
        def build(*args, **kwargs):
            step = make(*args, **kwargs)

            def call(state, batch, tail):
                updates.append({k: np.asarray(jax.device_get(v)) for k, v in batch.items()})
                return step(state, batch, tail)
            return call
        return build

    with monkeypatch.context() as m:
        m.setitem(loop.ROLLOUT_FNS, "fake", fake_rollout)
        m.setattr(trainer, "make_logprob_fn", counted(trainer.make_logprob_fn, "logprob"))
        m.setattr(rlif, "make_logprob_certainty_fn", counted(rlif.make_logprob_certainty_fn, "certainty"))
        m.setattr(trainer, "make_train_step", recorded(trainer.make_train_step))
        metrics = loop.train(_config(reward_fn), workdir, components=_components(model, params))
    rows = [json.loads(line) for line in (workdir / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    return metrics, rows, calls, updates


def _self_certainty_by_hand(forward, params, row) -> float:
    """Mean KL(U || p) over the final response, from the logits of one unpadded forward (`forward`: the model's
    apply, jitted once by the caller: one program per length), float64 numpy."""
    from searchjax.models import positions_from_mask
    ids = np.asarray(row["prompt_ids"] + row["response_ids"], np.int32)[None]
    mask = np.ones_like(ids, bool)
    logits, _ = forward({"params": params}, ids, positions_from_mask(mask), mask)
    p = len(row["prompt_ids"])
    z = np.asarray(logits[0], np.float64)[p - 1:p - 1 + len(row["response_ids"])] / TEMPERATURE  # predict response
    kl = logsumexp(z, axis=-1) - z.mean(axis=-1) - np.log(z.shape[-1])
    loss_mask = np.asarray(row["loss_mask"])
    observed = np.flatnonzero(loss_mask == 0)
    start = observed[-1] + 1 if observed.size else 0  # after the last observation token
    scored = np.arange(len(loss_mask)) >= start
    return float(kl[scored].mean()) if scored.any() else 0.0


def test_rlif_rewards_are_the_old_policy_passes_self_certainty(peaked_model, tmp_path, monkeypatch):
    model, params = peaked_model
    metrics, rows, calls, updates = _train("rlif", model, params, tmp_path / "rlif", monkeypatch)
    assert len(rows) == 4 and metrics["reward/rlif/scored_tokens_mean"] > 0
    rows.sort(key=lambda r: (r["uid"], r["sample_index"]))
    forward = jax.jit(model.apply)  # one wrapper for every row: op by op, each length compiled every operation
    expected = np.array([_self_certainty_by_hand(forward, params, r) for r in rows])
    assert expected.max() > 0.5  # far from uniform: the comparison below is not between two near-zeros
    np.testing.assert_allclose([r["reward"] for r in rows], expected, rtol=1e-4, atol=1e-5)
    assert metrics["reward/mean"] == pytest.approx(expected.mean(), rel=1e-4)
    # The update trained on GRPO of these rewards (written into the batch after the reward, padded rows 0).
    advantages = grpo_advantages(expected.astype(np.float32), [r["uid"] for r in rows])
    np.testing.assert_allclose([r["advantage"] for r in rows], advantages, rtol=1e-3, atol=1e-4)
    assert len(updates) == 1 and np.abs(updates[0]["advantages"]).sum() > 0
    np.testing.assert_allclose(np.sort(updates[0]["advantages"].ravel()), np.sort(advantages), rtol=1e-3, atol=1e-4)
    assert calls == {"certainty": 2, "logprob": 2}  # 4 rows / micro-batch 2: the old pass (rlif) + the reference

    em_metrics, em_rows, em_calls, em_updates = _train("exact_match", model, params, tmp_path / "em", monkeypatch)
    assert sum(em_calls.values()) == sum(calls.values()) and em_calls["logprob"] == 4  # as many forwards
    em_rows.sort(key=lambda r: (r["uid"], r["sample_index"]))
    assert [r["response_ids"] for r in em_rows] == [r["response_ids"] for r in rows]  # the same rollout
    np.testing.assert_allclose(updates[0]["old_logprobs"], em_updates[0]["old_logprobs"], rtol=1e-5, atol=1e-5)
    assert np.abs(updates[0]["old_logprobs"]).sum() > 0
    assert metrics["rollout/entropy_mc"] == pytest.approx(em_metrics["rollout/entropy_mc"], rel=1e-5)


def test_an_evaluation_reward_that_needs_the_pass_is_refused(peaked_model, tmp_path, monkeypatch):
    model, params = peaked_model
    monkeypatch.setitem(loop.ROLLOUT_FNS, "fake", fake_rollout)
    config = _config("rlif")
    config.eval_reward_fn = "rlif"
    config.eval.every = 1
    with pytest.raises(ValueError, match=r"config.eval_reward_fn='rlif' needs the old-policy pass's self-certainty"):
        loop.train(config, tmp_path / "run", components=_components(model, params))

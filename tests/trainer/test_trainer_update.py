"""The update step: batch layout, gradient accumulation against a hand-written loss, NaN guard, AdamW precision."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trainer_fakes import TestPrompt, TestTrajectory, random_trajectories

from searchjax.rl import batching, trainer

BUCKETS = dict(prompt_buckets=(16,), response_buckets=(16,))


def _batch(model, params, n=8, seed=0, kl=True):
    """A policy batch whose old/ref log-probs are the current ones perturbed, so clipping and KL are active."""
    rng = np.random.default_rng(seed)
    trajs = random_trajectories(rng, n, model.config.vocab_size)
    batch = batching.make_batch(trajs, rng.standard_normal(n).astype(np.float32), pad_id=0, **BUCKETS)
    batch.pop("sampler_logprobs")
    logp = trainer.batch_logprobs(trainer.make_logprob_fn(model, 1.0), params, batch, n)
    batch["old_logprobs"] = logp + rng.normal(0, 0.3, logp.shape).astype(np.float32)
    if kl:
        batch["ref_logprobs"] = logp + rng.normal(0, 0.3, logp.shape).astype(np.float32)
    return trajs, batch


def test_batch_layout_matches_unpadded_scoring(tiny_model):
    """Left-padded prompt | right-padded response: the loss-masked log-probs equal token_logprobs of each
    unpadded sequence (the public scoring API), and the masks sit exactly on the response tokens."""
    from searchjax.scoring import token_logprobs
    model, params = tiny_model
    trajs, batch = _batch(model, params, kl=False)
    P = 16
    logp = trainer.batch_logprobs(trainer.make_logprob_fn(model, 0.7), params, batch, 8)
    for i, t in enumerate(trajs):
        p, r = len(t.prompt_ids), len(t.response_ids)
        np.testing.assert_array_equal(batch["input_ids"][i, P - p:P + r], t.prompt_ids + t.response_ids)
        assert batch["attention_mask"][i].sum() == p + r and batch["attention_mask"][i, P - p:P + r].all()
        expected_mask = np.zeros(31, np.float32)
        expected_mask[P - 1:P - 1 + r] = t.loss_mask
        np.testing.assert_array_equal(batch["loss_mask"][i], expected_mask)
        ids = np.asarray([t.prompt_ids + t.response_ids])
        ref = np.asarray(token_logprobs(model, params, ids, np.ones_like(ids, bool), temperature=0.7))[0, -r:]
        np.testing.assert_allclose(logp[i, P - 1:P - 1 + r], ref, rtol=1e-5, atol=1e-5)


def test_make_batch_rejects_bad_input():
    t = TestTrajectory(prompt=TestPrompt("a", "a", ("x",)), sample_index=0, prompt_ids=[1, 2], response_ids=[3, 4],
                       loss_mask=[1], sampler_logprobs=[0.0, 0.0])
    with pytest.raises(ValueError, match="loss_mask"):
        batching.make_batch([t], np.zeros(1), pad_id=0, **BUCKETS)
    t.loss_mask = [1, 1]
    with pytest.raises(ValueError, match="largest length bucket"):
        batching.make_batch([t], np.zeros(1), pad_id=0, prompt_buckets=(1,), response_buckets=(16,))


def _reference_loss(model, params, batch, clip=0.2, kl_coef=0.05):
    """The Search-R1/verl objective written out by hand: token-mean of
    max(-A r, -A clip(r, 1-e, 1+e)) + c (exp(ref - logp) - (ref - logp) - 1), r = exp(logp - old)."""
    from searchjax.scoring import tail_logprobs
    ids = jnp.asarray(batch["input_ids"])
    logp = tail_logprobs(model, params, ids, jnp.asarray(batch["attention_mask"]), 1.0, tail=ids.shape[1] - 1)
    adv = jnp.asarray(batch["advantages"])[:, None]
    ratio = jnp.exp(logp - batch["old_logprobs"])
    pg = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1 - clip, 1 + clip))
    d = batch["ref_logprobs"] - logp
    kl = jnp.exp(d) - d - 1
    mask = jnp.asarray(batch["loss_mask"])
    return jnp.sum(mask * (pg + kl_coef * kl)) / jnp.sum(mask)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_accumulated_gradient_equals_full_batch(tiny_model, aggregation):
    model, params = tiny_model
    _, batch = _batch(model, params)
    cfg = trainer.LossConfig(kl_coef=0.05, aggregation=aggregation)
    grad_fn = jax.jit(lambda p, b: trainer.accumulate_gradients(model, cfg, p, b))
    full_g, full_loss, _ = grad_fn(params, batching.stack_micro_batches(batch, 8))
    micro_g, micro_loss, metrics = grad_fn(params, batching.stack_micro_batches(batch, 2))
    np.testing.assert_allclose(micro_loss, full_loss, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(micro_g), jax.tree.leaves(full_g)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert metrics["tokens"] == batch["loss_mask"].sum()
    if aggregation == "token-mean":  # against the objective written out independently
        # one compiled program (op by op, autodiff through the model compiled ~170 small ones)
        ref_loss, ref_g = jax.jit(jax.value_and_grad(lambda p: _reference_loss(model, p, batch)))(params)
        np.testing.assert_allclose(full_loss, ref_loss, rtol=1e-5)
        for a, b in zip(jax.tree.leaves(micro_g), jax.tree.leaves(ref_g)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_scoring_only_the_loss_columns_changes_nothing(tiny_model):
    """`tail` = batching.loss_columns: the response bucket for rollouts; the old-policy log-probs and the
    update's loss, gradients and metrics are those of scoring every column."""
    model, params = tiny_model
    _, batch = _batch(model, params)
    tail = batching.loss_columns(batch)
    assert tail == 16  # responses start at column P = 16, scored from column 15 of 31
    logprob_fn = trainer.make_logprob_fn(model, 1.0)
    full = trainer.batch_logprobs(logprob_fn, params, batch, 4)
    cut = trainer.batch_logprobs(logprob_fn, params, batch, 4, tail=tail)
    np.testing.assert_allclose(cut[:, -tail:], full[:, -tail:], rtol=1e-6, atol=1e-6)
    assert not cut[:, :-tail].any() and full[:, :-tail].any()
    cfg = trainer.LossConfig(kl_coef=0.05)
    stacked = batching.stack_micro_batches(batch, 4)
    grad_fn = jax.jit(lambda p, b, t: trainer.accumulate_gradients(model, cfg, p, b, t), static_argnums=2)
    (g_full, loss_full, m_full), (g_tail, loss_tail, m_tail) = grad_fn(params, stacked, None), grad_fn(params, stacked,
                                                                                                    tail)
    np.testing.assert_allclose(loss_tail, loss_full, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), g_tail, g_full)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), m_tail, m_full)
    # a mask that starts later scores fewer columns; an all-zero mask still scores one
    late = np.zeros_like(batch["loss_mask"])
    late[3, 20] = late[5, 27] = 1.0
    assert batching.loss_columns(dict(batch, loss_mask=late)) == 11
    assert batching.loss_columns(dict(batch, loss_mask=np.zeros_like(batch["loss_mask"]))) == 1


def test_nan_guard_skips_and_counts(tiny_model):
    model, params = tiny_model
    _, batch = _batch(model, params)
    optim = trainer.OptimConfig(learning_rate=1e-3, warmup_steps=4)
    step = trainer.make_train_step(model, trainer.LossConfig(kl_coef=0.05), optim)
    state = trainer.init_train_state(params, trainer.make_optimizer(optim), keep_reference=True)
    before = jax.tree.map(np.asarray, state)
    bad = dict(batch, advantages=np.where(np.arange(8) == 3, np.nan, batch["advantages"]).astype(np.float32))
    state, m = step(state, batching.stack_micro_batches(bad, 4))
    assert m["update_skipped"] == 1 and m["skipped_total"] == 1 and int(state.skipped) == 1 and int(state.step) == 1
    for a, b in zip(jax.tree.leaves(state.params) + jax.tree.leaves(state.opt_state),
                    jax.tree.leaves(before.params) + jax.tree.leaves(before.opt_state)):
        np.testing.assert_array_equal(a, b)
    state, m = step(state, batching.stack_micro_batches(batch, 4))
    assert m["update_skipped"] == 0 and int(state.skipped) == 1 and int(state.step) == 2
    assert float(m["learning_rate"]) == pytest.approx(1e-3 / 4)  # the skipped step did not advance the warmup
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(before.params)))


def test_warmup_then_constant_schedule():
    schedule = trainer.warmup_constant_schedule(1e-3, 4)
    np.testing.assert_allclose([float(schedule(n)) for n in range(6)], [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert float(trainer.warmup_constant_schedule(2e-6, 0)(7)) == pytest.approx(2e-6)


def test_bf16_params_with_f32_master_adamw_first_step(tiny_model):
    """bf16 forward on f32 master weights: moments and master stay f32, and the first AdamW step is the
    hand-computed one, delta = -lr (g / (|g| + eps) + wd p), even at lr 1e-6 (below bf16's resolution)."""
    from searchjax.models import Transformer
    model, params = tiny_model
    bf16_model = Transformer(model.config.replace(param_dtype="bfloat16", dtype="bfloat16"))
    bf16_params = trainer.cast_tree(params, "bfloat16")
    _, batch = _batch(model, params, kl=False)
    lr, wd = 1e-6, 0.01
    optim = trainer.OptimConfig(learning_rate=lr, weight_decay=wd, max_grad_norm=0.0)
    cfg = trainer.LossConfig()
    state = trainer.init_train_state(bf16_params, trainer.make_optimizer(optim), master_dtype="float32")
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.opt_state) if x.ndim > 0)
    master0 = jax.tree.map(np.asarray, state.params)
    stacked = batching.stack_micro_batches(batch, 4)
    grads, _, _ = jax.jit(lambda p, b: trainer.accumulate_gradients(bf16_model, cfg, p, b))(state.params, stacked)
    state, _ = trainer.make_train_step(bf16_model, cfg, optim)(state, stacked)
    moved = 0
    for p1, p0, g in zip(jax.tree.leaves(state.params), jax.tree.leaves(master0), jax.tree.leaves(grads)):
        g = np.asarray(g, np.float64)
        expected = -lr * (g / (np.abs(g) + 1e-8) + wd * p0)
        p0 = np.asarray(p0)
        # f32 master arithmetic: the stored delta is exact up to a couple of ulps of the parameter itself
        tolerance = 1e-3 * np.abs(expected) + 2 * np.spacing(np.abs(p0)).astype(np.float64)
        assert np.all(np.abs((np.asarray(p1, np.float64) - p0) - expected) <= tolerance)
        moved += int(np.sum(np.asarray(p1) != p0))
    assert moved > 0.9 * sum(x.size for x in jax.tree.leaves(master0))

"""Sharded (data x fsdp x tensor = 2 x 2 x 2 on the 8 simulated CPU devices) vs single-device updates."""

import jax
import numpy as np
import optax
import pytest
from trainer_fakes import random_trajectories

from searchjax.rl import batching, trainer
from searchjax.models import param_shardings
from searchjax.sharding import make_mesh


def _policy_batch(model, params):
    rng = np.random.default_rng(1)
    trajs = random_trajectories(rng, 16, model.config.vocab_size)
    # Advantages of scale 100 make the lr 1e-2 SGD deltas large against float32 rounding of the params.
    batch = batching.make_batch(trajs, 100 * rng.standard_normal(16).astype(np.float32), pad_id=0,
                                prompt_buckets=(16,), response_buckets=(16,))
    batch.pop("sampler_logprobs")
    logp = trainer.batch_logprobs(trainer.make_logprob_fn(model, 1.0), params, batch, 16)
    batch["old_logprobs"] = logp + rng.normal(0, 0.2, logp.shape).astype(np.float32)
    batch["ref_logprobs"] = logp + rng.normal(0, 0.2, logp.shape).astype(np.float32)
    return batching.stack_micro_batches(batch, 8)


def _assert_tree_close(actual, expected, rtol=1e-5, storage=None):
    """Per tensor, ||actual - expected|| <= rtol ||expected|| (+ ||ulp(storage)||), float64 norms.

    A norm-wise relative tolerance: float32 reductions split across devices sum in a different order,
    so an entry that is the small remainder of a cancelling sum can move by a few ulps of the sum's
    terms, which elementwise rtol would mistake for a wrong gradient. For parameter deltas
    (`storage` = the float32 parameters), each side's p + delta is rounded to float32 when stored, so
    the comparison also allows one ulp of the parameter per entry (it matters only for the norm scales,
    whose parameters are ~1 and whose deltas are small).
    """
    storage = jax.tree.map(lambda x: None, expected) if storage is None else storage
    for (path, e), a, p in zip(jax.tree_util.tree_leaves_with_path(expected), jax.tree.leaves(actual),
                               jax.tree.leaves(storage, is_leaf=lambda x: x is None)):
        a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
        ulp = 0.0 if p is None else np.linalg.norm(np.spacing(np.abs(np.asarray(p, np.float32))).astype(np.float64))
        error = np.linalg.norm(a - e)
        assert error <= rtol * np.linalg.norm(e) + ulp, (
            f"{jax.tree_util.keystr(path)}: |diff| {error:.3e} > {rtol} x |expected| {np.linalg.norm(e):.3e} "
            f"+ ulp {ulp:.3e}")


@pytest.mark.heavy
def test_sharded_gradients_and_sgd_step_match_single_device(tiny_model):
    model, params = tiny_model
    assert jax.device_count() == 8
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    shard = param_shardings(model.config, mesh)
    batch = _policy_batch(model, params)
    cfg = trainer.LossConfig(kl_coef=0.05)

    # Gradients (accumulated over 2 micro-batches of 8 rows, rows split 4 ways over data x fsdp).
    single_g, single_loss, _ = jax.jit(lambda p, b: trainer.accumulate_gradients(model, cfg, p, b))(params, batch)
    rows = trainer.batch_rows_sharding(mesh, stacked=True)
    sharded_fn = jax.jit(lambda p, b: trainer.accumulate_gradients(model, cfg, p, b), in_shardings=(shard, rows),
                         out_shardings=(shard, None, None))
    sharded_params = jax.device_put(params, shard)
    sharded_g, sharded_loss, _ = sharded_fn(sharded_params, batch)
    np.testing.assert_allclose(sharded_loss, single_loss, rtol=1e-5)
    _assert_tree_close(sharded_g, single_g)
    assert sharded_g["layers"]["mlp"]["gate_proj"]["kernel"].sharding.spec == shard["layers"]["mlp"]["gate_proj"]["kernel"].spec

    # One SGD step at lr 1e-2 through the real (donating, sharded) train step: parameter deltas agree.
    optim = trainer.OptimConfig(kind="sgd", learning_rate=1e-2, max_grad_norm=0.0, weight_decay=0.0)
    optimizer = trainer.make_optimizer(optim)
    single_state = trainer.init_train_state(params, optimizer, keep_reference=True)
    single_state, _ = trainer.make_train_step(model, cfg, optim)(single_state, batch)
    shardings = trainer.state_shardings(optimizer, sharded_params, shard, mesh, master_dtype=None,
                                        keep_reference=True)
    state = trainer.init_train_state(sharded_params, optimizer, keep_reference=True, shardings=shardings)
    state, _ = trainer.make_train_step(model, cfg, optim, mesh=mesh, shardings=shardings)(state, batch)
    delta = lambda new: jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64), new, params)
    _assert_tree_close(delta(state.params), delta(single_state.params), storage=params)
    _assert_tree_close(delta(single_state.params), jax.tree.map(lambda g: -1e-2 * np.asarray(g), single_g),
                       storage=params)
    assert state.params["embed"]["embedding"].sharding == shard["embed"]["embedding"]


def test_adamw_moments_are_sharded_like_their_parameters(tiny_model):
    model, params = tiny_model
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    shard = param_shardings(model.config, mesh)
    optimizer = trainer.make_optimizer(trainer.OptimConfig())
    shardings = trainer.state_shardings(optimizer, params, shard, mesh, master_dtype="float32", keep_reference=False)
    state = trainer.init_train_state(jax.device_put(params, shard), optimizer, master_dtype="float32",
                                     shardings=shardings)
    adam = state.opt_state[1][0]
    assert isinstance(adam, optax.ScaleByAdamState)
    for moments in (adam.mu, adam.nu):
        for m, s in zip(jax.tree.leaves(moments), jax.tree.leaves(shard)):
            assert m.sharding == s
    assert state.step.sharding.spec == jax.sharding.PartitionSpec()

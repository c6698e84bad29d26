"""Losses against hand-computed values, hand-derived gradients, and numpy/scipy references."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.rl.losses import (aggregate_loss, clipped_surrogate, entropy_from_logits, kl_penalty, masked_mean,
                                 mean_from_sum, policy_loss, sft_loss)

LN = math.log


# --- KL estimators ---------------------------------------------------------------------------------------
def test_kl_values_by_hand():
    logp = jnp.array([[-1.0, -2.0, -0.5, -30.0, 0.0]])
    ref = jnp.array([[-1.5, -1.0, -0.5, 0.0, -30.0]])
    np.testing.assert_allclose(kl_penalty(logp, ref, "k1"), [[0.5, -1.0, 0.0, -30.0, 30.0]], rtol=1e-6)
    np.testing.assert_allclose(kl_penalty(logp, ref, "k2"), [[0.125, 0.5, 0.0, 450.0, 450.0]], rtol=1e-6)
    # k3: d = ref - logp = (-0.5, 1, 0, 30 -> clip 20, -30 -> clip -20); exp(d) - d - 1, then clip to [-10, 10]
    expected_k3 = [math.exp(-0.5) + 0.5 - 1, math.e - 2, 0.0, 10.0, 10.0]  # exp(20)-21 and exp(-20)+19 clip to 10
    np.testing.assert_allclose(kl_penalty(logp, ref, "k3"), [expected_k3], rtol=1e-6, atol=1e-7)


def test_kl_gradients_by_hand():
    logp = jnp.array([-1.0, -2.0, -0.5, -30.0])
    ref = jnp.array([-1.5, -1.0, -0.7, 0.0])
    g1 = jax.grad(lambda x: jnp.sum(kl_penalty(x, ref, "k1")))(logp)
    g2 = jax.grad(lambda x: jnp.sum(kl_penalty(x, ref, "k2")))(logp)
    g3 = jax.grad(lambda x: jnp.sum(kl_penalty(x, ref, "k3")))(logp)
    np.testing.assert_allclose(g1, [1, 1, 1, 1])
    np.testing.assert_allclose(g2, np.asarray(logp - ref), rtol=1e-6)
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(ref - logp); the last token is clipped -> 0
    d = np.asarray(ref - logp)
    np.testing.assert_allclose(g3[:3], 1 - np.exp(d[:3]), rtol=1e-6)
    assert g3[3] == 0.0


# --- clipped surrogate -----------------------------------------------------------------------------------
def _example():
    # tokens: (A, ratio) = (1, 1.5), (-1, 1.5), (1, 0.5), (-1, 0.5), (0, 3.0)
    old = jnp.zeros((1, 5))
    logp = jnp.array([[LN(1.5), LN(1.5), LN(0.5), LN(0.5), LN(3.0)]])
    adv = jnp.array([[1.0, -1.0, 1.0, -1.0, 0.0]])
    return logp, old, adv


def test_surrogate_by_hand():
    logp, old, adv = _example()
    loss, diag = clipped_surrogate(logp, old, adv, clip_low=0.2, clip_high=0.2)
    # max(-A r, -A clip(r, 0.8, 1.2)): -1.2, 1.5, -0.5, 0.8, 0
    np.testing.assert_allclose(loss, [[-1.2, 1.5, -0.5, 0.8, 0.0]], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(diag["clipped_high"], [[True, False, False, False, False]])
    np.testing.assert_array_equal(diag["clipped_low"], [[False, False, False, True, False]])
    np.testing.assert_allclose(diag["ratio"], [[1.5, 1.5, 0.5, 0.5, 3.0]], rtol=1e-6)
    # asymmetric clip: 1 + 0.3 and 1 - 0.1
    loss, _ = clipped_surrogate(logp, old, adv, clip_low=0.1, clip_high=0.3)
    np.testing.assert_allclose(loss, [[-1.3, 1.5, -0.5, 0.9, 0.0]], rtol=1e-6, atol=1e-7)
    # dual clip c = 1.4: A < 0 tokens bounded by -A c = 1.4 -> token 2 becomes 1.4; A >= 0 untouched
    loss, diag = clipped_surrogate(logp, old, adv, clip_low=0.2, clip_high=0.2, clip_ratio_c=1.4)
    np.testing.assert_allclose(loss, [[-1.2, 1.4, -0.5, 0.8, 0.0]], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(diag["clipped_dual"], [[False, True, False, False, False]])


def test_log_ratio_is_clamped_before_exp():
    logp = jnp.array([[50.0, -50.0]])
    loss, diag = clipped_surrogate(logp, jnp.zeros((1, 2)), jnp.array([-1.0, -1.0])[None, :].reshape(1, 2))
    np.testing.assert_allclose(diag["log_ratio"], [[20.0, -20.0]])
    np.testing.assert_allclose(diag["ratio"], [[math.exp(20.0), math.exp(-20.0)]], rtol=1e-6)
    assert np.all(np.isfinite(np.asarray(loss)))


def test_surrogate_gradient_at_ratio_one_is_minus_advantage_times_grad_logp():
    # A tiny softmax policy: logits = feats @ theta.T; logp of the sampled tokens.
    rng = np.random.default_rng(0)
    B, T, V, D = 3, 4, 7, 5
    feats = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, V, size=(B, T)))
    theta = jnp.asarray(rng.normal(size=(V, D)), jnp.float32)
    adv = jnp.asarray(rng.normal(size=(B,)), jnp.float32)
    mask = jnp.asarray([[1, 1, 0, 1], [1, 1, 1, 1], [0, 1, 1, 0]], jnp.float32)

    def logp_fn(th):
        logits = jnp.einsum("btd,vd->btv", feats, th)
        return jnp.take_along_axis(jax.nn.log_softmax(logits, -1), tokens[..., None], -1)[..., 0]

    old = jax.lax.stop_gradient(logp_fn(theta))   # ratio exactly 1 at theta

    def loss_fn(th):
        per_token, _ = clipped_surrogate(logp_fn(th), old, adv, clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0)
        total, _ = aggregate_loss(per_token, mask, "seq-mean-token-sum")
        return total

    grad = jax.jit(jax.grad(loss_fn))(theta)
    # by hand: d logp_bt / d theta_v = (1[v = x_bt] - softmax_v) * feats_bt, so the gradient of the loss
    # sum_bt m_bt (-A_b r_bt) at r = 1 is sum_bt (-A_b m_bt) (onehot - p)_bt outer feats_bt
    f = np.asarray(feats, np.float64)
    logits = f @ np.asarray(theta, np.float64).T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dlogp_dlogits = np.eye(V)[np.asarray(tokens)] - p                        # [B, T, V]
    weight = -np.asarray(adv)[:, None] * np.asarray(mask)                    # [B, T]
    expected = np.einsum("bt,btv,btd->vd", weight, dlogp_dlogits, f)
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-6)
    # and per token: d loss / d logp = -A on masked-in tokens
    g_logp = jax.grad(lambda lp: aggregate_loss(clipped_surrogate(lp, old, adv)[0], mask, "token-mean")[0])(old)
    np.testing.assert_allclose(g_logp, -adv[:, None] * mask, rtol=1e-6)


def test_clipped_tokens_have_no_gradient():
    logp, old, adv = _example()
    g = jax.grad(lambda lp: jnp.sum(clipped_surrogate(lp, old, adv, clip_ratio_c=1.4)[0]))(logp)
    # token 0: clipped high -> 0; token 1: dual-clipped -> 0; token 2: -A r = -0.5; token 3: clipped low -> 0
    np.testing.assert_allclose(g, [[0.0, 0.0, -0.5, 0.0, 0.0]], atol=1e-7)


# --- aggregation -----------------------------------------------------------------------------------------
def _agg_reference(per_token, mask, mode):
    per_token, mask = np.asarray(per_token, np.float64), np.asarray(mask, np.float64)
    rows = [b for b in range(per_token.shape[0]) if mask[b].sum() > 0]
    if mode == "token-mean":
        return (per_token * mask).sum(), mask.sum()
    if mode == "seq-mean-token-mean":
        return sum((per_token[b] * mask[b]).sum() / mask[b].sum() for b in rows), len(rows)
    return sum((per_token[b] * mask[b]).sum() for b in rows), len(rows)


def test_aggregation_by_hand():
    per_token = jnp.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 9.0, 9.0, 9.0]])
    mask = jnp.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    s, d = aggregate_loss(per_token, mask, "token-mean")
    assert (float(s), float(d)) == (1 + 2 + 5 + 6 + 7 + 8, 6)
    s, d = aggregate_loss(per_token, mask, "seq-mean-token-mean")
    assert (float(s), float(d)) == (1.5 + 6.5, 2)          # row means 1.5 and 6.5; the empty row is not a row
    s, d = aggregate_loss(per_token, mask, "seq-mean-token-sum")
    assert (float(s), float(d)) == (3 + 26, 2)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        np.testing.assert_allclose(aggregate_loss(per_token, mask, mode), _agg_reference(per_token, mask, mode))
    # masked-out garbage does not leak into the value
    garbage = per_token.at[0, 3].set(jnp.nan).at[2, 0].set(jnp.inf)
    assert float(aggregate_loss(garbage, mask, "token-mean")[0]) == 29.0


def test_unknown_mode_and_kind_list_valid_ones():
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean, seq-mean-token-sum"):
        aggregate_loss(jnp.zeros((1, 2)), jnp.ones((1, 2)), "token-sum")
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(jnp.zeros(2), jnp.zeros(2), "k4")
    with pytest.raises(ValueError, match="mask has shape"):
        aggregate_loss(jnp.zeros((2, 3)), jnp.ones((2, 4)), "token-mean")
    with pytest.raises(ValueError, match="needs ref_logp"):
        policy_loss(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.zeros(1), jnp.ones((1, 2)), kl_coef=0.1)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        clipped_surrogate(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.zeros(1), clip_ratio_c=0.5)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batches_sum_to_the_full_batch(mode):
    rng = np.random.default_rng(1)
    B, T = 6, 8
    # dyadic values (k / 8): every partial sum is exact in float32, so the split must match bit for bit
    per_token = jnp.asarray(rng.integers(-40, 40, size=(B, T)) / 8.0, jnp.float32)
    mask = jnp.asarray(rng.random((B, T)) < 0.6, jnp.float32).at[4].set(0.0)   # one empty row
    full = aggregate_loss(per_token, mask, mode)
    parts = [aggregate_loss(per_token[:2], mask[:2], mode), aggregate_loss(per_token[2:], mask[2:], mode)]
    if mode != "seq-mean-token-mean":   # row means k/8/n are not dyadic; compare those to 1 ulp below
        assert float(full[0]) == float(parts[0][0] + parts[1][0])
    assert float(full[1]) == float(parts[0][1] + parts[1][1])
    np.testing.assert_allclose(float(mean_from_sum(*full)),
                               float(mean_from_sum(parts[0][0] + parts[1][0], parts[0][1] + parts[1][1])), rtol=1e-7)

    # and gradient accumulation through policy_loss: sum_k grad(sum_k) / sum_k denom_k == grad(full loss)
    logp = jnp.asarray(rng.normal(size=(B, T)) * 0.3 - 2.0, jnp.float32)
    old = logp + jnp.asarray(rng.normal(size=(B, T)) * 0.2, jnp.float32)
    ref = logp + jnp.asarray(rng.normal(size=(B, T)) * 0.2, jnp.float32)
    adv = jnp.asarray(rng.normal(size=(B,)), jnp.float32)

    @jax.jit   # one compilation per micro-batch shape instead of one per eager op
    def sum_denom_and_grad(lp, o, a, m, r):
        def loss_sum(x):
            s, d, _ = policy_loss(x, o, a, m, ref_logp=r, kl_coef=0.1, mode=mode, clip_ratio_c=3.0)
            return s, d
        (s, d), g = jax.value_and_grad(loss_sum, has_aux=True)(lp)
        return s, d, g

    parts = [sum_denom_and_grad(logp[sl], old[sl], adv[sl], mask[sl], ref[sl]) for sl in (slice(0, 3), slice(3, None))]
    g_acc = jnp.concatenate([g for _, _, g in parts]) / (parts[0][1] + parts[1][1])
    s_full, d_full, g_sum_full = sum_denom_and_grad(logp, old, adv, mask, ref)
    np.testing.assert_allclose(float(parts[0][0] + parts[1][0]), float(s_full), rtol=1e-6)
    np.testing.assert_allclose(g_acc, g_sum_full / d_full, rtol=1e-6, atol=1e-8)


# --- policy_loss, entropy, SFT ---------------------------------------------------------------------------
def test_policy_loss_by_hand():
    logp, old, adv = _example()
    mask = jnp.array([[1, 1, 1, 1, 0]])
    ref = logp - 0.5                               # k1 = 0.5 on every token
    total, denom, m = policy_loss(logp, old, adv, mask, ref_logp=ref, kl_coef=0.1, kl_kind="k1",
                                  mode="token-mean", clip_ratio_c=1.4)
    # surrogate on the 4 masked tokens: -1.2, 1.4, -0.5, 0.8 -> sum 0.5; KL: 0.1 * 0.5 * 4 = 0.2
    np.testing.assert_allclose(float(total), 0.5 + 0.2, rtol=1e-6)
    assert float(denom) == 4.0
    np.testing.assert_allclose(float(m["loss/pg"]), 0.5 / 4, rtol=1e-6)
    np.testing.assert_allclose(float(m["kl/mean"]), 0.5, rtol=1e-6)
    np.testing.assert_allclose(float(m["loss/kl"]), 0.05, rtol=1e-6)
    np.testing.assert_allclose(float(m["ratio/mean"]), (1.5 + 1.5 + 0.5 + 0.5) / 4, rtol=1e-6)
    np.testing.assert_allclose(float(m["ratio/max"]), 1.5, rtol=1e-6)   # the masked 3.0 is not counted
    np.testing.assert_allclose(float(m["ratio/min"]), 0.5, rtol=1e-6)
    assert float(m["clip/frac_high"]) == 0.25 and float(m["clip/frac_low"]) == 0.25
    assert float(m["clip/frac_dual"]) == 0.25
    np.testing.assert_allclose(float(m["ppo_kl/mean"]), -(2 * LN(1.5) + 2 * LN(0.5)) / 4, rtol=1e-6)
    assert float(m["tokens"]) == 4.0 and float(m["advantage/mean"]) == 0.0


def test_policy_loss_jits():
    logp, old, adv = _example()
    mask = jnp.ones((1, 5))
    f = jax.jit(lambda a, b, c, d: policy_loss(a, b, c, d, ref_logp=a, kl_coef=0.001, mode="seq-mean-token-mean"))
    total, denom, metrics = f(logp, old, adv[:, 0] * 0 + 1.0, mask)
    assert float(denom) == 1.0 and np.isfinite(float(total)) and float(metrics["kl/mean"]) == 0.0


def test_entropy_matches_scipy():
    from scipy import stats
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(2, 3, 11)) * 3
    expected = stats.entropy(np.exp(logits - logits.max(-1, keepdims=True)), axis=-1)
    np.testing.assert_allclose(entropy_from_logits(jnp.asarray(logits)), expected, rtol=1e-5)
    masked = jnp.array([0.0, 0.0, -jnp.inf])       # two equal options: ln 2, the -inf entry contributes 0
    np.testing.assert_allclose(float(entropy_from_logits(masked)), math.log(2), rtol=1e-6)
    chunks = jnp.concatenate([entropy_from_logits(jnp.asarray(logits[:, i:i + 1])) for i in range(3)], axis=1)
    np.testing.assert_allclose(chunks, expected, rtol=1e-5)


def test_sft_loss_and_masked_mean():
    logp = jnp.array([[-1.0, -2.0, -3.0], [-0.5, -0.25, -9.0]])
    mask = jnp.array([[1, 1, 0], [1, 1, 0]])
    s, d = sft_loss(logp, mask)
    assert (float(s), float(d)) == (3.75, 4.0)
    s, d = sft_loss(logp, mask, mode="seq-mean-token-mean")
    assert (float(s), float(d)) == (1.5 + 0.375, 2.0)
    assert float(masked_mean(logp, mask)) == -3.75 / 4
    assert float(mean_from_sum(jnp.float32(0.0), jnp.float32(0.0))) == 0.0

"""GRPO / HRPO advantages against hand-computed values."""

import math

import numpy as np
import pytest

from searchjax.rl.advantages import apply_group_overrides, grpo_advantages, hrpo_advantages


def test_grpo_hand_values():
    # group "a": rewards 1, 0, 0, 1 -> mean 0.5, unbiased std = sqrt(4 * 0.25 / 3) = sqrt(1/3)
    # group "b": rewards 2, 4 -> mean 3, unbiased std = sqrt((1 + 1) / 1) = sqrt(2)
    rewards = [1.0, 2.0, 0.0, 0.0, 4.0, 1.0]
    groups = ["a", "b", "a", "a", "b", "a"]
    eps = 1e-6
    sa, sb = math.sqrt(1 / 3), math.sqrt(2)
    expected = [0.5 / (sa + eps), -1 / (sb + eps), -0.5 / (sa + eps), -0.5 / (sa + eps), 1 / (sb + eps), 0.5 / (sa + eps)]
    adv = grpo_advantages(rewards, groups)
    assert adv.dtype == np.float32 and adv.shape == (6,)
    np.testing.assert_allclose(adv, expected, rtol=1e-6)


def test_grpo_without_std_and_edge_groups():
    rewards = np.array([1.0, 0.0, 0.0, 7.0, 0.3, 0.3, 0.3])
    groups = np.array([0, 0, 0, 1, 2, 2, 2])
    # group 0: mean 1/3 -> 2/3, -1/3, -1/3; group 1 has one member -> 0; group 2 has no spread -> exactly 0
    adv = grpo_advantages(rewards, groups, scale_by_std=False)
    np.testing.assert_allclose(adv, [2 / 3, -1 / 3, -1 / 3, 0, 0, 0, 0], rtol=1e-6, atol=0)
    adv_std = grpo_advantages(rewards, groups)
    assert adv_std[3] == 0.0 and np.all(adv_std[4:] == 0.0)
    # tuples as ids (e.g. (data_source, index)) work; same content as the integer ids
    tuple_ids = [("nq", 0)] * 3 + [("hotpot", 0)] + [("nq", 1)] * 3
    np.testing.assert_array_equal(grpo_advantages(rewards, tuple_ids), adv_std)


def test_grpo_matches_scipy_zscore():
    from scipy import stats
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=40)
    groups = np.repeat(np.arange(8), 5)
    adv = grpo_advantages(rewards, groups, epsilon=0.0)
    expected = np.concatenate([stats.zscore(rewards[g * 5:(g + 1) * 5], ddof=1) for g in range(8)])
    np.testing.assert_allclose(adv, expected, rtol=1e-5)


def test_hrpo_groups_by_hop_across_batch():
    # Dr.Free eq. 9: hop 1 -> rewards 0.2, 0.8, 0.5 (mean 0.5, std sqrt((0.09+0.09+0)/2) = 0.3);
    # hop 2 -> rewards 1.0, 0.0 (mean 0.5, std sqrt(0.5)); hop 3 -> one question -> 0
    rewards = [0.2, 1.0, 0.8, 0.9, 0.5, 0.0]
    hops = [1, 2, 1, 3, 1, 2]
    eps = 1e-6
    expected = [-0.3 / (0.3 + eps), 0.5 / (math.sqrt(0.5) + eps), 0.3 / (0.3 + eps), 0.0, 0.0,
                -0.5 / (math.sqrt(0.5) + eps)]
    np.testing.assert_allclose(hrpo_advantages(rewards, hops), expected, rtol=1e-5, atol=1e-7)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="group_ids has 2 entries"):
        grpo_advantages([1.0, 2.0, 3.0], [0, 1])
    with pytest.raises(ValueError, match="non-finite"):
        grpo_advantages([1.0, float("nan")], [0, 0])
    with pytest.raises(ValueError, match=r"hops\[1\]"):
        hrpo_advantages([1.0, 2.0], [1, 1.5])
    with pytest.raises(ValueError, match="1-D"):
        grpo_advantages([[1.0]], [0])


def test_apply_group_overrides():
    rewards = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    groups = ["q1", "q1", "q1", "q2", "q2", "q2"]
    adv = grpo_advantages(rewards, groups)
    fallback = 0.1 * grpo_advantages([0.5, 0.0, 1.0], ["q2"] * 3)   # EviBack-style: lambda * z-score
    out = apply_group_overrides(adv, groups, {"q2": fallback})
    np.testing.assert_array_equal(out[:3], adv[:3])                   # untouched group: bit for bit
    np.testing.assert_array_equal(out[3:], fallback)
    # z-scores of (0.5, 0, 1): mean 0.5, std 0.5 -> (0, -1, 1) * 0.1
    np.testing.assert_allclose(out[3:], [0.0, -0.1, 0.1], atol=1e-6)
    with pytest.raises(ValueError, match="has 3 members"):
        apply_group_overrides(adv, groups, {"q1": [1.0, 2.0]})
    with pytest.raises(ValueError, match="not in group_ids"):
        apply_group_overrides(adv, groups, {"q9": [0.0]})

"""Host-side pieces of the loop: EM/F1 rewards, the advantage estimators on trajectory metadata, the data stream."""

import numpy as np
import pytest
from trainer_fakes import TestPrompt, TestTrajectory

from searchjax.rewards.base import RewardOutput, exact_match_reward, f1_reward
from searchjax.experiment import loop


def _trajectory(uid, answer, golds=("Barack Obama",), hops=0):
    return TestTrajectory(prompt=TestPrompt(uid=uid, question=uid, golden_answers=tuple(golds), hops=hops),
                          sample_index=0, prompt_ids=[1], response_ids=[2], loss_mask=[1], sampler_logprobs=[0.0],
                          answer=answer)


def test_exact_match_and_f1_rewards_against_hand_values():
    trajs = [_trajectory("a", "barack obama"), _trajectory("a", "The Barack Obama."), _trajectory("a", "Obama"),
             _trajectory("a", None), _trajectory("b", "paris", golds=("Paris", "Paris, France"))]
    em = exact_match_reward(trajs)
    np.testing.assert_array_equal(em.rewards, [1, 1, 0, 0, 1])
    assert em.rewards.dtype == np.float32 and em.metrics == pytest.approx({"mean": 0.6, "answered": 0.8})
    f1 = f1_reward(trajs)
    # "obama" vs "barack obama": P = 1, R = 1/2, F1 = 2/3; "paris" vs "paris france" is beaten by "paris".
    np.testing.assert_allclose(f1.rewards, [1, 1, 2 / 3, 0, 1], rtol=1e-6)


def test_reward_output_validates():
    with pytest.raises(ValueError, match="non-finite"):
        RewardOutput(rewards=np.array([0.0, np.nan]))
    with pytest.raises(ValueError, match=r"\[N\]"):
        RewardOutput(rewards=np.zeros((2, 2)))


def test_estimators_group_by_prompt_metadata():
    cfg = type("Cfg", (), {"epsilon": 1e-6, "scale_by_std": True})()
    trajs = [_trajectory("q1", "x", hops=1), _trajectory("q1", "x", hops=2), _trajectory("q2", "x", hops=1),
             _trajectory("q2", "x", hops=2)]
    rewards = np.array([1.0, 0.0, 0.0, 0.0], np.float32)
    # GRPO by uid: q1 = {1, 0} -> +-(0.5 / std), std = sqrt(0.5) (unbiased); q2 has no spread -> 0.
    z = 0.5 / (np.sqrt(0.5) + 1e-6)
    np.testing.assert_allclose(loop.grpo_estimator(rewards, trajs, cfg), [z, -z, 0, 0], rtol=1e-6)
    # HRPO by hop count: hops 1 = {1, 0} (trajectories 0 and 2), hops 2 = {0, 0}.
    np.testing.assert_allclose(loop.hrpo_estimator(rewards, trajs, cfg), [z, 0, -z, 0], rtol=1e-6)


def test_prompt_stream_is_a_seeded_permutation_per_epoch():
    prompts = list(range(5))
    seen, position = [], 0
    for _ in range(5):
        batch, position = loop.prompt_batch(prompts, position, 3, seed=7)
        seen += batch
    assert position == 15
    assert sorted(seen[:5]) == sorted(seen[5:10]) == sorted(seen[10:15]) == prompts
    assert seen[:5] != seen[5:10]  # a fresh order each epoch
    again, _ = loop.prompt_batch(prompts, 6, 3, seed=7)  # resuming from a position gives the same prompts
    assert again == seen[6:9]


def test_a_batch_spanning_two_epochs_never_repeats_a_prompt():
    """3,610 questions at 512 per step: the unadjusted per-epoch permutations put the same question twice into
    a step that crosses an epoch boundary (two GRPO groups under one id). Every step must hold distinct prompts,
    every epoch must still be a permutation, and batch_size > n is refused."""
    n, batch = 3610, 512
    prompts = list(range(n))
    stream, position = [], 0
    for _ in range(40):
        step, position = loop.prompt_batch(prompts, position, batch, seed=0)
        assert len(set(step)) == batch
        stream += step
    for epoch in range(len(stream) // n):
        assert sorted(stream[epoch * n:(epoch + 1) * n]) == prompts
    collisions = 0
    for start in range(0, len(stream), batch):  # the plain permutations would collide: the check can fail
        plain = [int(np.random.default_rng([0, p // n]).permutation(n)[p % n]) for p in range(start, start + batch)]
        collisions += len(plain) != len(set(plain))
    assert collisions > 0
    with pytest.raises(ValueError, match="at least 4 distinct"):
        loop.prompt_batch(list(range(3)), 0, 4, seed=0)

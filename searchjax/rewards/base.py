"""The reward interface of the trainer, and the Search-R1 outcome rewards (EM, F1) behind it.

A reward is a plain function of a batch of trajectories (prompt-major, `group_size` per prompt, as
`searchjax.agent.rollout.rollout` returns them):

    RewardFn = Callable[[list[Trajectory]], RewardOutput]

It returns one scalar reward per trajectory and, optionally, advantages for whole groups that override
the estimator's (EviBack's fallback for groups whose G rollouts all score EM = 0; CCS failures), keyed
by the group uid `trajectory.prompt.uid`, plus scalar metrics that the loop logs under "reward/".

Search-R1 (Jin et al. 2025, eq. 4) trains with the rule-based outcome reward

    r_phi(x, y) = EM(a_pred, a_gold)

where a_pred is the content of the last <answer>...</answer> of the response (`extract_answer`) and EM is
SQuAD-normalised exact match against any gold answer; `f1_reward` swaps in SQuAD token F1. A trajectory
without an answer scores 0.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from searchjax.rewards.qa import exact_match, f1_score

if TYPE_CHECKING:  # the rollout module imports the reward types' users, not the other way round
    from searchjax.agent.rollout import Trajectory


class NonFiniteRewardError(ValueError):
    """A reward function produced NaN or infinite rewards; the train loop skips such a step and counts it."""


@dataclasses.dataclass
class RewardOutput:
    """What a reward function returns for N trajectories.

    rewards: [N] float32, one per trajectory, in the trajectories' order.
    advantage_overrides: group uid -> [group size] advantages that replace the estimator's for that
        group (in the group's batch order); applied by `searchjax.rl.advantages.apply_group_overrides`.
    metrics: scalar diagnostics, logged by the loop as "reward/<name>".
    """

    rewards: np.ndarray
    advantage_overrides: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        rewards = np.asarray(self.rewards, dtype=np.float32)
        if rewards.ndim != 1:
            raise ValueError(f"RewardOutput.rewards must be [N], got shape {rewards.shape}")
        if not np.all(np.isfinite(rewards)):
            bad = np.flatnonzero(~np.isfinite(rewards))[:10].tolist()
            raise NonFiniteRewardError(f"RewardOutput.rewards has non-finite values at indices {bad}")
        self.rewards = rewards


RewardFn = Callable[[Sequence["Trajectory"]], RewardOutput]


def _answer_reward(trajectories: Sequence["Trajectory"], metric: Callable, name: str) -> RewardOutput:
    if not trajectories:
        raise ValueError(f"{name}: no trajectories")
    rewards = np.asarray([metric(t.answer, t.prompt.golden_answers) for t in trajectories], np.float32)
    answered = np.asarray([t.answer is not None for t in trajectories], np.float32)
    return RewardOutput(rewards=rewards, metrics={"mean": float(rewards.mean()),
                                                  "answered": float(answered.mean())})


def exact_match_reward(trajectories: Sequence["Trajectory"]) -> RewardOutput:
    """Search-R1's outcome reward: EM(trajectory.answer, prompt.golden_answers) in {0, 1}; 0 without answer."""
    return _answer_reward(trajectories, exact_match, "exact_match_reward")


def f1_reward(trajectories: Sequence["Trajectory"]) -> RewardOutput:
    """SQuAD token F1 of trajectory.answer against prompt.golden_answers, in [0, 1]; 0 without answer."""
    return _answer_reward(trajectories, f1_score, "f1_reward")

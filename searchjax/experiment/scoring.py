"""Scoring one RL step (searchjax/experiment/loop.py, steps 3-5): rewards, advantages, the padded batch and
the old policy's log-probs, in the order the reward needs them.

Most rewards read only the trajectories (answers, queries, retrieved passages, judge verdicts), so the step
scores first, computes the advantages, pads the batch with them and then recomputes the old policy's
log-probs on it. A reward with `needs_self_certainty` (RLIF, searchjax/rewards/rlif.py, or a composition
holding it) reads the policy's own next-token distributions, which only the old-policy pass sees. For it
the order turns round: the batch is padded first (advantages 0), the old-policy pass returns the log-probs
AND the per-token self-certainty from the same forward (`searchjax.rewards.rlif.batch_logprobs_and_certainty`
in place of `searchjax.rl.trainer.batch_logprobs`), the reward gets each trajectory's values over its
response tokens (`self_certainty=`), and the advantages are written into the batch afterwards. Either way
the step runs one old-policy forward per micro-batch (plus the reference's when kl_coef > 0), and the loss
uses the log-probs of that forward.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from searchjax.rewards.base import NonFiniteRewardError, RewardOutput
from searchjax.rl import advantages as adv_lib
from searchjax.rl import batching


def needs_self_certainty(reward_fn) -> bool:
    """Whether `reward_fn` must be called with `self_certainty=` from the old-policy pass (RLIF)."""
    return bool(getattr(reward_fn, "needs_self_certainty", False))


def score(reward_fn, trajectories, **extras) -> tuple[RewardOutput, str]:
    """(reward output, "" or why the rewards are not finite). A reward function whose output was refused for
    non-finite values yields NaN rewards for every trajectory and the refusal as the reason. `extras` are
    the old-policy pass's statistics a reward asks for (self_certainty)."""
    try:
        return reward_fn(trajectories, **extras), ""
    except NonFiniteRewardError as e:  # RewardOutput refuses non-finite rewards (searchjax/rewards/base.py)
        placeholder = RewardOutput(rewards=np.zeros(len(trajectories), np.float32))
        placeholder.rewards = np.full(len(trajectories), np.nan, np.float32)  # unknown: logged as non-finite
        return placeholder, f"non-finite reward ({e})"


def step_advantages(advantage_fn: Callable, reward: RewardOutput, trajectories: Sequence, cfg) -> np.ndarray:
    """The estimator's advantages (config.advantage), then the reward's per-group overrides (EviBack's backoff
    replaces an all-zero group's advantages)."""
    advantages = advantage_fn(np.asarray(reward.rewards), trajectories, cfg)
    if reward.advantage_overrides:
        advantages = adv_lib.apply_group_overrides(advantages, [t.prompt.uid for t in trajectories],
                                                   reward.advantage_overrides)
    return advantages


def step_batch(trajectories: Sequence, advantages: np.ndarray, config, pad_id: int) -> tuple[dict, int]:
    """(the step's padded batch, its loss columns `tail`): config.batch's length buckets, rows a multiple of
    the mini-batch size (searchjax.rl.batching)."""
    batch = batching.make_batch(trajectories, advantages, pad_id=pad_id, prompt_buckets=config.batch.prompt_buckets,
                                response_buckets=config.batch.response_buckets,
                                row_multiple=config.batch.mini_batch_size)
    return batch, batching.loss_columns(batch)


def make_certainty_fn(reward_fn, model, temperature: float, *, mesh=None, param_shardings=None) -> Callable | None:
    """The jitted old-policy pass with self-certainty when `reward_fn` needs it (else None: the trainer's
    log-prob function does the pass)."""
    if not needs_self_certainty(reward_fn):
        return None
    from searchjax.rewards import rlif
    return rlif.make_logprob_certainty_fn(model, temperature, mesh=mesh, param_shardings=param_shardings)


def certainty_pass(certainty_fn: Callable, params, batch: dict, trajectories: Sequence, micro_batch_size: int, mesh,
                   *, tail: int) -> tuple[np.ndarray, dict]:
    """The old-policy pass for a reward that reads self-certainty: (old log-probs [B, T - 1], the reward's
    keyword arguments), one forward per micro-batch. self_certainty holds one array per trajectory, over its
    response tokens (`searchjax.rewards.rlif.response_values`)."""
    from searchjax.rewards import rlif
    old, certainty = rlif.batch_logprobs_and_certainty(certainty_fn, params, batch, micro_batch_size, mesh, tail=tail)
    return old, {"self_certainty": rlif.response_values(certainty, batch, trajectories)}

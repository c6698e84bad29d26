"""Dr.Zero's difficulty-guided proposer reward (the ablation baseline of Dr.Free).

The solver answers a proposed question in n multi-turn search rollouts (n = 5); c of them are correct.

    difficulty = 0                    if c = 0 (unsolvable, or a wrong proposed answer) or c = n (too easy)
               = (n - c) / (n - 1)    otherwise (1 when a single rollout succeeds, 1/(n-1) when all but one do)
    reward     = 0.5 * format + difficulty

`format` is the proposer's format score (e.g. `searchjax.rewards.information_gain.format_score`).

`difficulty_reward_fn` is the trainer reward (trajectories -> RewardOutput) for Dr.Free's ablation: each
proposer reply (prompted by a chain, `searchjax.drfree.proposer.chain_prompt`) gets format = the Dr.Free
format score against the chain's answer; every reply with integrity (format > 0: a question and an
answer not inside it) becomes a solver question whose gold answer is the proposed one, and the solver
answers all of them in ONE `searchjax.agent.rollout.rollout` call of n = `rollout_cfg.group_size`
multi-turn search rollouts each; c = rollouts whose answer exact-matches (SQuAD-normalised) the proposed
answer. Replies without integrity get difficulty 0 (nothing to solve). Unlike Dr.Zero, the proposer
itself does not search (our proposer reads its chain's passages instead).
"""

from __future__ import annotations

import time
import zlib
from typing import Sequence

import numpy as np

from searchjax.agent.rollout import Prompt, RolloutConfig, Trajectory, rollout
from searchjax.drfree.proposer import chain_of, parse_proposer_output
from searchjax.rewards.base import RewardOutput
from searchjax.rewards.information_gain import format_score
from searchjax.rewards.qa import exact_match

DEFAULT_NUM_ROLLOUTS = 5
FORMAT_WEIGHT = 0.5


def difficulty_score(num_correct, num_rollouts: int = DEFAULT_NUM_ROLLOUTS):
    """(n - c) / (n - 1) for 0 < c < n, else 0. Scalar -> float; array [N] -> float64 [N]."""
    if num_rollouts < 2:
        raise ValueError(f"difficulty_score: num_rollouts must be >= 2, got {num_rollouts}")
    c = np.asarray(num_correct)
    if not np.issubdtype(c.dtype, np.integer):
        if not np.all(np.equal(np.mod(c, 1), 0)):
            raise ValueError(f"difficulty_score: num_correct must be whole numbers, got {num_correct!r}")
        c = c.astype(np.int64)
    if np.any(c < 0) or np.any(c > num_rollouts):
        raise ValueError(f"difficulty_score: num_correct must be in [0, {num_rollouts}], got {num_correct!r}")
    n = num_rollouts
    score = np.where((c == 0) | (c == n), 0.0, (n - c) / (n - 1))
    return float(score) if score.ndim == 0 else score


def difficulty_reward(format_score, num_correct, num_rollouts: int = DEFAULT_NUM_ROLLOUTS):
    """Dr.Zero's proposer reward: 0.5 * format_score + difficulty_score(num_correct, num_rollouts)."""
    reward = FORMAT_WEIGHT * np.asarray(format_score, dtype=np.float64) + difficulty_score(num_correct, num_rollouts)
    return float(reward) if np.ndim(reward) == 0 else reward


def rollout_seed(trajectories: Sequence[Trajectory], base_seed: int = 0) -> int:
    """A sampling seed that is a function of the proposer batch (its response tokens) and base_seed, so a
    resumed run draws the same solver rollouts as an uninterrupted one without any reward-side state."""
    digest = zlib.crc32(np.asarray([base_seed] + [i for t in trajectories for i in (*t.response_ids, -1)],
                                   np.int64).tobytes())
    return int(digest & 0x7FFFFFFF)


def difficulty_reward_fn(trajectories: Sequence[Trajectory], *, model, params, tokenizer, retriever,
                         rollout_cfg: RolloutConfig, base_seed: int = 0, logits_fn=None):
    """Dr.Zero's proposer reward for a batch of proposer trajectories: 0.5 * format + difficulty (module doc).

    model/params/tokenizer: the solver; retriever: its search engine; rollout_cfg: the solver's rollout
    settings (group_size = n rollouts per question, search on); logits_fn: optional stand-in for the
    solver's logits (scripted tests).
    """
    trajectories = list(trajectories)
    if not trajectories:
        raise ValueError("difficulty_reward_fn: no trajectories")
    n = int(rollout_cfg.group_size)
    formats = np.asarray([format_score(t.response_text, chain_of(t)["answer"]) for t in trajectories])
    solvable = [i for i, f in enumerate(formats) if f > 0]
    prompts = []
    for i in solvable:
        parsed = parse_proposer_output(trajectories[i].response_text)
        t = trajectories[i]
        prompts.append(Prompt(uid=f"{t.prompt.uid}#{t.sample_index}", question=parsed.question,
                              golden_answers=(parsed.answer,), data_source="proposer", hops=t.prompt.hops))
    correct = np.zeros(len(trajectories), np.int64)
    solved = []
    start = time.perf_counter()
    if prompts:
        solved = rollout(model, params, tokenizer, retriever, prompts, rollout_cfg,
                         seed=rollout_seed(trajectories, base_seed), logits_fn=logits_fn)
        for k, i in enumerate(solvable):  # rollout returns prompt-major groups of n
            group = solved[k * n:(k + 1) * n]
            correct[i] = sum(int(exact_match(s.answer, prompts[k].golden_answers)) for s in group)
    solver_seconds = time.perf_counter() - start
    rewards = difficulty_reward(formats, correct, n)
    c = correct[solvable]
    mean = lambda x: float(np.mean(x)) if np.size(x) else 0.0  # noqa: E731
    metrics = {"proposer/format_mean": float(formats.mean()), "difficulty/questions": float(len(solvable)),
               "difficulty/solve_rate": mean(c / n), "difficulty/all_correct_rate": mean(c == n),
               "difficulty/none_correct_rate": mean(c == 0), "difficulty/score_mean": mean(difficulty_score(c, n)),
               "difficulty/solver_rollouts": float(len(solvable) * n), "difficulty/solver_seconds": solver_seconds,
               "difficulty/solver_response_tokens": mean([len(s.response_ids) for s in solved]),
               "difficulty/solver_searches": mean([s.num_searches for s in solved])}
    return RewardOutput(rewards=np.asarray(rewards, np.float32), metrics=metrics)


def make_difficulty_reward(model, params, tokenizer, retriever, rollout_cfg: RolloutConfig, *, base_seed: int = 0,
                           logits_fn=None):
    """A trainer RewardFn (trajectories -> RewardOutput) with the solver, retriever and rollout settings bound."""
    if int(rollout_cfg.group_size) < 2:
        raise ValueError(f"make_difficulty_reward: the solver needs n >= 2 rollouts per question (rollout_cfg."
                         f"group_size), got {rollout_cfg.group_size}")
    if not rollout_cfg.search:
        raise ValueError("make_difficulty_reward: the solver's rollouts search (rollout_cfg.search=True)")

    def reward_fn(trajectories):
        return difficulty_reward_fn(trajectories, model=model, params=params, tokenizer=tokenizer, retriever=retriever,
                                    rollout_cfg=rollout_cfg, base_seed=base_seed, logits_fn=logits_fn)
    return reward_fn

"""TTRL (Zuo et al. 2025, "TTRL: Test-Time Reinforcement Learning", arXiv:2504.16084): the majority vote of a
group as its pseudo-label, a gold-free baseline of Cycle-Consistent Search (CCS).

TTRL samples N answers y_1..y_N to an unlabelled question x, takes the majority-voted answer as the
estimated label and rewards agreement with it (the paper's rule-based reward):

    y* = argmax_y  sum_{i=1}^{N} 1[y_i = y]                 (majority voting over the extracted answers)
    r(y_i, y*) = 1  if y_i = y*,  else 0

and trains on the evaluation set's own questions, without their labels. Our choices (each tested in
tests/ccs/test_unsupervised_rewards.py):

* The voters are the G rollouts of one GRPO group (the same question), and y_i is the trajectory's
  extracted answer (`qa.extract_answer`: the last <answer> block) under SQuAD normalisation
  (`qa.normalize_answer`), so "Paris", "paris." and "The Paris" are one vote.
* A rollout without an answer (None) or whose answer normalises to "" does not vote and gets r = 0.
* Ties are broken deterministically: among the answers with the most votes, the one that appears first in
  the group's order (sample index order) wins (`searchjax.eval.metrics.ttrl_vote`, the vote every metric of
  the project uses). Tie groups are counted (`ttrl/tie_groups`), because the winner is arbitrary there.
* A group in which nobody answered has no label: every reward is 0, so GRPO gives the group zero
  advantages (a zero-signal group, counted in `ttrl/no_vote_groups`; never an error).
* Gold-free: the reward never reads `prompt.golden_answers`. The metric `ttrl/label_exact_match` (EM of the
  vote against the golds, where the data has them) is a diagnostic for the log only, like CCS's.

Training "per evaluation set", as the paper does, is a config choice: data.train is that set's questions
(configs/ccs.py, variants ttrl_<set>).
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Sequence

import numpy as np

from searchjax.eval.metrics import ttrl_rewards, ttrl_vote
from searchjax.rewards.base import RewardOutput
from searchjax.rewards.qa import exact_match, normalize_answer

if TYPE_CHECKING:
    from searchjax.agent.rollout import Trajectory


def vote_counts(answers: Sequence[str | None]) -> collections.Counter:
    """Votes per normalised answer (None and answers normalising to "" do not vote)."""
    return collections.Counter(key for key in (normalize_answer(a) for a in answers if a is not None) if key)


def ttrl_reward(trajectories: Sequence["Trajectory"]) -> RewardOutput:
    """Per group (prompt.uid): y* = ttrl_vote(answers), r_i = [normalize(answer_i) = y*]; see the module docstring."""
    if not trajectories:
        raise ValueError("ttrl: no trajectories")
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(trajectories):
        groups.setdefault(t.prompt.uid, []).append(i)
    rewards = np.zeros(len(trajectories), np.float32)
    no_vote = ties = 0
    majority, label_em = [], []
    for members in groups.values():
        answers = [trajectories[i].answer for i in members]
        rewards[members] = ttrl_rewards(answers)
        counts = vote_counts(answers)
        if not counts:
            no_vote += 1
            continue
        top = counts.most_common(1)[0][1]
        ties += sum(1 for c in counts.values() if c == top) > 1
        majority.append(top / len(members))
        golds = trajectories[members[0]].prompt.golden_answers
        if golds:
            label_em.append(exact_match(ttrl_vote(answers), golds))
    metrics = {"ttrl/groups": float(len(groups)), "ttrl/no_vote_groups": float(no_vote),
               "ttrl/tie_groups": float(ties),
               "ttrl/majority_fraction": float(np.mean(majority)) if majority else 0.0,
               "ttrl/answered": float(np.mean([t.answer is not None for t in trajectories])),
               "ttrl/label_exact_match": float(np.mean(label_em)) if label_em else 0.0,
               "mean": float(rewards.mean())}
    return RewardOutput(rewards=rewards, metrics=metrics)


def build_ttrl_reward(config, components, workdir):
    """The trainer's reward builder (searchjax.experiment.loop.REWARD_FNS signature); TTRL has no settings."""
    return ttrl_reward

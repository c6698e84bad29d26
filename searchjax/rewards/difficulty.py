"""Dr.Zero's difficulty-guided proposer reward (the ablation baseline of Dr.Free).

The solver answers a proposed question in n multi-turn search rollouts (n = 5); c of them are correct.

    difficulty = 0                    if c = 0 (unsolvable, or a wrong proposed answer) or c = n (too easy)
               = (n - c) / (n - 1)    otherwise (1 when a single rollout succeeds, 1/(n-1) when all but one do)
    reward     = 0.5 * format + difficulty

`format` is the proposer's format score (e.g. `searchjax.rewards.information_gain.format_score`).
"""

from __future__ import annotations

import numpy as np

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

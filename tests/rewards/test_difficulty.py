"""Dr.Zero's difficulty reward against hand-computed values."""

import numpy as np
import pytest

from searchjax.rewards.difficulty import difficulty_reward, difficulty_score


def test_difficulty_by_hand():
    # n = 5: c = 0 and c = 5 give 0; otherwise (5 - c) / 4
    assert [difficulty_score(c) for c in range(6)] == [0.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    np.testing.assert_allclose(difficulty_score(np.array([0, 1, 2, 3])), [0.0, 1.0, 0.75, 0.5])
    assert difficulty_score(1, num_rollouts=3) == 1.0 and difficulty_score(2, num_rollouts=3) == 0.5


def test_difficulty_reward_by_hand():
    assert difficulty_reward(1.0, 2) == pytest.approx(0.5 + 0.75)
    assert difficulty_reward(2 / 3, 5) == pytest.approx(1 / 3)
    assert difficulty_reward(0.0, 0) == 0.0
    np.testing.assert_allclose(difficulty_reward(np.array([1.0, 0.0]), np.array([4, 1])), [0.75, 1.0])


def test_difficulty_bad_input():
    with pytest.raises(ValueError, match=r"\[0, 5\]"):
        difficulty_score(6)
    with pytest.raises(ValueError, match="whole numbers"):
        difficulty_score(1.5)
    with pytest.raises(ValueError, match=">= 2"):
        difficulty_score(0, num_rollouts=1)

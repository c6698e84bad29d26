"""Trajectory metrics and the TTRL vote against hand counts."""

import numpy as np
import pytest

from searchjax.eval.metrics import (TrajectoryRecord, count_duplicate_queries, count_searches, is_valid_answer,
                                    trajectory_metrics, ttrl_rewards, ttrl_vote)


def test_per_trajectory_counts():
    queries = ["capital of France", "  ", "Capital of France?", "the capital of france", "Paris population", ""]
    assert count_searches(queries) == 4                     # the blank queries are not searches
    assert count_duplicate_queries(queries) == 2            # 2nd and 3rd normalise to "capital of france"
    assert count_duplicate_queries(["x y", "y x", "X  Y"]) == 1          # order matters
    assert count_duplicate_queries(["a b", "b a"]) == 1                    # "a" is an article: both are "b"
    assert is_valid_answer("Paris") and not is_valid_answer("  ") and not is_valid_answer(None)


def test_batch_metrics_by_hand():
    records = [
        TrajectoryRecord(queries=("x", "X!", "y"), answer="Paris", forced=False),   # 3 searches, 1 duplicate
        TrajectoryRecord(queries=("a", "b", "c", "d"), answer=None, forced=True),   # 4 searches, forced
        TrajectoryRecord(queries=(), answer="", forced=False),                      # empty answer: not valid
        TrajectoryRecord(queries=("q",), answer=" 42 ", forced=False),
    ]
    m = trajectory_metrics(records)
    assert m["search/mean"] == 8 / 4
    assert m["search/duplicate_rate"] == 1 / 8
    assert m["answer/valid_rate"] == 2 / 4
    assert m["termination/forced_rate"] == 1 / 4
    assert (m["search/total"], m["search/duplicates"], m["trajectories"]) == (8.0, 1.0, 4.0)
    assert trajectory_metrics([TrajectoryRecord()])["search/duplicate_rate"] == 0.0
    with pytest.raises(ValueError, match="no trajectories"):
        trajectory_metrics([])


def test_ttrl_vote_by_hand():
    assert ttrl_vote(["Paris", "paris.", "London", None, "The Paris"]) == "paris"
    assert ttrl_vote(["London", "Paris", "Paris", "London"]) == "london"           # tie -> first appearance
    assert ttrl_vote([None, "Rome", None, "Oslo", "oslo", "rome"]) == "rome"
    assert ttrl_vote([None, None]) is None and ttrl_vote([]) is None
    assert ttrl_vote(["", " the ", "Oslo"]) == "oslo"                              # empty answers are not votes
    np.testing.assert_array_equal(ttrl_rewards(["Paris", "London", "paris!", None]), [1, 0, 1, 0])
    np.testing.assert_array_equal(ttrl_rewards([None, None, None]), [0, 0, 0])
    assert ttrl_rewards(["a"]).dtype == np.float32

"""Trajectory metrics with one meaning everywhere (docs/architecture.md, "Metric definitions"), and the TTRL vote.

A trajectory record is anything with `.queries` (the search queries it issued, in order), `.answer`
(the final extracted answer, or None) and `.forced` (True when it used every searching turn without
answering); `TrajectoryRecord` is the plain version. Definitions:

* searches: executed search calls with a non-empty query (stripped); mean searches = per trajectory,
  averaged over trajectories.
* duplicate-query rate: searches whose normalised query (`normalize_answer`) equals an earlier query of
  the same trajectory, divided by all searches (of the batch: total duplicates / total searches; 0 when
  there are no searches).
* valid-answer rate: trajectories that end with a non-empty <answer>, divided by all trajectories.
* forced-termination rate: trajectories that used every searching turn without answering, divided by all.
* TTRL vote (Zuo et al. 2025, test-time RL): the majority over a group's normalised extracted answers,
  None excluded (and answers that normalise to "", which are not valid answers either); ties go to the
  answer that appeared first; a group with no answer at all gets reward 0 everywhere.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Iterable, Sequence

import numpy as np

from searchjax.rewards.qa import normalize_answer


@dataclasses.dataclass(frozen=True)
class TrajectoryRecord:
    """The fields the metrics read from a trajectory."""

    queries: tuple[str, ...] = ()
    answer: str | None = None
    forced: bool = False


def executed_queries(queries: Iterable[str]) -> list[str]:
    """The queries that count as searches: non-empty after stripping, in order."""
    return [q for q in queries if q.strip()]


def count_searches(queries: Iterable[str]) -> int:
    """Number of searches (non-empty queries) of one trajectory."""
    return len(executed_queries(queries))


def count_duplicate_queries(queries: Iterable[str]) -> int:
    """Searches whose normalised query equals an earlier search's normalised query in the same trajectory."""
    seen: set[str] = set()
    duplicates = 0
    for q in executed_queries(queries):
        key = normalize_answer(q)
        duplicates += key in seen
        seen.add(key)
    return duplicates


def is_valid_answer(answer: str | None) -> bool:
    """True when the trajectory ended with a non-empty <answer> (content non-empty after stripping)."""
    return answer is not None and bool(answer.strip())


def trajectory_metrics(records: Sequence) -> dict[str, float]:
    """Batch metrics: "search/mean", "search/duplicate_rate", "answer/valid_rate", "termination/forced_rate",
    plus the raw counts "search/total", "search/duplicates", "trajectories" (to merge batches exactly)."""
    records = list(records)
    n = len(records)
    if n == 0:
        raise ValueError("trajectory_metrics: no trajectories")
    searches = [count_searches(r.queries) for r in records]
    duplicates = [count_duplicate_queries(r.queries) for r in records]
    total_searches = sum(searches)
    return {
        "search/mean": total_searches / n,
        "search/duplicate_rate": sum(duplicates) / total_searches if total_searches else 0.0,
        "answer/valid_rate": sum(is_valid_answer(r.answer) for r in records) / n,
        "termination/forced_rate": sum(bool(r.forced) for r in records) / n,
        "search/total": float(total_searches),
        "search/duplicates": float(sum(duplicates)),
        "trajectories": float(n),
    }


def ttrl_vote(answers: Sequence[str | None]) -> str | None:
    """Majority normalised answer of a group (None and empty answers excluded; ties -> first seen); None if no answer."""
    counts: collections.Counter[str] = collections.Counter()
    first_seen: dict[str, int] = {}
    for i, a in enumerate(answers):
        if a is None:
            continue
        key = normalize_answer(a)
        if not key:
            continue
        counts[key] += 1
        first_seen.setdefault(key, i)
    if not counts:
        return None
    return max(counts, key=lambda k: (counts[k], -first_seen[k]))


def ttrl_rewards(answers: Sequence[str | None]) -> np.ndarray:
    """TTRL pseudo-label rewards [G] float32: 1 where the normalised answer equals the group's vote, else 0."""
    vote = ttrl_vote(answers)
    if vote is None:
        return np.zeros(len(answers), dtype=np.float32)
    return np.array([a is not None and normalize_answer(a) == vote for a in answers], dtype=np.float32)

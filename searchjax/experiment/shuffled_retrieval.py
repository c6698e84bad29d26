"""The shuffled-retrieval control: a retriever that answers every query with the passages of another question.

A learning run's gain could come from things other than reading what was retrieved: the answer format, the
answer-type prior of a template ("What nationality was X?" -> a nationality), the length of the response. The
control arm trains identically except that retrieval is uninformative about the question asked: each query q is
replaced by a question q' drawn from a pool (the run's training questions), and the retriever's hits for q' are
returned. Form and size of the evidence are unchanged (real passages, the same top-k, the same observation
length); only its relation to the question is broken. If the control learns as much as the real run, the real
run's gain is not evidence of learning to search.

The draw is a fixed function of (seed, query): index = sha256(seed, normalised q) mod |pool|, moved on to the
next pool entry while that entry normalises to q itself (so the substitute is always a different question, also
when the policy searches the question verbatim, as the demonstrations do). A fixed function, not a stream of
random numbers, keeps the control exactly resumable (no sampler state to checkpoint) and independent of the
order of the calls; the same query always gets the same wrong passages, as a real index would give the same
right ones. Normalisation: lower case, whitespace collapsed.
"""

from __future__ import annotations

import hashlib
from typing import Sequence


def _normalise(text: str) -> str:
    return " ".join(str(text).lower().split())


class ShuffledRetriever:
    """`search(queries, topk)`: for each query, the wrapped retriever's hits for `substitute(query)`."""

    def __init__(self, retriever, pool: Sequence[str], seed: int = 0):
        self.pool = [str(q) for q in pool]
        self.keys = [_normalise(q) for q in self.pool]
        if len(set(self.keys)) < 2:
            raise ValueError(f"ShuffledRetriever: the pool needs at least two distinct questions, got "
                             f"{len(set(self.keys))}")
        self.retriever, self.seed = retriever, int(seed)

    def substitute(self, query: str) -> str:
        """The pool question whose passages `query` gets: hash-chosen, never `query` itself (normalised)."""
        key = _normalise(query)
        digest = hashlib.sha256(f"{self.seed}\0{key}".encode("utf-8")).digest()
        index = int.from_bytes(digest[:8], "big") % len(self.pool)
        while self.keys[index] == key:
            index = (index + 1) % len(self.pool)
        return self.pool[index]

    def search(self, queries: Sequence[str], topk: int) -> list:
        return self.retriever.search([self.substitute(q) for q in queries], topk)


def shuffled_from_prompts(retriever, prompts: Sequence, seed: int) -> ShuffledRetriever:
    """The control's retriever for a run whose training prompts are `prompts` (their questions are the pool)."""
    if not prompts:
        raise ValueError("ShuffledRetriever: no training prompts to draw substitute questions from")
    return ShuffledRetriever(retriever, [p.question for p in prompts], seed=seed)

"""BM25 over a list of passages, with `bm25s` (sparse scores precomputed at index time).

Score of passage d for query q (Lucene's variant, as bm25s method="lucene" and Pyserini compute it):

    score(q, d) = sum_{t in q} IDF(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
    IDF(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

(Lucene >= 8 drops the constant (k1 + 1) numerator factor; rankings are unchanged.) |d| counts the
passage's tokens after stop-word removal. Defaults k1 = 0.9, b = 0.4 are Pyserini's, which is what
Search-R1's BM25 retriever runs. Text is lowercased, split on the regex `\\b\\w\\w+\\b` (tokens of two or
more word characters) and English stop words are dropped (bm25s's tokenizer); no stemming, so no
extra dependency. A passage that shares no term with the query has score 0 and is never returned:
a query made only of stop words or unknown words gets an empty hit list (as Pyserini returns no
hits), so lists can be shorter than topk.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import TYPE_CHECKING, Sequence

import numpy as np

from retrieval.corpus import Hit, Passage

if TYPE_CHECKING:
    import bm25s

__all__ = ["BM25Index", "Hit"]

_PARAMS_FILE = "bm25_params.json"


def tokenize(texts: Sequence[str], stopwords: str = "en") -> list[list[str]]:
    """Lowercased word tokens (>= 2 word characters) without English stop words, one list per text."""
    import bm25s   # here, not at module level: bm25s imports jax and scipy (seconds)
    return bm25s.tokenize(list(texts), lower=True, stopwords=stopwords, return_ids=False, show_progress=False)


@dataclasses.dataclass
class BM25Index:
    """An in-memory BM25 index; `search` is safe to call from one thread at a time."""

    passages: list[Passage]
    model: bm25s.BM25
    k1: float
    b: float
    stopwords: str = "en"
    kind: str = "bm25"

    @classmethod
    def build(cls, passages: Sequence[Passage], *, k1: float = 0.9, b: float = 0.4,
              stopwords: str = "en") -> "BM25Index":
        """Index `passages` (title and text both searchable, as wiki-18's `contents`); no files written."""
        passages = list(passages)
        if not passages:
            raise ValueError("BM25Index.build: no passages to index")
        import bm25s
        model = bm25s.BM25(k1=k1, b=b, method="lucene", backend="numpy")
        model.index(tokenize([p.contents for p in passages], stopwords), show_progress=False)
        return cls(passages=passages, model=model, k1=k1, b=b, stopwords=stopwords)

    @property
    def size(self) -> int:
        return len(self.passages)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """For each query, up to `topk` hits with positive score, best first."""
        if isinstance(queries, str):
            raise TypeError("BM25Index.search takes a list of queries, got a single string")
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        k = min(topk, len(self.passages))
        tokens = tokenize(queries, self.stopwords)
        vocab = self.model.vocab_dict
        known = [[t for t in toks if t in vocab] for toks in tokens]
        rows = [i for i, toks in enumerate(known) if toks]
        results: list[list[Hit]] = [[] for _ in queries]
        if not rows:
            return results
        docs, scores = self.model.retrieve([known[i] for i in rows], k=k, show_progress=False,
                                           backend_selection="numpy", n_threads=0)
        for row, doc_row, score_row in zip(rows, np.asarray(docs), np.asarray(scores)):
            results[row] = [Hit.from_passage(self.passages[int(d)], float(s))
                            for d, s in zip(doc_row, score_row) if s > 0]
        return results

    # --- persistence (the manifest and corpus file are written by retrieval.index) ---------------------

    def save(self, directory: str | os.PathLike) -> None:
        """Write the bm25s matrices, vocabulary and parameters into `directory` (not the corpus)."""
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save(str(directory), show_progress=False)
        (directory / _PARAMS_FILE).write_text(json.dumps({"k1": self.k1, "b": self.b, "stopwords": self.stopwords}))

    @classmethod
    def load(cls, directory: str | os.PathLike, passages: Sequence[Passage]) -> "BM25Index":
        """Read an index written by `save`; `passages` must be the corpus it was built on, in order."""
        directory = pathlib.Path(directory)
        params_path = directory / _PARAMS_FILE
        if not params_path.exists():
            raise FileNotFoundError(f"{params_path} is missing: {directory} is not a BM25 index directory")
        params = json.loads(params_path.read_text())
        import bm25s
        model = bm25s.BM25.load(str(directory), load_corpus=False, mmap=False, show_progress=False, verbosity=0)
        passages = list(passages)
        if model.scores["num_docs"] != len(passages):
            raise ValueError(f"{directory}: BM25 index holds {model.scores['num_docs']} passages but the corpus "
                             f"has {len(passages)}")
        return cls(passages=passages, model=model, k1=params["k1"], b=params["b"], stopwords=params["stopwords"])

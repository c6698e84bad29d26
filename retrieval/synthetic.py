"""Synthetic embeddings at wiki-18 scale, generated chunk by chunk from a seed, for rehearsing index builds
and serving without an encoder run over 21M passages.

The vectors are a mixture of `clusters` Gaussian clusters on the unit sphere:

    c_j ~ N(0, I_d / d)   (norm about 1),    x = normalise(c_{k(x)} + spread * e / sqrt(d)),  e ~ N(0, I_d)

so two vectors of one cluster have cosine about 1 / (1 + spread^2) (0.5 at spread 1) and vectors of
different clusters about 0: an inner-product search has real neighbours to find, and IVF cells have
clusters to follow. Real e5 embeddings are more anisotropic; recall figures on this data describe the
index machinery, not wiki-18 retrieval quality.

Chunk i is drawn from numpy's default_rng([seed, 1, i]), so any chunk can be regenerated on its own (the
builder samples its training set from a few chunks, then streams them all once; the exact-search
reference streams them again). `SyntheticEncoder` maps a query string to a vector of the same mixture,
chosen by the string's sha256, so the server can be driven with text queries: the cluster comes from the
hash's first 32 bits, the noise e is the sum of 12 rows of a fixed N(0, I) table picked by the next 12 16-bit
words, divided by sqrt(12) (so e ~ N(0, I) per coordinate, by construction of each row). One vectorised
gather per batch: encoding must cost nothing next to the index when measuring queries per second.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from typing import Iterator, Sequence

import numpy as np

from retrieval.corpus import Passage


@functools.lru_cache(maxsize=4)
def _centres(seed: int, clusters: int, dim: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 0])
    return (rng.standard_normal((clusters, dim), dtype=np.float32) / np.float32(math.sqrt(dim)))


@functools.lru_cache(maxsize=4)
def _noise_table(seed: int, dim: int, rows: int = 4096) -> np.ndarray:
    return np.random.default_rng([seed, 3]).standard_normal((rows, dim), dtype=np.float32)


def _mixture(rng: np.random.Generator, rows: int, centres: np.ndarray, spread: float) -> np.ndarray:
    dim = centres.shape[1]
    x = rng.standard_normal((rows, dim), dtype=np.float32)
    x *= np.float32(spread / math.sqrt(dim))
    x += centres[rng.integers(len(centres), size=rows)]
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


@dataclasses.dataclass(frozen=True)
class SyntheticVectors:
    """N unit vectors of dimension `dim` in chunks of `chunk_size` rows (see the module docstring)."""

    num_vectors: int
    dim: int = 768
    seed: int = 0
    clusters: int = 4096
    spread: float = 1.0
    chunk_size: int = 32768

    def __post_init__(self):
        if min(self.num_vectors, self.dim, self.clusters, self.chunk_size) < 1 or self.spread <= 0:
            raise ValueError(f"SyntheticVectors needs positive sizes and spread, got {self}")

    @property
    def num_chunks(self) -> int:
        return -(-self.num_vectors // self.chunk_size)

    def chunk(self, i: int) -> np.ndarray:
        """Rows [i * chunk_size, min((i + 1) * chunk_size, N)) as float32 [rows, dim]."""
        if not 0 <= i < self.num_chunks:
            raise IndexError(f"chunk {i} out of range for {self.num_chunks} chunks")
        rows = min(self.chunk_size, self.num_vectors - i * self.chunk_size)
        return _mixture(np.random.default_rng([self.seed, 1, i]), rows, _centres(self.seed, self.clusters, self.dim),
                        self.spread)

    def chunks(self) -> Iterator[np.ndarray]:
        for i in range(self.num_chunks):
            yield self.chunk(i)

    def describe(self) -> dict:
        return dataclasses.asdict(self)


def synthetic_passages(num: int) -> Iterator[Passage]:
    """Passage i for vector i: short, distinct texts (a wiki-18 passage is ~100 words; these keep disk small)."""
    for i in range(num):
        yield Passage(id=str(i), title=f"Synthetic {i}", text=f"synthetic passage {i}")


@dataclasses.dataclass(frozen=True)
class SyntheticEncoder:
    """Query text -> a vector of the same mixture, seeded by sha256(text): deterministic and free to compute."""

    dim: int = 768
    seed: int = 0
    clusters: int = 4096
    spread: float = 1.0

    def encode(self, texts: Sequence[str], is_query: bool = True) -> np.ndarray:
        if not len(texts):
            return np.zeros((0, self.dim), np.float32)
        words = np.frombuffer(b"".join(hashlib.sha256(t.encode("utf-8")).digest() for t in texts),
                              np.uint16).reshape(len(texts), 16).astype(np.int64)
        cluster = (words[:, 0] * 65536 + words[:, 1]) % self.clusters
        table = _noise_table(self.seed, self.dim)
        noise = np.zeros((len(texts), self.dim), np.float32)
        for column in range(2, 14):       # one [B, D] gather at a time, not a [B, 12, D] temporary
            noise += table[words[:, column] % len(table)]
        noise /= np.float32(math.sqrt(12))
        x = _centres(self.seed, self.clusters, self.dim)[cluster] + np.float32(self.spread / math.sqrt(self.dim)) * noise
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    def describe(self) -> dict:
        return {"name": f"synthetic-{self.dim}d-seed{self.seed}-k{self.clusters}-s{self.spread:g}", "kind": "synthetic",
                "dim": self.dim, "seed": self.seed, "clusters": self.clusters, "spread": self.spread}

    @classmethod
    def for_vectors(cls, vectors: SyntheticVectors) -> "SyntheticEncoder":
        return cls(vectors.dim, vectors.seed, vectors.clusters, vectors.spread)

    @classmethod
    def from_description(cls, description: dict) -> "SyntheticEncoder":
        return cls(int(description["dim"]), int(description["seed"]), int(description["clusters"]),
                   float(description["spread"]))


def exact_topk(chunks: Iterator[np.ndarray], queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-k of `queries` [Q, D] over vectors streamed in chunks: (scores, ids), each
    [Q, k], best first. Holds one chunk and the running top-k; the reference for recall at any N."""
    q = np.ascontiguousarray(queries, np.float32)
    best_s = np.full((len(q), k), -np.inf, np.float32)
    best_i = np.full((len(q), k), -1, np.int64)
    start = 0
    for chunk in chunks:
        scores = q @ chunk.T
        ids = np.broadcast_to(np.arange(start, start + len(chunk)), scores.shape)
        start += len(chunk)
        all_s, all_i = np.concatenate([best_s, scores], 1), np.concatenate([best_i, ids], 1)
        top = np.argpartition(-all_s, k - 1, axis=1)[:, :k] if all_s.shape[1] > k else np.argsort(-all_s, 1)
        best_s, best_i = np.take_along_axis(all_s, top, 1), np.take_along_axis(all_i, top, 1)
        del chunk, scores
    order = np.argsort(-best_s, axis=1, kind="stable")
    return np.take_along_axis(best_s, order, 1), np.take_along_axis(best_i, order, 1)

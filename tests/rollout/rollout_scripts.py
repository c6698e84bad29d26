"""Scripted policies and fake retrievers for the rollout tests.

A scripted policy is a table: row r's intended full sequence (prompt, then every generated and observation
token in order). Its logits_fn puts all mass on table[r, lengths[r]], the token at the row's next position,
so a row generates exactly its script as long as the rollout appends exactly the observations the script
expects (if it appended anything else, the row would fall out of step and the test's comparison would fail).
Positions past the end of a script hold EOS.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from retrieval.corpus import Hit
from searchjax.agent import protocol

GEN, OBS = "gen", "obs"


def scripted_logits_fn(sequences, eos_id: int, vocab_size: int, width: int = 4096):
    """logits_fn(tokens [B, S], lengths [B]) -> [B, V]: 0 on sequences[b][lengths[b]], -1e4 elsewhere."""
    table = np.full((len(sequences), width), eos_id, np.int32)
    for r, seq in enumerate(sequences):
        table[r, :len(seq)] = seq
    table = jnp.asarray(table)

    def logits_fn(tokens, lengths):
        rows = jnp.minimum(jnp.arange(tokens.shape[0]), table.shape[0] - 1)  # padding rows: any script
        target = table[rows, jnp.minimum(lengths, table.shape[1] - 1)]
        return jnp.where(jnp.arange(vocab_size)[None, :] == target[:, None], 0.0, -1e4).astype(jnp.float32)

    return logits_fn


@dataclasses.dataclass
class Segment:
    kind: str  # GEN (policy tokens) or OBS (appended by the loop)
    ids: list
    text: str


def gen(tokenizer, text: str, budget: int | None = None, eos: bool = False) -> Segment:
    """A generated segment: text's tokens (cut to `budget`), optionally followed by EOS."""
    ids = tokenizer.encode(text)[:budget]
    if eos:
        ids = ids + [tokenizer.eos_token_ids[0]]
    return Segment(GEN, ids, tokenizer.decode(ids))


def obs(tokenizer, text: str) -> Segment:
    """An observation segment, encoded as one string."""
    return Segment(OBS, tokenizer.encode(text), text)


def fake_hits(query: str, topk: int, words: int = 6) -> list[Hit]:
    """Deterministic hits for a query: ids f"{query}#{k}"."""
    return [Hit(id=f"{query}#{k}", title=f"Title {k} {query}", text=" ".join([f"fact{k}"] * words) + f" about {query}.",
                score=1.0 / (k + 1)) for k in range(topk)]


class CountingRetriever:
    """Records every search call; answers with `hits_fn(query, topk)` (default fake_hits). Raises on the call
    numbers in `fail_calls` (0-based), and returns one list too few on those in `short_calls`."""

    def __init__(self, hits_fn=fake_hits, fail_calls=(), short_calls=(), inner=None):
        self.calls: list[tuple[list[str], int]] = []
        self.hits_fn, self.fail_calls, self.short_calls, self.inner = hits_fn, set(fail_calls), set(short_calls), inner

    def search(self, queries, topk):
        number = len(self.calls)
        self.calls.append((list(queries), topk))
        if number in self.fail_calls:
            raise RuntimeError("retrieval server unavailable (scripted failure)")
        if self.inner is not None:
            out = self.inner.search(queries, topk)
        else:
            out = [self.hits_fn(q, topk) for q in queries]
        return out[:-1] if number in self.short_calls else out


def search_obs(tokenizer, query: str, topk: int) -> Segment:
    return obs(tokenizer, protocol.search_observation(fake_hits(query, topk)))


def sequence(prompt_ids, segments) -> list[int]:
    return list(prompt_ids) + [t for s in segments for t in s.ids]


def expected_mask(segments) -> list[int]:
    return [1 if s.kind == GEN else 0 for s in segments for _ in s.ids]


def mask_runs(mask) -> list[tuple[int, int, int]]:
    """(value, start, end) of each maximal run of equal values."""
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], start, i))
            start = i
    return runs

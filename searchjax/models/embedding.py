"""What every text embedder shares: pooling, length-bucketed batching, and `encode` / `warmup` over it.

The BERT-family encoders (searchjax.models.encoder) and the decoder embedders
(searchjax.models.decoder_embedder) both subclass `BucketedEmbedder`; see searchjax.models.encoder's docstring
for the pooling formulas and the measurements behind the batching defaults.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def pool(hidden: jax.Array, token_mask: jax.Array, pooling: str, normalize: bool) -> jax.Array:
    """hidden [B, T, H], token_mask [B, T] -> [B, H] float32 (see the module docstring for the formulas)."""
    hidden = hidden.astype(jnp.float32)
    mask = token_mask.astype(jnp.float32)
    if pooling == "mean":
        out = jnp.einsum("bth,bt->bh", hidden, mask) / jnp.maximum(mask.sum(1, keepdims=True), 1e-9)
    elif pooling == "cls":
        out = hidden[:, 0]
    elif pooling == "last":
        last = jnp.maximum(token_mask.astype(jnp.int32).sum(1) - 1, 0)   # right padding: last real token
        out = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
    else:
        raise ValueError(f"pooling must be 'mean', 'cls' or 'last', got {pooling!r}")
    if normalize:
        out = out / jnp.maximum(jnp.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
    return out


# --- batching: length buckets ---------------------------------------------------------------------------

def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def length_bucket(n: int, steps_per_octave: int = 1, min_bucket: int = 16) -> int:
    """Smallest bucket >= n. Buckets are powers of two (steps_per_octave=1) or, with s steps per octave,
    2^k * (1 + j/s) for j < s: s=2 gives 16, 24, 32, 48, 64, 96, ... (less padding, s times the shapes)."""
    n = max(int(n), min_bucket)
    base = _next_pow2(n) // 2
    if base < 1:
        return 1
    for j in range(1, steps_per_octave + 1):
        bucket = base + base * j // steps_per_octave
        if bucket >= n:
            return bucket
    return 2 * base


def plan_batches(lengths: Sequence[int], batch_size: int, max_length: int, min_bucket: int = 16,
                 steps_per_octave: int = 1, max_batch_tokens: int | None = None) -> list[tuple[np.ndarray, int, int]]:
    """Group sequence indices into (indices, padded_length, padded_rows) batches, longest first.

    Indices are sorted by length. A batch takes the longest remaining sequence's length bucket (see
    `length_bucket`, capped at max_length) and up to `batch_size` sequences, fewer when
    `max_batch_tokens` is set: then at most the largest power of two <= max_batch_tokens / bucket
    (at least 1). padded_rows is the next power of two >= the batch's size, capped at that row limit.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    plans, start = [], 0
    while start < len(order):
        padded_length = min(length_bucket(int(lengths[order[start]]), steps_per_octave, min_bucket), max_length)
        limit = batch_size
        if max_batch_tokens is not None:
            limit = min(batch_size, max(1, _next_pow2(max_batch_tokens // padded_length + 1) // 2))
        idx = order[start:start + limit]
        plans.append((idx, padded_length, min(_next_pow2(len(idx)), limit)))
        start += len(idx)
    return plans


def embed_token_ids(ids: Sequence[Sequence[int]], embed_fn: Callable[[np.ndarray, np.ndarray], jax.Array], *,
                    batch_size: int, max_length: int, pad_id: int, min_bucket: int = 16,
                    steps_per_octave: int = 1, max_batch_tokens: int | None = None) -> np.ndarray:
    """Run `embed_fn(input_ids [B, T] int32, token_mask [B, T] bool) -> [B, D]` over length-bucketed,
    right-padded batches and return [N, D] float32 in the input order. Sequences longer than max_length
    are truncated to their first max_length tokens."""
    ids = [list(x)[:max_length] for x in ids]
    if any(len(x) == 0 for x in ids):
        raise ValueError("embed_token_ids: empty token sequence (every text must tokenise to >= 1 token)")
    out: np.ndarray | None = None
    for idx, length, rows in plan_batches([len(x) for x in ids], batch_size, max_length, min_bucket,
                                           steps_per_octave, max_batch_tokens):
        input_ids = np.full((rows, length), pad_id, np.int32)
        mask = np.zeros((rows, length), bool)
        for r, i in enumerate(idx):
            input_ids[r, :len(ids[i])] = ids[i]
            mask[r, :len(ids[i])] = True
        mask[len(idx):, 0] = True   # padding rows get one real token so no row is fully masked
        emb = np.asarray(embed_fn(input_ids, mask), np.float32)[:len(idx)]
        if out is None:
            out = np.empty((len(ids), emb.shape[1]), np.float32)
        out[idx] = emb
    return out if out is not None else np.zeros((0, 0), np.float32)


def warmup_shapes(embed_fn: Callable[[np.ndarray, np.ndarray], jax.Array], *, batch_size: int, max_length: int,
                  pad_id: int, max_tokens: int = 32, min_bucket: int = 16, steps_per_octave: int = 1,
                  max_batch_tokens: int | None = None) -> int:
    """Compile embed_fn for every (rows, length) shape `plan_batches` can give batches of up to
    batch_size texts of at most max_tokens tokens, so a server's first queries do not wait for XLA.
    Returns the number of shapes run."""
    shapes = {(rows, length) for n in range(1, batch_size + 1) for t in range(1, max_tokens + 1)
              for _, length, rows in plan_batches([t] * n, batch_size, max_length, min_bucket, steps_per_octave,
                                                   max_batch_tokens)}
    for rows, length in sorted(shapes):
        ids = np.full((rows, length), pad_id, np.int32)
        jax.block_until_ready(embed_fn(ids, np.ones((rows, length), bool)))
    return len(shapes)


class BucketedEmbedder:
    """`encode` and `warmup` over length-bucketed batches, shared by both embedders. A subclass provides
    `tokenize(texts, is_query)`, `_embed(params, ids, mask)`, `params`, `dim`, `batch_size`,
    `steps_per_octave`, `max_batch_tokens`, `_token_limit()` and `_pad_id()`."""

    warmup_tokens = 32  # query lengths compiled by default at warmup (instruction prefixes need more)

    def warmup(self, max_tokens: int | None = None) -> int:
        """Compile the shapes of query batches up to max_tokens tokens (see warmup_shapes)."""
        return warmup_shapes(lambda i, m: self._embed(self.params, i, m), batch_size=self.batch_size,
                             max_length=self._token_limit(), pad_id=self._pad_id(),
                             max_tokens=max_tokens or self.warmup_tokens, steps_per_octave=self.steps_per_octave,
                             max_batch_tokens=self.max_batch_tokens)

    def encode(self, texts: Sequence[str], *, is_query: bool = False) -> np.ndarray:
        """[N, D] float32 embeddings of `texts` (query formatting applied when is_query)."""
        if isinstance(texts, str):
            raise TypeError("encode takes a list of texts, got a single string")
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return embed_token_ids(self.tokenize(texts, is_query), lambda i, m: self._embed(self.params, i, m),
                               batch_size=self.batch_size, max_length=self._token_limit(), pad_id=self._pad_id(),
                               steps_per_octave=self.steps_per_octave, max_batch_tokens=self.max_batch_tokens)

"""Next-token sampling: greedy, temperature, top-k, top-p (nucleus), with per-row PRNG keys.

For logits z [B, V] and temperature T > 0 the sampler draws from

    p(t) ∝ exp(z_t / T)                         restricted to the top-k tokens of z        (if top_k > 0)
                                                 then to the nucleus: the smallest set of the most
                                                 probable tokens whose probability sums to >= top_p
                                                 (Holtzman et al. 2020)                      (if top_p < 1)

in the order of transformers' warpers (temperature, top-k, top-p). Token i (in descending order) is in the
nucleus iff the probability of the tokens before it is < top_p, so the most probable token is always kept.

Log-probabilities. The reported log-prob of a sampled token is log softmax(z / T) over the **full**
vocabulary, i.e. *before* top-k/top-p truncation: that is what an RL trainer recomputes for the same token
(verl's old_log_prob = log_softmax(logits / temperature) on the full vocabulary), so sampler and trainer
log-probs are directly comparable. Greedy decoding (T = 0) reports log softmax(z), the T = 1 value.

Randomness. Each row owns a key, fold_in(key(seed), row); the key for the token written at sequence
position n of that row is fold_in(row key, n). A row's samples therefore depend only on (seed, row, its
own tokens), not on how many decode calls, turns or other rows there were: reproducible for a fixed seed.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingMode:
  """The static part of a sampling configuration (changing it recompiles the decode loop).

  greedy: argmax (temperature 0); top_k: 0 = off, else keep the k largest logits (shapes depend on k);
  nucleus: whether top-p truncation runs (it sorts the vocabulary, so it is skipped when top_p == 1).
  Temperature and top_p themselves are dynamic arguments.
  """
  greedy: bool
  top_k: int = 0
  nucleus: bool = False


def sampling_mode(temperature: float, top_p: float, top_k: int) -> SamplingMode:
  """Validate user sampling parameters and return the static mode."""
  if not temperature >= 0.0:
    raise ValueError(f"temperature={temperature!r} must be >= 0 (0 = greedy)")
  if not 0.0 < top_p <= 1.0:
    raise ValueError(f"top_p={top_p!r} must be in (0, 1]")
  if int(top_k) != top_k or top_k < 0:
    raise ValueError(f"top_k={top_k!r} must be a non-negative int (0 = off)")
  if temperature == 0.0:
    return SamplingMode(greedy=True)
  return SamplingMode(greedy=False, top_k=int(top_k), nucleus=top_p < 1.0)


def row_keys(seed: int, num_rows: int) -> jax.Array:
  """[B] typed PRNG keys: fold_in(key(seed), row)."""
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(seed), jnp.arange(num_rows))


def _nucleus_mask(sorted_logits: jax.Array, top_p: jax.Array) -> jax.Array:
  """sorted_logits [B, K] descending -> keep [B, K]: probability mass before the token < top_p."""
  probs = jax.nn.softmax(sorted_logits, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  return mass_before < top_p


def sample(logits: jax.Array, keys: jax.Array, temperature: jax.Array, top_p: jax.Array,
           mode: SamplingMode) -> tuple[jax.Array, jax.Array]:
  """logits [B, V] float32, keys [B] (this step's key per row) -> (tokens [B] int32, logprobs [B] float32).

  logprobs: log softmax(logits / T) of the sampled token over the full vocabulary (see module docstring).
  """
  logits = logits.astype(jnp.float32)
  if mode.greedy:
    tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logprobs = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tokens[:, None], axis=-1)[:, 0]
    return tokens, logprobs
  scaled = logits / temperature
  if mode.top_k or mode.nucleus:
    # Candidates in descending order: the top k, or the whole vocabulary sorted when only top-p is on.
    k = mode.top_k if mode.top_k else logits.shape[-1]
    candidate_logits, candidate_ids = jax.lax.top_k(scaled, min(k, logits.shape[-1]))
    if mode.nucleus:
      keep = _nucleus_mask(candidate_logits, top_p)
      candidate_logits = jnp.where(keep, candidate_logits, -jnp.inf)
    choice = jax.vmap(jax.random.categorical)(keys, candidate_logits)
    tokens = jnp.take_along_axis(candidate_ids, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)
  else:
    tokens = jax.vmap(jax.random.categorical)(keys, scaled).astype(jnp.int32)
  logprobs = jnp.take_along_axis(jax.nn.log_softmax(scaled, axis=-1), tokens[:, None], axis=-1)[:, 0]
  return tokens, logprobs

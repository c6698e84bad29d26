"""RLIF (Zhao et al. 2025, "Learning to Reason without External Rewards", arXiv:2505.19590): self-certainty as
the reward, a gold-free baseline of Cycle-Consistent Search (CCS).

Intuitor's self-certainty of a response o to a prompt q (Zhao et al. 2025, Sec. 3; defined in Kang et al.
2025, "Scalable Best-of-N Selection for Large Language Models via Self-Certainty") is the mean, over the
response's tokens, of the KL divergence from the uniform distribution U over the vocabulary V to the model's
next-token distribution:

    Self-certainty(o | q) = (1 / |o|) * sum_{i=1}^{|o|} KL(U || p_pi(. | q, o_<i))
                          = -(1 / (|o| |V|)) * sum_{i=1}^{|o|} sum_{j=1}^{|V|} log(|V| * p_pi(j | q, o_<i))

Mind the direction: KL(U || p), not KL(p || U) = log|V| - H(p). For one position with logits z (already
divided by the sampling temperature), p = softmax(z) and

    KL(U || p) = sum_j (1/|V|) log((1/|V|) / p_j) = logsumexp(z) - mean_j(z_j) - log|V|  >= 0,

0 for a uniform p and growing without bound as p concentrates (the reference implementations drop the
constant log|V|; we keep it so the value is the KL itself; GRPO's z-scores are unaffected). It is a function
of the whole distribution at each position, not of the sampled token, so it cannot be read off the sampler's
log-probs: it needs the logits.

How the CCS paper applies it, and what we do:

* Scored tokens: the final response of the trajectory, i.e. the policy-generated tokens after the last
  observation (loss mask 1 after the last loss-mask-0 run; the whole generated text when the trajectory made
  no search). `RlifConfig.tokens = "generated"` scores every generated token instead (Intuitor on a
  single-turn response is the same thing). Observation tokens are never scored: the policy did not write them.
* r(tau) = Self-certainty over the scored tokens; a trajectory with no scored token (it ended on an
  observation) gets r = 0 and is counted (`rlif/no_final_response`). GRPO then normalises within the group.
* The logits are those of the old-policy pass (the pre-update parameters the trainer recomputes log-probs
  with, at the same temperature), so the reward costs no extra forward: `tail_logprobs_and_self_certainty`
  returns both statistics from one trunk forward and one pass of the LM head (in vocabulary chunks, with
  the online logsumexp of `searchjax.scoring` plus a running sum of logits for the mean). The loop therefore
  runs that pass before the reward when the RewardFn has `needs_self_certainty = True`
  (searchjax/experiment/scoring.py), and calls
  `reward_fn(trajectories, self_certainty=...)` with per-trajectory arrays over the response tokens
  (`response_values`); a call without them is a clear error, never a silent 0.
* Gold-free: nothing here reads a golden answer.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from searchjax import scoring
from searchjax.models import lm_head_weight, native, positions_from_mask
from searchjax.models.kernels import matmul
from searchjax.rewards.base import RewardOutput

if TYPE_CHECKING:
    from searchjax.agent.rollout import Trajectory

TOKEN_SCOPES = ("final_response", "generated")


@dataclasses.dataclass(frozen=True)
class RlifConfig:
    """RLIF's one knob (configs/ccs.py sets and comments it)."""

    tokens: str = "final_response"  # which generated tokens are scored: "final_response" | "generated"

    def __post_init__(self):
        if self.tokens not in TOKEN_SCOPES:
            raise ValueError(f"RlifConfig.tokens={self.tokens!r} is not one of {TOKEN_SCOPES}")


# --- the statistic --------------------------------------------------------------------------------------------

def self_certainty_from_logits(logits) -> np.ndarray:
    """KL(U || softmax(logits)) over the last axis, float64 numpy: logsumexp(z) - mean(z) - log|V|."""
    z = np.asarray(logits, np.float64)
    top = z.max(axis=-1, keepdims=True)
    lse = top[..., 0] + np.log(np.exp(z - top).sum(axis=-1))
    return lse - z.mean(axis=-1) - math.log(z.shape[-1])


def head_statistics(hidden: jax.Array, lm_head: jax.Array, targets: jax.Array, *, temperature=1.0,
                    vocab_chunk: int | None = None) -> tuple[jax.Array, jax.Array]:
    """(log p(targets), KL(U || p)) per position, [B, T] float32 each, p = softmax(hidden @ lm_head / temperature).

    hidden [B, T, H]; lm_head [H, V]; targets [B, T]. One pass over the head, in `scoring.target_logprobs`' pieces
    (`scoring.vocab_chunks`: one piece when the float32 logits are small enough, else strided vocabulary chunks,
    chunk k = ids k, k + n, ...) carrying (max m, sum exp s, sum of logits): log Z = m + log s, mean z = sum / V;
    the targets' logits are read once from the head's rows (`scoring.target_logits`). A bf16 head on one CPU with
    AMX or AVX-512 BF16 runs the same statistics in `native.head_logprobs` (`scoring.target_logprobs`' rule; not
    differentiated: this is the old-policy pass).
    """
    V = lm_head.shape[1]
    temperature = jnp.asarray(temperature, jnp.float32)
    log_v = jnp.float32(math.log(V))
    if vocab_chunk is None and scoring.head_kernel_fits(hidden):  # a bf16 head on one CPU (`native.head_logprobs_fits`)
        logp, lse, total = native.head_logprobs(hidden, jnp.transpose(lm_head.astype(hidden.dtype)), targets,
                                                temperature)
        return logp, lse - total / V - log_v
    n_chunks = scoring.vocab_chunks(math.prod(targets.shape), V, vocab_chunk)
    targets = targets.astype(jnp.int32)
    if n_chunks == 1:
        z = matmul("bth,hv->btv", hidden, lm_head.astype(hidden.dtype), jnp.float32) / temperature
        lse = jax.nn.logsumexp(z, axis=-1)
        picked = jnp.take_along_axis(z, targets[..., None], axis=-1)[..., 0]
        return picked - lse, lse - z.mean(axis=-1) - log_v
    w, column = scoring.strided_chunks(lm_head, n_chunks)
    hidden, temperature = scoring.fold_temperature(hidden, temperature)

    def body(k, carry):
        m, s, total = carry
        chunk = jax.lax.dynamic_index_in_dim(w, k, axis=1, keepdims=False).astype(hidden.dtype)  # [C, H]
        z = matmul("bth,ch->btc", hidden, chunk, jnp.float32) / temperature
        total = total + z.sum(axis=-1)  # the zero rows padding V add logits of exactly 0
        if w.shape[0] * n_chunks != V:
            z = jnp.where(column + k < V, z, -jnp.inf)
        m_new = jnp.maximum(m, z.max(axis=-1))
        return m_new, s * jnp.exp(m - m_new) + jnp.exp(z - m_new[..., None]).sum(axis=-1), total

    B, T = targets.shape
    zeros = jnp.zeros((B, T), jnp.float32)
    m, s, total = jax.lax.fori_loop(0, n_chunks, body, (jnp.full((B, T), -jnp.inf, jnp.float32), zeros, zeros))
    lse = m + jnp.log(s)
    return scoring.target_logits(hidden, w, targets, temperature) - lse, lse - total / V - log_v


def tail_logprobs_and_self_certainty(model, params, input_ids: jax.Array, attention_mask: jax.Array,
                                     temperature=1.0, *, tail: int, vocab_chunk: int | None = None):
    """For the last `tail` targets t = T-tail .. T-1: (log p(x_t | x_<t), KL(U || p(. | x_<t))), [B, tail]
    float32 each, from one forward (pure, jittable). Columns align with `searchjax.scoring.tail_logprobs`;
    entries whose target or context token is padding are 0."""
    T = input_ids.shape[1]
    if not 1 <= tail <= T - 1:
        raise ValueError(f"tail={tail} must be in [1, T-1] for input_ids of length T={T}")
    mask = attention_mask.astype(bool)
    hidden, _ = model.apply({"params": params}, input_ids, positions_from_mask(mask), mask, return_hidden=True)
    hidden = hidden[:, T - 1 - tail:T - 1]
    logp, certainty = head_statistics(hidden, lm_head_weight(params, model.config), input_ids[:, T - tail:],
                                      temperature=temperature, vocab_chunk=vocab_chunk)
    valid = mask[:, T - 1 - tail:T - 1] & mask[:, T - tail:]
    return jnp.where(valid, logp, 0.0), jnp.where(valid, certainty, 0.0)


# --- the old-policy pass with certainty (what the loop calls instead of trainer.batch_logprobs) ---------------

def make_logprob_certainty_fn(model, temperature: float, *, mesh=None, rules=None, param_shardings: Any = None):
    """Jitted (params, input_ids [B, T], attention_mask [B, T], tail) -> ([B, tail], [B, tail]): the trainer's
    `make_logprob_fn` with the self-certainty of every position as a second output (params cast the same way)."""
    from searchjax.rl.trainer import batch_rows_sharding, cast_tree
    from searchjax.sharding import with_activation_sharding

    def fn(params, ids, mask, tail):
        return tail_logprobs_and_self_certainty(model, cast_tree(params, model.config.weight_dtype), ids, mask,
                                                temperature, tail=tail)
    if mesh is None:
        return jax.jit(fn, static_argnums=3)
    rows = batch_rows_sharding(mesh, rules, stacked=False)
    fn = with_activation_sharding(fn, mesh, rules)  # as the trainer's log-prob pass: activations pinned to the mesh
    return jax.jit(fn, in_shardings=(param_shardings, rows, rows), out_shardings=(rows, rows), static_argnums=3)


def batch_logprobs_and_certainty(fn: Callable, params, batch: dict, micro_batch_size: int, mesh=None, rules=None, *,
                                 tail: int) -> tuple[np.ndarray, np.ndarray]:
    """`fn` (make_logprob_certainty_fn) over `batch` in micro-batches, back on the host: (old log-probs,
    self-certainty), each [B, T - 1] float32 aligned with batch["loss_mask"], zeros left of the last `tail`
    columns (as `searchjax.rl.trainer.batch_logprobs`)."""
    from searchjax.distributed import to_host
    from searchjax.rl.trainer import place_batch
    rows = len(batch["input_ids"])
    if rows % micro_batch_size:
        raise ValueError(f"batch_logprobs_and_certainty: {rows} rows are not a multiple of {micro_batch_size}")
    logps, certainties = [], []
    start = jax.process_index() * micro_batch_size  # global_batch stacks the processes' rows in order
    for i in range(0, rows, micro_batch_size):
        chunk = place_batch({k: batch[k][i:i + micro_batch_size] for k in ("input_ids", "attention_mask")}, mesh,
                            rules, stacked=False)
        logp, certainty = fn(params, chunk["input_ids"], chunk["attention_mask"], tail)
        logps.append(to_host(logp)[start:start + micro_batch_size])
        certainties.append(to_host(certainty)[start:start + micro_batch_size])
    columns = batch["input_ids"].shape[1] - 1
    pad = lambda x: np.pad(np.concatenate(x).astype(np.float32), ((0, 0), (columns - tail, 0)))
    return pad(logps), pad(certainties)


def response_values(per_token: np.ndarray, batch: dict, trajectories: Sequence["Trajectory"]) -> list[np.ndarray]:
    """Row i of a [B, T - 1] per-token array (searchjax.rl.batching layout) cut to trajectory i's response:
    entry j = the value at the position that predicts response token j (column P - 1 + j)."""
    out = []
    for i, t in enumerate(trajectories):
        first = int(np.argmax(batch["attention_mask"][i]))  # the prompt's first token (left padding before it)
        p = first + len(t.prompt_ids)
        out.append(np.asarray(per_token[i, p - 1:p - 1 + len(t.response_ids)], np.float64))
    return out


# --- the reward --------------------------------------------------------------------------------------------------

def scored_mask(loss_mask: Sequence[int], tokens: str = "final_response") -> np.ndarray:
    """bool [R]: the response tokens RLIF scores: generated tokens after the last observation token
    ("final_response"), or every generated token ("generated")."""
    mask = np.asarray(loss_mask, bool)
    if tokens == "generated":
        return mask
    observed = np.flatnonzero(~mask)
    out = mask.copy()
    if observed.size:
        out[:observed[-1] + 1] = False
    return out


def rlif_reward(trajectories: Sequence["Trajectory"], self_certainty: Sequence[np.ndarray],
                cfg: RlifConfig = RlifConfig()) -> RewardOutput:
    """r_i = mean of self_certainty[i] over trajectory i's scored tokens (0, counted, when there are none)."""
    if not trajectories:
        raise ValueError("rlif: no trajectories")
    if len(self_certainty) != len(trajectories):
        raise ValueError(f"rlif: {len(self_certainty)} self-certainty arrays for {len(trajectories)} trajectories")
    rewards = np.zeros(len(trajectories), np.float64)
    empty, token_counts = 0, []
    for i, (t, values) in enumerate(zip(trajectories, self_certainty)):
        values = np.asarray(values, np.float64)
        if values.shape != (len(t.response_ids),):
            raise ValueError(f"rlif: trajectory {t.prompt.uid!r} sample {t.sample_index} has {len(t.response_ids)} "
                             f"response tokens but self-certainty of shape {values.shape}")
        mask = scored_mask(t.loss_mask, cfg.tokens)
        token_counts.append(int(mask.sum()))
        if not mask.any():
            empty += 1
            continue
        rewards[i] = values[mask].mean()
    metrics = {"rlif/self_certainty_mean": float(rewards.mean()), "rlif/no_final_response": float(empty),
               "rlif/scored_tokens_mean": float(np.mean(token_counts)), "mean": float(rewards.mean())}
    return RewardOutput(rewards=rewards.astype(np.float32), metrics=metrics)


def make_rlif_reward(cfg: RlifConfig = RlifConfig()):
    """A RewardFn that needs the old-policy pass's self-certainty: reward_fn(trajectories, self_certainty=...)."""
    def reward_fn(trajectories, *, self_certainty=None):
        if self_certainty is None:
            raise ValueError("rlif: the reward needs the self-certainty of the old-policy pass: the loop must run "
                             "searchjax.rewards.rlif.batch_logprobs_and_certainty before the reward and pass "
                             "self_certainty=response_values(...) (RewardFn.needs_self_certainty is True)")
        return rlif_reward(trajectories, self_certainty, cfg)
    reward_fn.needs_self_certainty = True
    return reward_fn


def build_rlif_reward(config, components, workdir):
    """The trainer's reward builder (searchjax.experiment.loop.REWARD_FNS signature): config.rlif -> RlifConfig."""
    if "rlif" not in config:
        raise ValueError("config.reward_fn='rlif' needs a config.rlif section (RlifConfig's fields: "
                         "configs/ccs.py:quickstart_rlif or :rlif has one)")
    try:
        return make_rlif_reward(RlifConfig(**config.rlif.to_dict()))
    except TypeError as e:  # an unknown field
        raise ValueError(f"config.rlif: {e}") from None

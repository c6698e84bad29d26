"""Policy-gradient losses in JAX: clipped surrogate, KL penalties, entropy, SFT, and one aggregation.

Pure functions of arrays, jit-able, float32 inside whatever the input dtype. Shapes: B sequences, T token
positions; `logp`, `old_logp`, `ref_logp` [B, T] are log pi(x_t | x_<t) of the sampled tokens (as from
`searchjax.scoring.token_logprobs`); `mask` [B, T] is 1 on policy-generated tokens (observation, prompt
and padding tokens 0); `advantages` [B] (one per trajectory, broadcast over T) or [B, T].

Every loss returns an unreduced (sum, denominator) pair through `aggregate_loss`, so gradient
accumulation over micro-batches is exact: with micro-batches k, the mini-batch loss is
sum_k sum_k / sum_k denom_k, and its gradient sum_k grad(sum_k) / sum_k denom_k, because the denominators
do not depend on the parameters. Divide once, at the end (`mean_from_sum`).

Conventions follow verl (`verl/trainer/ppo/core_algos.py`):

* importance ratio, in log space and clamped before the exp:
      log r = clip(logp - old_logp, -20, 20),   r = exp(log r)
* clipped surrogate (PPO; GRPO uses the same per-token loss), separate low / high clip ranges (DAPO):
      L = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))
* dual clip (Ye et al. 2020, verl's `clip_ratio_c`), only for A < 0, bounding the loss of a token whose
  ratio exploded on a negative advantage:
      L = min(L, -A c)   where A < 0;   c > 1
* KL penalty against a frozen reference (Schulman, "Approximating KL divergence", 2020):
      k1 = logp - ref_logp
      k2 = 0.5 (logp - ref_logp)^2
      k3 = exp(d) - d - 1,  d = clip(ref_logp - logp, -20, 20),  value clipped to [-10, 10]   (verl low_var_kl)
* per-token loss of `policy_loss` = L + kl_coef * KL, aggregated once (verl aggregates the two terms
  separately with the same mode and mask and adds them, which is the same number).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

KL_KINDS = ("k1", "k2", "k3")
AGGREGATION_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


def _f32(x) -> jax.Array:
    return jnp.asarray(x, dtype=jnp.float32)


def _check_same_shape(name: str, x, ref_name: str, ref) -> None:
    if jnp.shape(x) != jnp.shape(ref):
        raise ValueError(f"{name} has shape {jnp.shape(x)} but {ref_name} has shape {jnp.shape(ref)}")


def _per_token_advantages(advantages, logp) -> jax.Array:
    adv = _f32(advantages)
    if adv.ndim == 1 and logp.ndim == 2:
        if adv.shape[0] != logp.shape[0]:
            raise ValueError(f"advantages has shape {adv.shape} but logp has shape {logp.shape} (expected [B] or [B, T])")
        return adv[:, None]
    _check_same_shape("advantages", adv, "logp", logp)
    return adv


def kl_penalty(logp, ref_logp, kind: Literal["k1", "k2", "k3"]) -> jax.Array:
    """Per-token KL estimate between the policy and a frozen reference, from sampled-token log-probs.

    k1 = logp - ref_logp (unbiased, high variance, can be negative);
    k2 = 0.5 (logp - ref_logp)^2;
    k3 = exp(d) - d - 1 with d = clip(ref_logp - logp, -20, 20), then clipped to [-10, 10] (verl's
    "low_var_kl": unbiased for KL(pi || ref) under samples of pi, never negative).
    Gradients w.r.t. logp: k1 -> 1; k2 -> logp - ref_logp; k3 -> 1 - exp(ref_logp - logp) inside the clips.
    """
    logp, ref_logp = _f32(logp), _f32(ref_logp)
    _check_same_shape("ref_logp", ref_logp, "logp", logp)
    if kind == "k1":
        return logp - ref_logp
    if kind == "k2":
        return 0.5 * jnp.square(logp - ref_logp)
    if kind == "k3":
        d = jnp.clip(ref_logp - logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return jnp.clip(jnp.exp(d) - d - 1.0, -K3_VALUE_CLAMP, K3_VALUE_CLAMP)
    raise ValueError(f"unknown KL estimator kind {kind!r}; valid kinds: {', '.join(KL_KINDS)}")


def aggregate_loss(per_token, mask, mode: str) -> tuple[jax.Array, jax.Array]:
    """Reduce a [B, T] per-token loss to (sum, denominator); the loss is sum / denominator.

    Modes (verl's `agg_loss` names), with m the mask and rows = sequences with at least one masked-in
    token (rows with none, e.g. padding rows of a micro-batch, add 0 to both parts):

    * "token-mean":          sum = sum_{b,t} m l;                          denom = sum_{b,t} m
      (every token weighs the same across the whole mini-batch: DAPO's token-level loss)
    * "seq-mean-token-mean": sum = sum_b (sum_t m l / sum_t m);            denom = number of rows
      (each sequence's token mean, averaged over sequences: the original GRPO objective)
    * "seq-mean-token-sum":  sum = sum_{b,t} m l;                          denom = number of rows
      (each sequence's token sum, averaged over sequences)

    All three denominators are additive over micro-batches, so summing (sum, denom) over a split of the
    batch and dividing once gives the full-batch loss exactly. `mask` may be boolean or real weights.
    """
    per_token, mask = _f32(per_token), _f32(mask)
    _check_same_shape("mask", mask, "per_token", per_token)
    if per_token.ndim != 2:
        raise ValueError(f"per_token must be [B, T], got shape {per_token.shape}")
    # where() rather than a bare product, so that a masked-out position holding inf/nan (garbage log-probs
    # of padding) does not turn the value into nan. (Gradients through such positions still need finite inputs.)
    masked = jnp.where(mask != 0, per_token * mask, 0.0)
    tokens_per_row = jnp.sum(mask, axis=-1)
    rows = jnp.sum((tokens_per_row > 0).astype(jnp.float32))
    if mode == "token-mean":
        return jnp.sum(masked), jnp.sum(mask)
    if mode == "seq-mean-token-mean":
        row_sums = jnp.sum(masked, axis=-1)
        row_means = jnp.where(tokens_per_row > 0, row_sums / jnp.where(tokens_per_row > 0, tokens_per_row, 1.0), 0.0)
        return jnp.sum(row_means), rows
    if mode == "seq-mean-token-sum":
        return jnp.sum(masked), rows
    raise ValueError(f"unknown loss aggregation mode {mode!r}; valid modes: {', '.join(AGGREGATION_MODES)}")


def mean_from_sum(total, denom) -> jax.Array:
    """total / denom, and 0 when denom is 0 (a mini-batch without a single loss token)."""
    total, denom = _f32(total), _f32(denom)
    return jnp.where(denom > 0, total / jnp.where(denom > 0, denom, 1.0), 0.0)


def masked_mean(x, mask) -> jax.Array:
    """Mean of x over positions where mask is non-zero (weighted by mask); 0 if the mask is empty."""
    x, mask = _f32(x), _f32(mask)
    return mean_from_sum(jnp.sum(jnp.where(mask != 0, x * mask, 0.0)), jnp.sum(mask))


def _masked_extreme(x, mask, fn, fill) -> jax.Array:
    return fn(jnp.where(mask != 0, _f32(x), fill))


def clipped_surrogate(logp, old_logp, advantages, *, clip_low: float = 0.2, clip_high: float = 0.2,
                      clip_ratio_c: float | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Per-token PPO/GRPO clipped surrogate loss [B, T] and per-token diagnostics.

    log r = clip(logp - old_logp, -20, 20); r = exp(log r);
    L = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)); with `clip_ratio_c` = c (> 1):
    L = min(L, -A c) where A < 0 (dual clip; verl's semantics, inactive for A >= 0). verl applies the
    dual clip always, with c = 3 by default; here it is off unless `clip_ratio_c` is given.
    At r = 1 the gradient is dL/dlogp = -A.

    The diagnostics dict holds [B, T] arrays: "ratio", "log_ratio" (clamped), and boolean masks
    "clipped_high" (A > 0 and r > 1 + clip_high: the clipped branch is active, no gradient),
    "clipped_low" (A < 0 and r < 1 - clip_low), "clipped_dual" (A < 0 and r > c).
    """
    logp, old_logp = _f32(logp), _f32(old_logp)
    _check_same_shape("old_logp", old_logp, "logp", logp)
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low} and {clip_high}")
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual clip) must be > 1, got {clip_ratio_c}")
    adv = _per_token_advantages(advantages, logp)
    log_ratio = jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = jnp.maximum(unclipped, clipped)
    clipped_dual = jnp.zeros(ratio.shape, dtype=bool)
    if clip_ratio_c is not None:
        bound = -adv * clip_ratio_c
        clipped_dual = (adv < 0) & (loss > bound)
        loss = jnp.where(adv < 0, jnp.minimum(loss, bound), loss)
    diagnostics = {
        "ratio": ratio,
        "log_ratio": log_ratio,
        "clipped_high": (adv > 0) & (ratio > 1.0 + clip_high),
        "clipped_low": (adv < 0) & (ratio < 1.0 - clip_low),
        "clipped_dual": clipped_dual,
    }
    return loss, diagnostics


def policy_loss(logp, old_logp, advantages, mask, *, ref_logp=None, clip_low: float = 0.2,
                clip_high: float = 0.2, clip_ratio_c: float | None = None, kl_coef: float = 0.0,
                kl_kind: str = "k3", mode: str = "token-mean") -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """Clipped surrogate + kl_coef * KL(policy || reference), aggregated: (loss_sum, denom, metrics).

    Per-token loss = `clipped_surrogate(...)` + kl_coef * `kl_penalty(logp, ref_logp, kl_kind)` (the KL
    term only when ref_logp is given; kl_coef > 0 without ref_logp is an error), reduced by
    `aggregate_loss(per_token, mask, mode)`.

    Metrics (scalars over this batch's masked-in tokens; combine micro-batches by weighting with
    "tokens", except */max and */min): "loss/pg", "loss/kl" (kl_coef * KL), "kl/mean" (when ref_logp
    is given), "ratio/mean", "ratio/max", "ratio/min", "clip/frac_high", "clip/frac_low",
    "clip/frac_dual", "ppo_kl/mean" (mean of old_logp - logp, verl's ppo_kl), "advantage/mean", "tokens".
    """
    logp, mask = _f32(logp), _f32(mask)
    _check_same_shape("mask", mask, "logp", logp)
    pg, diag = clipped_surrogate(logp, old_logp, advantages, clip_low=clip_low, clip_high=clip_high,
                                 clip_ratio_c=clip_ratio_c)
    per_token = pg
    metrics = {"loss/pg": masked_mean(pg, mask)}
    if ref_logp is not None:
        kl = kl_penalty(logp, ref_logp, kl_kind)
        per_token = per_token + kl_coef * kl
        metrics["kl/mean"] = masked_mean(kl, mask)
        metrics["loss/kl"] = kl_coef * metrics["kl/mean"]
    elif kl_coef != 0.0:
        raise ValueError(f"kl_coef = {kl_coef} needs ref_logp (the frozen reference's token log-probs)")
    ratio = diag["ratio"]
    metrics.update({
        "ratio/mean": masked_mean(ratio, mask),
        "ratio/max": _masked_extreme(ratio, mask, jnp.max, -jnp.inf),
        "ratio/min": _masked_extreme(ratio, mask, jnp.min, jnp.inf),
        "clip/frac_high": masked_mean(diag["clipped_high"], mask),
        "clip/frac_low": masked_mean(diag["clipped_low"], mask),
        "clip/frac_dual": masked_mean(diag["clipped_dual"], mask),
        "ppo_kl/mean": masked_mean(-diag["log_ratio"], mask),
        "advantage/mean": masked_mean(jnp.broadcast_to(_per_token_advantages(advantages, logp), logp.shape), mask),
        "tokens": jnp.sum(mask),
    })
    loss_sum, denom = aggregate_loss(per_token, mask, mode)
    return loss_sum, denom, metrics


def entropy_from_logits(logits) -> jax.Array:
    """Entropy of softmax(logits) over the last axis: H = logsumexp(z) - sum_v p_v z_v, float32.

    Shape [..., V] -> [...]. Purely per position, so a caller with long sequences can evaluate it on
    chunks of positions (e.g. under `jax.lax.map`) without materialising all [B, T, V] logits. A metric:
    wrap it in `jax.lax.stop_gradient` if it is logged from inside a differentiated function. Vocabulary
    entries at -inf (masked out) contribute 0.
    """
    z = _f32(logits)
    log_p = jax.nn.log_softmax(z, axis=-1)
    p = jnp.exp(log_p)
    return -jnp.sum(jnp.where(p > 0, p * log_p, 0.0), axis=-1)


def sft_loss(logp, mask, mode: str = "token-mean") -> tuple[jax.Array, jax.Array]:
    """Masked next-token cross-entropy for supervised warm starts: aggregate(-logp, mask, mode) -> (sum, denom).

    `logp` [B, T] are the demonstration tokens' log-probs under the model (token_logprobs); `mask` selects
    the tokens to imitate (the policy's own turns, not prompts or observations).
    """
    logp = _f32(logp)
    return aggregate_loss(-logp, mask, mode)

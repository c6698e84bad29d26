"""Dr.Free's proposer reward: shortcut-aware information gain, format score, and their combination.

Notation (Dr.Free): the proposer writes a question q with answer A for a chain of h hops. A frozen anchor
model scores l(A | context) = the length-normalised log-likelihood of A's tokens given q and a context
(eq. 3). Contexts: the full chain evidence, and the shortcuts S: closed-book, the source passage only,
one retrieval with q, and each hop passage alone (eq. 5).

    g    = l(A | q, full) - max_{s in S} l(A | q, s)                                      (eq. 6)
    g    = l(A | q, retrieve(q)) - l(A | q, closed-book)           for single-hop q    (eq. 4)
    s_IG = tau * tanh(max(0, g) / tau),  tau = 3                                          (eq. 7)

Eq. 4 is eq. 6 with full = the retrieval context and S = {closed-book}: call `information_gain` so.

Format score (eqs. 10-11), for the parsed reply (think, question, answer) and the chain's target e_h:

    integrity = question and answer non-empty and normalize(answer) not a substring of normalize(question)
    s_fmt     = 0                                                          without integrity
              = (1 + [has think] + [normalize(answer) == normalize(target)]) / 3     otherwise

so s_fmt is one of 0, 1/3, 2/3, 1 ("has think": a closed, non-empty <think> block).

Proposer reward (eq. 12), with the grounding gate of `searchjax.drfree.proposer.is_grounded`:

    r = lam * s_fmt + [s_fmt = 1 and grounded] * s_IG,   lam = 0.2

This file has two parts: the pure formulas (here, first) and the anchor scoring that produces the
log-likelihoods (the contexts and batched `answer_loglik` calls; second section, below).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from searchjax.drfree.proposer import parse_proposer_output
from searchjax.rewards.qa import normalize_answer

DEFAULT_TAU = 3.0
DEFAULT_FORMAT_WEIGHT = 0.2

# ---------------------------------------------------------------------------------------------------
# Part 1: pure formulas (eqs. 6-7, 10-12)
# ---------------------------------------------------------------------------------------------------


class InformationGain(NamedTuple):
    """gain g = full - max(shortcuts) (may be negative) and score s_IG = tau * tanh(max(0, g) / tau) in [0, tau)."""

    gain: float | np.ndarray
    score: float | np.ndarray


def information_gain(full, shortcuts, tau: float = DEFAULT_TAU) -> InformationGain:
    """Shortcut-aware information gain (Dr.Free eqs. 6-7) from anchor log-likelihoods.

    Scalar form: `full` a float, `shortcuts` a sequence of K >= 1 floats. Batched form: `full` [N] and
    `shortcuts` [N, K]; pad a row's absent shortcuts with -inf (e.g. fewer hop passages, or a shortcut
    left out by the Table 3 leave-one-out switch). Every row needs at least one finite shortcut; NaN is
    an error. Returns floats for scalar input, float64 arrays [N] for batched input.
    """
    if not tau > 0:
        raise ValueError(f"information_gain: tau must be > 0, got {tau}")
    full_arr = np.asarray(full, dtype=np.float64)
    short = np.asarray(shortcuts, dtype=np.float64)
    if short.ndim != full_arr.ndim + 1 or short.shape[:-1] != full_arr.shape or short.shape[-1] < 1:
        raise ValueError(f"information_gain: shortcuts must have shape full.shape + (K,), K >= 1; got full "
                         f"{full_arr.shape} and shortcuts {short.shape}")
    if np.isnan(full_arr).any() or np.isnan(short).any():
        raise ValueError("information_gain: NaN log-likelihood in full or shortcuts")
    if not np.isfinite(full_arr).all():
        raise ValueError("information_gain: the full-context log-likelihood must be finite")
    best = short.max(axis=-1)
    if not np.isfinite(best).all():
        raise ValueError("information_gain: a question has no finite shortcut log-likelihood (all -inf or +inf)")
    gain = full_arr - best
    score = tau * np.tanh(np.maximum(gain, 0.0) / tau)
    if gain.ndim == 0:
        return InformationGain(float(gain), float(score))
    return InformationGain(gain, score)


def format_score(response: str, target: str) -> float:
    """Dr.Free eqs. 10-11: 0 without integrity, else (1 + [has think] + [answer == target]) / 3.

    `response` is the proposer's reply text; `target` the chain's final entity e_h. Answer and target are
    compared after SQuAD normalisation (`normalize_answer`).
    """
    parsed = parse_proposer_output(response)
    question, answer = parsed.question, parsed.answer
    if not question or not answer:
        return 0.0
    norm_answer = normalize_answer(answer)
    if norm_answer in normalize_answer(question):  # also catches an answer that normalises to ""
        return 0.0
    has_think = bool(parsed.think)
    matches_target = norm_answer == normalize_answer(target)
    return (1 + int(has_think) + int(matches_target)) / 3


def proposer_reward(s_fmt, grounded, s_ig, lam: float = DEFAULT_FORMAT_WEIGHT):
    """Dr.Free eq. 12: r = lam * s_fmt + [s_fmt = 1 and grounded] * s_IG.

    Scalars give a float; arrays [N] (s_fmt, grounded as bool, s_ig) give float64 [N]. s_fmt = 1 is tested
    with a 1e-9 tolerance (format_score returns 3/3 exactly, but a caller may pass 0.999... from float32).
    """
    s_fmt_arr = np.asarray(s_fmt, dtype=np.float64)
    grounded_arr = np.asarray(grounded, dtype=bool)
    s_ig_arr = np.asarray(s_ig, dtype=np.float64)
    try:
        np.broadcast_shapes(s_fmt_arr.shape, grounded_arr.shape, s_ig_arr.shape)
    except ValueError:
        raise ValueError(f"proposer_reward: shapes do not match: s_fmt {s_fmt_arr.shape}, grounded "
                         f"{grounded_arr.shape}, s_ig {s_ig_arr.shape}") from None
    gate = (np.abs(s_fmt_arr - 1.0) <= 1e-9) & grounded_arr
    reward = lam * s_fmt_arr + np.where(gate, s_ig_arr, 0.0)
    return float(reward) if reward.ndim == 0 else reward


# ---------------------------------------------------------------------------------------------------
# Part 2: anchor scoring (contexts, batched answer_loglik calls, leave-one-out switch, per-step metrics).
# Added by the Dr.Free II helper; it produces the `full` and `shortcuts` log-likelihoods consumed above.
# ---------------------------------------------------------------------------------------------------

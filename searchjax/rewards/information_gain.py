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

Part 2, the contexts of a proposal (q, A) about a chain with passages p_0 (the source passage, about
e_0) .. p_h (p_k about e_k), each rendered as Search-R1 passage lines (`retrieval.corpus.format_passages`)
and scored with the prompt template of `searchjax.scoring.answer_logliks`:

    full         p_0, p_1, ..., p_h                       (the full chain evidence)
    closed_book  nothing                                  (the question alone)
    source       p_0 alone
    retrieval    the top-k passages of one retrieval with q
    hop_k        p_k alone, k = 1..h                      (each hop passage alone)

A multi-hop question (h >= 2) uses eq. 6 with S = {closed_book, source, retrieval, hop_1..hop_h}; a
single-hop question uses eq. 4 (full := retrieval, S = {closed_book}). The leave-one-out switch of the
paper's Table 3 (`IGConfig.leave_out`) removes whole shortcut kinds ("closed_book", "source", "retrieval",
"hop") from eq. 6's S, and they are then not scored; eq. 4 is unaffected. All contexts of a batch of
proposals go to the anchor in one `answer_logliks` call (which packs them, longest first, into as few
jitted calls as its token budget allows) after one retriever call for all their questions.

Only proposals that pass the gate of eq. 12 (s_fmt = 1 and grounded) are scored: s_IG of the others is
multiplied by 0. Per-step metrics (`information_gain_metrics`) are over the scored proposals.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import TYPE_CHECKING, NamedTuple, Sequence

import jax
import numpy as np

from retrieval.corpus import format_passages
from searchjax.drfree.proposer import chain_of, chain_passages, is_grounded, parse_proposer_output
from searchjax.rewards.base import RewardOutput
from searchjax.rewards.qa import normalize_answer
from searchjax.scoring import DEFAULT_TEMPLATE, MAX_TOKENS_PER_CALL, answer_logliks

if TYPE_CHECKING:
    from searchjax.agent.rollout import Trajectory

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
# Part 2: anchor scoring (contexts, batched answer_loglik calls, leave-one-out switch, per-step metrics)
# and the trainer reward: it produces the `full` and `shortcuts` log-likelihoods consumed above.
# ---------------------------------------------------------------------------------------------------

FULL = "full"
SHORTCUT_KINDS = ("closed_book", "source", "retrieval", "hop")  # the names the Table 3 switch takes


@dataclasses.dataclass(frozen=True)
class IGConfig:
    """Settings of the information-gain reward (configs/drfree.py `information_gain`, field for field)."""

    tau: float = DEFAULT_TAU  # eq. 7's saturation scale
    format_weight: float = DEFAULT_FORMAT_WEIGHT  # lambda of eq. 12
    retrieval_topk: int = 3  # passages of the one-retrieval context
    leave_out: tuple[str, ...] = ()  # Table 3: shortcut kinds dropped from eq. 6 (subset of SHORTCUT_KINDS)
    template: str = DEFAULT_TEMPLATE  # anchor prompt: "{context}...{question}..." (searchjax.scoring)
    answer_prefix: str = " "  # text between the prompt and the answer's tokens
    max_length: int = 2048  # longer anchor prompts lose tokens from the left
    max_tokens_per_call: int = MAX_TOKENS_PER_CALL  # padded tokens per jitted scoring call (memory knob)

    def __post_init__(self):
        object.__setattr__(self, "leave_out", tuple(self.leave_out))  # a config gives a list
        unknown = [k for k in self.leave_out if k not in SHORTCUT_KINDS]
        if unknown:
            raise ValueError(f"IGConfig.leave_out: unknown shortcut kind(s) {unknown}; valid: {SHORTCUT_KINDS}")
        if set(self.leave_out) == set(SHORTCUT_KINDS):
            raise ValueError("IGConfig.leave_out removes every shortcut: eq. 6 needs at least one")
        if not self.tau > 0 or self.retrieval_topk < 1 or self.max_length < 2:
            raise ValueError(f"IGConfig: need tau > 0, retrieval_topk >= 1, max_length >= 2; got {self}")


@dataclasses.dataclass(frozen=True)
class Proposal:
    """A question q with answer A about a chain; passages[k] is about e_k (passages[0] = the source passage)."""

    question: str
    answer: str
    passages: tuple  # retrieval.corpus.Passage (anything with .contents), h + 1 of them

    @property
    def hops(self) -> int:
        return len(self.passages) - 1


def shortcut_kind(name: str) -> str:
    """"hop_2" -> "hop"; other context names are their own kind."""
    return "hop" if name.startswith("hop_") else name


def context_names(hops: int, leave_out: Sequence[str] = ()) -> tuple[str, ...]:
    """The contexts a question is scored under, the full one first: eq. 4 for h = 1, eq. 6 otherwise."""
    if hops < 1:
        raise ValueError(f"context_names: a chain has h >= 1 hops, got {hops}")
    if hops == 1:
        return ("retrieval", "closed_book")  # eq. 4: full := one retrieval with q, S = {closed book}
    names = [FULL] + [k for k in ("closed_book", "source", "retrieval") if k not in leave_out]
    if "hop" not in leave_out:
        names += [f"hop_{k}" for k in range(1, hops + 1)]
    return tuple(names)


def render_context(name: str, proposal: Proposal, retrieved: Sequence | None) -> str:
    """The context text of one named context (module docstring); `retrieved` = the hits of q's retrieval."""
    passages = proposal.passages
    if name == FULL:
        return format_passages(passages)
    if name == "closed_book":
        return ""
    if name == "source":
        return format_passages(passages[:1])
    if name == "retrieval":
        if retrieved is None:
            raise ValueError("render_context: the retrieval context needs the question's retrieved hits")
        return format_passages(retrieved)
    if name.startswith("hop_") and name[4:].isdigit() and 1 <= int(name[4:]) <= proposal.hops:
        k = int(name[4:])
        return format_passages(passages[k:k + 1])
    raise ValueError(f"render_context: unknown context {name!r} for a {proposal.hops}-hop proposal")


def anchor_logliks(model, params, tokenizer, retriever, proposals: Sequence[Proposal],
                   cfg: IGConfig = IGConfig()) -> list[dict[str, float]]:
    """l(A | q, c) (Dr.Free eq. 3) under every context of every proposal: one dict name -> value per proposal.

    One `retriever.search` call for all questions that need the retrieval context, then one
    `searchjax.scoring.answer_logliks` call for all contexts of all proposals.
    """
    proposals = list(proposals)
    names = [context_names(p.hops, cfg.leave_out) for p in proposals]
    need = [i for i, n in enumerate(names) if "retrieval" in n]
    retrieved: dict[int, list] = {}  # the retriever is host-side: each process searches its own questions
    if need:
        results = list(retriever.search([proposals[i].question for i in need], cfg.retrieval_topk))
        if len(results) != len(need):
            raise ValueError(f"anchor_logliks: the retriever returned {len(results)} hit lists for {len(need)} queries")
        retrieved = {i: list(hits) for i, hits in zip(need, results)}
    triples, owners = [], []
    for i, (proposal, context_list) in enumerate(zip(proposals, names)):
        for name in context_list:
            triples.append((render_context(name, proposal, retrieved.get(i)), proposal.question, proposal.answer))
            owners.append((i, name))
    every, start = gather_triples(triples)  # multi-host: score the union everywhere (SPMD), keep our slice
    values = answer_logliks(model, params, tokenizer, every, template=cfg.template, answer_prefix=cfg.answer_prefix,
                            max_length=cfg.max_length, max_tokens_per_call=cfg.max_tokens_per_call)
    values = values[start:start + len(triples)]
    out: list[dict[str, float]] = [{} for _ in proposals]
    for (i, name), value in zip(owners, values):
        out[i][name] = float(value)
    return out


def pack_triples(triples: Sequence[tuple[str, str, str]]) -> np.ndarray:
    """(context, question, answer) triples as one uint8 array (UTF-8 JSON), for `distributed.allgather`."""
    return np.frombuffer(json.dumps([list(t) for t in triples]).encode("utf-8"), np.uint8)


def unpack_triples(blob: np.ndarray) -> list[tuple[str, str, str]]:
    return [tuple(t) for t in json.loads(np.asarray(blob, np.uint8).tobytes().decode("utf-8"))]


def gather_triples(triples: list) -> tuple[list, int]:
    """(every process's triples in process order, index of this process's first one).

    The anchor's jitted scoring calls are SPMD over the mesh: in a multi-host run every process must make
    the same calls with the same shapes, so each one scores the union of all processes' contexts (each
    process proposes about a different shard of chains) and keeps its own slice. Single process: identity.
    """
    if jax.process_count() == 1:
        return list(triples), 0
    from searchjax import distributed
    blob = pack_triples(triples)
    sizes = distributed.allgather(np.asarray([len(blob)], np.int64))
    blobs = distributed.allgather(blob)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    parts = [unpack_triples(blobs[bounds[p]:bounds[p + 1]]) for p in range(len(sizes))]
    start = sum(len(part) for part in parts[:jax.process_index()])
    return [t for part in parts for t in part], start


class ShortcutGains(NamedTuple):
    """Per question: gain g (eq. 4 or 6), score s_IG (eq. 7), and the name of its strongest shortcut."""

    gain: np.ndarray  # [N] float64
    score: np.ndarray  # [N] float64
    strongest: list  # [N] context names, e.g. "source", "hop_2"


def shortcut_gains(logliks: Sequence[dict], hops: Sequence[int], *, leave_out: Sequence[str] = (),
                   tau: float = DEFAULT_TAU) -> ShortcutGains:
    """Eqs. 4/6-7 from `anchor_logliks`' dicts, dropping the shortcut kinds in `leave_out` from eq. 6.

    The same scored dicts give the gain over every shortcut subset (e.g. with and without "source").
    """
    if len(logliks) != len(hops):
        raise ValueError(f"shortcut_gains: {len(logliks)} log-likelihood dicts but {len(hops)} hop counts")
    unknown = [k for k in leave_out if k not in SHORTCUT_KINDS]
    if unknown:
        raise ValueError(f"shortcut_gains: unknown shortcut kind(s) {unknown}; valid: {SHORTCUT_KINDS}")
    full, rows = [], []
    for i, (ll, h) in enumerate(zip(logliks, hops)):
        if h == 1:
            wanted_full, shortcut_names = "retrieval", ["closed_book"]
        else:
            wanted_full = FULL
            shortcut_names = [n for n in ll if n != FULL and shortcut_kind(n) not in leave_out]
        missing = [n for n in [wanted_full, *shortcut_names] if n not in ll]
        if missing or not shortcut_names:
            raise ValueError(f"shortcut_gains: question {i} ({h} hops) lacks context(s) {missing or 'any shortcut'}; "
                             f"it has {sorted(ll)}")
        full.append(ll[wanted_full])
        rows.append({n: ll[n] for n in shortcut_names})
    if not rows:
        return ShortcutGains(np.zeros(0), np.zeros(0), [])
    width = max(len(r) for r in rows)
    table = np.full((len(rows), width), -np.inf)
    strongest = []
    for i, row in enumerate(rows):
        table[i, :len(row)] = list(row.values())
        strongest.append(max(row, key=row.get))
    gain, score = information_gain(np.asarray(full, np.float64), table, tau)
    return ShortcutGains(gain, score, strongest)


def information_gain_metrics(gains: ShortcutGains, hops: Sequence[int]) -> dict[str, float]:
    """Per-step metrics over the scored questions (the same keys every step; 0 where nothing was scored).

    ig/scored: count; ig/gain_mean, ig/score_mean: mean g and s_IG; ig/positive_rate: share with g > 0;
    ig/gain_mean_h{h}: mean g of the h-hop ones (h = 1, 2, 3); ig/wins_{kind}: among the scored multi-hop
    questions, the share whose strongest shortcut is of that kind (a single-hop question has one shortcut,
    closed book, so it is left out of this count).
    """
    hops = np.asarray(list(hops), np.int64)
    gain = np.asarray(gains.gain, np.float64)
    n = gain.size
    mean = lambda x: float(np.mean(x)) if np.size(x) else 0.0  # noqa: E731
    metrics = {"ig/scored": float(n), "ig/gain_mean": mean(gain), "ig/score_mean": mean(gains.score),
               "ig/positive_rate": mean(gain > 0)}
    for h in (1, 2, 3):
        metrics[f"ig/gain_mean_h{h}"] = mean(gain[hops == h])
    multi = [shortcut_kind(s) for s, h in zip(gains.strongest, hops) if h > 1]
    for kind in SHORTCUT_KINDS:
        metrics[f"ig/wins_{kind}"] = mean(np.asarray([k == kind for k in multi]))
    return metrics


@dataclasses.dataclass(frozen=True)
class ProposalCheck:
    """A proposer reply checked against its chain: parsed question/answer, s_fmt (eqs. 10-11), grounding."""

    question: str | None
    answer: str | None
    format_score: float
    grounded: bool

    @property
    def gated(self) -> bool:
        """The gate of eq. 12: s_fmt = 1 and grounded (only these questions are worth scoring)."""
        return abs(self.format_score - 1.0) <= 1e-9 and self.grounded


def check_proposal(response: str, record: dict) -> ProposalCheck:
    """Parse a proposer reply, score its format against the chain's answer, check grounding in its passages."""
    parsed = parse_proposer_output(response)
    return ProposalCheck(question=parsed.question, answer=parsed.answer,
                         format_score=format_score(response, record["answer"]),
                         grounded=is_grounded(parsed.answer, [p["text"] for p in record["passages"]]))


def information_gain_reward(trajectories: Sequence["Trajectory"], *, model, params, tokenizer, retriever,
                            cfg: IGConfig = IGConfig()) -> RewardOutput:
    """Dr.Free's proposer reward (eq. 12) for a batch of proposer trajectories, with a frozen anchor.

    Each trajectory's prompt carries its chain (`chain_prompt`); its response is the proposer's reply.
    r = format_weight * s_fmt + [s_fmt = 1 and grounded] * s_IG, where s_IG comes from the anchor
    (model, params, tokenizer) scoring the gated proposals' contexts (`anchor_logliks`, `shortcut_gains`).
    """
    trajectories = list(trajectories)
    if not trajectories:
        raise ValueError("information_gain_reward: no trajectories")
    records = [chain_of(t) for t in trajectories]
    checks = [check_proposal(t.response_text, r) for t, r in zip(trajectories, records)]
    gated = [i for i, c in enumerate(checks) if c.gated]
    proposals = [Proposal(checks[i].question, checks[i].answer, tuple(chain_passages(records[i]))) for i in gated]
    start = time.perf_counter()
    logliks = anchor_logliks(model, params, tokenizer, retriever, proposals, cfg)  # also with none: multi-host
    anchor_seconds = time.perf_counter() - start
    hops = [p.hops for p in proposals]
    gains = shortcut_gains(logliks, hops, leave_out=cfg.leave_out, tau=cfg.tau)
    s_ig = np.zeros(len(trajectories))
    s_ig[gated] = gains.score
    s_fmt = np.asarray([c.format_score for c in checks])
    grounded = np.asarray([c.grounded for c in checks])
    rewards = proposer_reward(s_fmt, grounded, s_ig, cfg.format_weight)
    metrics = {"proposer/format_mean": float(s_fmt.mean()), "proposer/format_full_rate": float(np.mean(s_fmt == 1.0)),
               "proposer/grounded_rate": float(grounded.mean()), "proposer/gated_rate": len(gated) / len(trajectories),
               "ig/anchor_contexts": float(sum(len(ll) for ll in logliks)), "ig/anchor_seconds": anchor_seconds,
               **information_gain_metrics(gains, hops)}
    return RewardOutput(rewards=np.asarray(rewards, np.float32), metrics=metrics)


def make_information_gain_reward(model, params, tokenizer, retriever, cfg: IGConfig = IGConfig()):
    """A trainer RewardFn (trajectories -> RewardOutput) with the anchor and retriever bound."""
    def reward_fn(trajectories):
        return information_gain_reward(trajectories, model=model, params=params, tokenizer=tokenizer,
                                       retriever=retriever, cfg=cfg)
    return reward_fn

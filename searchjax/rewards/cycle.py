"""Cycle-Consistent Search (CCS; An et al. 2026, arXiv:2604.12967): a gold-free reward from question reconstruction.

A good search trajectory is an information-preserving encoding of the question, so a reconstructor R
should recover the question q from it. Reconstruction reads the trajectory tau only through a bottleneck
that removes lexical shortcuts:

    trace(tau) = ((a_1, o_1), ..., (a_K, o_K))   a_k = the k-th executed search query, o_k = its observation;
                                                 the final response and every <think> block are dropped
    mask(a)    = a with each named-entity span replaced by its type tag [PERSON] | [ORG] | [LOC] | [MISC]
    psi(tau)   = ((mask(a_1), o_1), ..., (mask(a_K), o_K))        psi = mask o trace; o_k untouched
    q_hat      = R(psi(tau))                                       a judge (searchjax.judges), prompt
                                                                   ccs_reconstructor.v2 (the paper's
                                                                   appendix B.3; v1 is the short one)
    r(tau)     = cos(E(q), E(q_hat)) = <E(q), E(q_hat)> / (|E(q)| |E(q_hat)|)
    r(tau)     = 0   when q_hat is N/A, empty or garbage (`parse_reconstruction`), or tau made no search

E is one of our JAX embedders (`searchjax.models.encoder`): all-MiniLM-L6-v2 by default, or a decoder
embedder such as Qwen3-Embedding-4B (the paper's). Both texts are embedded the same way (as documents:
no query instruction), so the similarity is symmetric. The raw cosine is the reward, as in the paper (it
can in principle be negative; for two English questions under these embedders it practically never is).
The policy is then trained with GRPO on r (configs/ccs.py).

Decisions (each one is what the code does; tests/ccs checks them):

* Observations are exactly the text the policy read: the decoded loss-mask-0 token runs of the response
  that are information blocks ("\\n\\n<information>...</information>\\n\\n", truncated as the rollout
  truncated them), one per executed search, in order, byte for byte. Invalid-action observations are not
  search steps and are dropped with the rest of the generated text. Queries are `trajectory.queries`.
* Masking uses a NER backend from `searchjax.rewards.ner` (spaCy by default, or a transformers
  token-classification model such as bert-base-NER): the label -> tag table, the numeric labels left
  unmasked, and the NER's weakness on lowercase queries are documented there.
* Ablations of the paper, as config switches: `keep_final_response` (the final response, <think> blocks
  removed, is appended to the trace), `mask_queries=False` (unmasked actions), `include_queries=False`
  (observations only).
* Reconstructor replies: the reconstruction is the first line with content once a short preamble ending
  in "question:" ("Question:", "The agent was trying to answer the question:") and quotes are removed.
  "N/A" -> status na; nothing -> empty; fewer than 2 words of letters, more than `max_question_words`
  words, or retrieved-document markup -> garbage; a type tag left in it -> unresolved_tag (the prompt
  asks for N/A then). All score 0 and are counted. A trajectory without a search is not sent (reward 0,
  counted as no_search) unless the final response is kept.
* Infrastructure failures (timeout, HTTP error, dead endpoint, backend error: any `JudgeError`) give the
  trajectory's whole group advantages of zero (`advantage_overrides[uid]`, the advantages GRPO gives a
  group with equal rewards), its reward 0, and count in `ccs/failed_groups`; nothing is raised (as EviBack).
* Prompts: ccs_reconstructor.v2 carries the appendix's requirements (no evidence, no question; no
  compression; every part of the question justified by a step; the trace's intent; the trace's complexity,
  one hop per dependent search); v1, the short rules (use only the results, resolve every tag, N/A when
  under-specified), stays loadable and is the CcsConfig default, so results made with it stay reproducible.
* The RewardFn the loop calls (`make_ccs_reward`) stops the run when more than `max_failure_rate` of one
  step's reconstructor requests fail (`searchjax.rewards.judge_failures`); `ccs_reward` itself never raises.
* Identical requests of a step are asked once. With `audit_path`, one JSON line per request: step,
  trajectories, prompt name and sha256, request sha256, masked queries, judge description, reply, status,
  similarity, error.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from typing import TYPE_CHECKING, Sequence

import numpy as np

from searchjax.agent import protocol
from searchjax.judges.base import Judge, JudgeError, JudgeRequest
from searchjax.judges.templates import PromptTemplate, load_prompt, render_prompt
from searchjax.rewards.base import RewardOutput
from searchjax.rewards.eviback import append_audit, audit_path_in
from searchjax.rewards.judge_failures import check_failure_rate
from searchjax.rewards.ner import TAGS, NerBackend, load_ner, mask_queries
from searchjax.rewards.qa import exact_match

if TYPE_CHECKING:
    from searchjax.agent.rollout import Trajectory

# The trace as the reconstructor reads it (render_trace).
STEP_FORMAT = "Step {k}\n"
QUERY_FORMAT = "Search query: {query}\n"
OBSERVATION_FORMAT = "Observation:{observation}"
FINAL_RESPONSE_FORMAT = "Final response: {response}\n"
INFORMATION_HEAD = protocol.information_block("\0").split("\0")[0]  # "\n\n<information>"
STATUSES = ("ok", "na", "empty", "garbage", "unresolved_tag", "no_search", "failed")
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)
# A short preamble ending in "question:" ("Question:", "The agent was trying to answer the question:").
_PREAMBLE = re.compile(r"^.{0,80}?\bquestion(?:\s+(?:is|was|would be))?\s*:\s*", re.IGNORECASE)
_QUOTED = re.compile(r"^[\"\u201c](.+?)[\"\u201d]")  # a reply that starts with a quoted question
_WORD = re.compile(r"[^\W\d_]+(?:['-][^\W\d_]+)*|\d+")
_MARKUP = re.compile(r"</?(?:information|search|answer|think)>|Doc \d+\(Title:")  # copied trace, not a question


@dataclasses.dataclass(frozen=True)
class CcsConfig:
    """CCS's knobs (configs/ccs.py sets and comments each one)."""

    prompt: str = "ccs_reconstructor.v1"  # versioned prompt file (name in judges/prompts/ or a path)
    mask_queries: bool = True             # False = ablation "unmasked actions"
    include_queries: bool = True          # False = ablation "observations only"
    keep_final_response: bool = False     # True = ablation "keep final response"
    mask_numeric_entities: bool = False   # also mask DATE/TIME/CARDINAL/... spans (as [MISC])
    max_reply_tokens: int = 64            # reconstructor completion limit
    max_question_words: int = 64          # a longer reconstruction is garbage
    audit_path: str = ""                  # jsonl, one record per reconstructor request; "" = none
    max_failure_rate: float = 1.0         # make_ccs_reward stops the run above this failed-request fraction

    def __post_init__(self):
        if self.max_reply_tokens < 1 or self.max_question_words < 2:
            raise ValueError(f"CcsConfig: max_reply_tokens must be >= 1 and max_question_words >= 2, got {self}")
        if not 0.0 <= self.max_failure_rate <= 1.0:
            raise ValueError(f"CcsConfig.max_failure_rate={self.max_failure_rate} must be in [0, 1]")


# --- the bottleneck ------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Trace:
    """What the reconstructor reads: (query, observation) steps in order, and the final response if kept."""

    queries: tuple[str, ...]
    observations: tuple[str, ...]
    final_response: str | None = None


def _runs(mask: Sequence[int]) -> list[tuple[int, int, int]]:
    """Maximal runs (start, end, value) of equal values."""
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((start, i, int(mask[start])))
            start = i
    return runs


def _where(t: "Trajectory") -> str:
    return f"trajectory {t.prompt.uid!r} sample {t.sample_index}"


def search_observations(t: "Trajectory", tokenizer) -> list[str]:
    """The observation of each executed search, exactly as the policy read it (module docstring)."""
    if len(t.loss_mask) != len(t.response_ids):
        raise ValueError(f"{_where(t)}: loss_mask has {len(t.loss_mask)} entries for {len(t.response_ids)} "
                         "response tokens")
    texts = [tokenizer.decode(t.response_ids[s:e]) for s, e, v in _runs(t.loss_mask) if v == 0]
    observations = [x for x in texts if x.startswith(INFORMATION_HEAD)]
    if len(observations) != len(t.queries):
        raise ValueError(f"{_where(t)}: {len(t.queries)} queries but {len(observations)} information blocks among "
                         "its observation tokens; trajectories must come from searchjax.agent.rollout")
    return observations


def final_response_text(t: "Trajectory", tokenizer) -> str:
    """The generated text after the last observation, special tokens and <think> blocks removed, stripped."""
    runs = _runs(t.loss_mask)
    start = max((e for _, e, v in runs if v == 0), default=0)
    text = tokenizer.decode(t.response_ids[start:], skip_special_tokens=True)
    return _THINK.sub("", text).strip()


def trace(t: "Trajectory", tokenizer, *, keep_final_response: bool = False) -> Trace:
    """trace(tau): the search steps' (query, observation) pairs; the final response only when kept (ablation)."""
    return Trace(tuple(t.queries), tuple(search_observations(t, tokenizer)),
                 final_response_text(t, tokenizer) if keep_final_response else None)


def bottleneck(traces: Sequence[Trace], ner: NerBackend | None, cfg: CcsConfig) -> list[Trace]:
    """psi = mask o trace for each trace, with the ablation switches: queries masked (one NER call over every
    distinct query of the batch) unless mask_queries=False, dropped when include_queries=False. Observations
    and the final response are never touched."""
    if not cfg.include_queries:
        return [dataclasses.replace(tr, queries=()) for tr in traces]
    if not cfg.mask_queries:
        return list(traces)
    if ner is None:
        raise ValueError("ccs: mask_queries=True needs a NER backend")
    masked = iter(mask_queries([q for tr in traces for q in tr.queries], ner, mask_numeric=cfg.mask_numeric_entities))
    return [dataclasses.replace(tr, queries=tuple(next(masked) for _ in tr.queries)) for tr in traces]


def render_trace(tr: Trace) -> str:
    """The trace text: per step STEP_FORMAT, QUERY_FORMAT (when queries are shown), OBSERVATION_FORMAT (the
    observation verbatim; a newline is added only if it does not end with one), then FINAL_RESPONSE_FORMAT."""
    parts = []
    for k, observation in enumerate(tr.observations, start=1):
        step = STEP_FORMAT.format(k=k)
        if tr.queries:
            step += QUERY_FORMAT.format(query=tr.queries[k - 1])
        step += OBSERVATION_FORMAT.format(observation=observation)
        parts.append(step if step.endswith("\n") else step + "\n")
    if tr.final_response is not None:
        parts.append(FINAL_RESPONSE_FORMAT.format(response=tr.final_response))
    return "".join(parts)


def reconstruction_request(tr: Trace, template: PromptTemplate, cfg: CcsConfig) -> JudgeRequest:
    """The reconstructor's request: the prompt file with {trace} = render_trace(psi(tau)); nothing else enters."""
    return JudgeRequest(messages=render_prompt(template, trace=render_trace(tr)), max_tokens=cfg.max_reply_tokens)


def parse_reconstruction(text: str, cfg: CcsConfig) -> tuple[str, str | None]:
    """(status, question): status "ok" with the question, or "na" | "empty" | "garbage" | "unresolved_tag"."""
    line = ""
    for raw in (text or "").replace("```", "\n").splitlines():  # the first line with content after its preamble
        line = _PREAMBLE.sub("", raw.strip().strip("*_ ")).strip()
        quoted = _QUOTED.match(line)
        line = (quoted.group(1) if quoted else line).strip("\"'`*").strip()
        if line:
            break
    if not line:
        return "empty", None
    if re.match(r"^n\s*/?\s*a\b", line, re.IGNORECASE):
        return "na", None
    if any(tag in line for tag in TAGS):
        return "unresolved_tag", None
    words = _WORD.findall(line)
    letters = [w for w in words if not w.isdigit()]
    if len(letters) < 2 or len(words) > cfg.max_question_words or _MARKUP.search(line):
        return "garbage", None
    return "ok", line


def cosine_similarity(embedder, originals: Sequence[str], reconstructions: Sequence[str]) -> np.ndarray:
    """[N] cos(E(q_i), E(q_hat_i)) with the embedder's document-side encoding of both texts."""
    if not originals:
        return np.zeros(0, np.float64)
    a = np.asarray(embedder.encode(list(originals), is_query=False), np.float64)
    b = np.asarray(embedder.encode(list(reconstructions), is_query=False), np.float64)
    a /= np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b /= np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return (a * b).sum(axis=1)


# --- the reward --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class CcsResult:
    """Per-trajectory details of one CCS step (lists/arrays [N] in trajectory order)."""

    rewards: np.ndarray                 # float32
    statuses: list[str]                 # one of STATUSES
    reconstructions: list[str | None]   # the parsed question (status "ok") else None
    replies: list[str | None]           # the reconstructor's raw reply (None when not asked or failed)
    requests: list[JudgeRequest | None]  # what the reconstructor was sent (None: no search)
    overrides: dict[str, np.ndarray]    # uid -> zeros, for groups with an infrastructure failure
    failed_groups: set[str]
    metrics: dict[str, float]


def ccs_rewards(trajectories: Sequence["Trajectory"], judge: Judge, embedder, ner: NerBackend | None, tokenizer,
                cfg: CcsConfig, *, template: PromptTemplate | None = None, step: int = 0) -> CcsResult:
    """Run CCS on a batch (module docstring); never raises on reconstructor failures."""
    if not trajectories:
        raise ValueError("ccs: no trajectories")
    template = template or load_prompt(cfg.prompt)
    n = len(trajectories)
    usage_before = judge.usage.snapshot()
    statuses: list[str] = ["no_search"] * n
    raw = [trace(t, tokenizer, keep_final_response=cfg.keep_final_response) for t in trajectories]
    psis = bottleneck(raw, ner, cfg)
    requests: list[JudgeRequest | None] = [None] * n
    unique: dict[str, tuple[JudgeRequest, list[int]]] = {}
    for i, psi in enumerate(psis):
        if not psi.observations and psi.final_response is None:
            continue  # no search (and no kept final response): nothing to reconstruct from, reward 0
        requests[i] = reconstruction_request(psi, template, cfg)
        unique.setdefault(requests[i].sha256(), (requests[i], []))[1].append(i)
    asked = list(unique.values())
    results = judge.complete_many([r for r, _ in asked])
    replies: list[str | None] = [None] * n
    reconstructions: list[str | None] = [None] * n
    failed: set[str] = set()
    errors: dict[str, int] = {}
    records = []
    for (request, members), result in zip(asked, results):
        if isinstance(result, JudgeError):
            status, question, text = "failed", None, None
            errors[result.kind] = errors.get(result.kind, 0) + 1
        else:
            text = result.text
            status, question = parse_reconstruction(text, cfg)
        for i in members:
            statuses[i], reconstructions[i], replies[i] = status, question, text
            if status == "failed":
                failed.add(trajectories[i].prompt.uid)
        records.append({"time": time.time(), "step": step,
                        "trajectories": [[trajectories[i].prompt.uid, trajectories[i].sample_index] for i in members],
                        "prompt_name": template.name, "prompt_sha256": template.sha256,
                        "request_sha256": request.sha256(), "masked_queries": list(psis[members[0]].queries),
                        "judge": judge.describe(), "reply": text, "status": status, "reconstruction": question,
                        "error_kind": result.kind if isinstance(result, JudgeError) else None,
                        "error": str(result) if isinstance(result, JudgeError) else None})

    rewards = np.zeros(n, np.float64)
    ok = [i for i in range(n) if statuses[i] == "ok"]
    similarity = cosine_similarity(embedder, [trajectories[i].prompt.question for i in ok],
                                   [reconstructions[i] for i in ok])
    rewards[ok] = similarity
    by_request = {r.sha256(): float(rewards[m[0]]) for r, m in asked if statuses[m[0]] == "ok"}
    for record in records:
        record["similarity"] = by_request.get(record["request_sha256"])
    append_audit(cfg.audit_path, records)

    groups: dict[str, list[int]] = {}
    for i, t in enumerate(trajectories):
        groups.setdefault(t.prompt.uid, []).append(i)
    overrides = {uid: np.zeros(len(groups[uid]), np.float32) for uid in failed}
    usage_after = judge.usage.snapshot()
    metrics = {f"status/{s}": float(statuses.count(s)) for s in STATUSES}
    metrics.update({f"failures/{k}": float(v) for k, v in sorted(errors.items())})
    masked_entities = sum(q.count(tag) for tr in psis for q in tr.queries for tag in TAGS)
    metrics.update({
        "groups": float(len(groups)), "failed_groups": float(len(failed)),
        "zero_reward_replies": float(sum(statuses.count(s) for s in ("na", "empty", "garbage", "unresolved_tag"))),
        "similarity_mean": float(similarity.mean()) if ok else 0.0,
        "requests": float(len(asked)), "deduplicated": float(sum(len(m) - 1 for _, m in asked)),
        "masked_entities": float(masked_entities),
        "searches_per_trajectory": float(np.mean([len(tr.queries) for tr in raw])),
        "reconstructor_calls": float(usage_after["calls"] - usage_before["calls"]),
        "reconstructor_retries": float(usage_after["retries"] - usage_before["retries"]),
        "reconstructor_prompt_tokens": float(usage_after["prompt_tokens"] - usage_before["prompt_tokens"]),
        "reconstructor_completion_tokens": float(usage_after["completion_tokens"] - usage_before["completion_tokens"]),
        "reconstructor_cost_usd": float(usage_after["cost_usd"] - usage_before["cost_usd"]),
        # Diagnostic only (never part of the reward): is the gold-free reward tracking answer accuracy?
        "exact_match": float(np.mean([exact_match(t.answer, t.prompt.golden_answers) for t in trajectories])),
    })
    return CcsResult(rewards=rewards.astype(np.float32), statuses=statuses, reconstructions=reconstructions,
                     replies=replies, requests=requests, overrides=overrides, failed_groups=failed, metrics=metrics)


def ccs_reward(trajectories: Sequence["Trajectory"], judge: Judge, embedder, ner: NerBackend | None, tokenizer,
               cfg: CcsConfig, *, template: PromptTemplate | None = None, step: int = 0) -> RewardOutput:
    """RewardOutput: rewards r(tau), zero-advantage overrides for failed groups, metrics "ccs/..."."""
    return _output(ccs_rewards(trajectories, judge, embedder, ner, tokenizer, cfg, template=template, step=step))


def _output(result: CcsResult) -> RewardOutput:
    metrics = {f"ccs/{k}": v for k, v in result.metrics.items()}
    metrics["mean"] = float(result.rewards.mean())
    return RewardOutput(rewards=result.rewards, advantage_overrides=result.overrides, metrics=metrics)


def make_ccs_reward(judge: Judge, embedder, ner: NerBackend | None, tokenizer, cfg: CcsConfig):
    """A RewardFn (trajectories -> RewardOutput) that loads the prompt once and counts steps for the audit."""
    template = load_prompt(cfg.prompt)
    step = [0]

    def reward_fn(trajectories):
        result = ccs_rewards(trajectories, judge, embedder, ner, tokenizer, cfg, template=template, step=step[0])
        step[0] += 1
        failed = int(sum(v for k, v in result.metrics.items() if k.startswith("failures/")))  # failed requests
        check_failure_rate(failed, int(result.metrics["requests"]), cfg.max_failure_rate,
                           "config.ccs.max_failure_rate")
        return _output(result)
    reward_fn.judge, reward_fn.embedder, reward_fn.ner, reward_fn.template = judge, embedder, ner, template
    return reward_fn


def load_embedder(kind: str, path: str = "", *, dtype: str = "float32", batch_size: int = 64):
    """kind "bert" (path: an HF BERT-family dir; "" = all-MiniLM-L6-v2 from its package) or "decoder" (an HF
    decoder embedder dir such as Qwen3-Embedding-4B, through searchjax.models.decoder_embedder.DecoderEmbedder)."""
    from searchjax.models.decoder_embedder import load_decoder_embedder
    from searchjax.models.encoder import load_encoder
    if kind == "bert":
        return load_encoder(os.path.expanduser(path) if path else None, batch_size=batch_size, dtype=dtype)
    if kind == "decoder":
        if not path:
            raise ValueError("embedder: kind 'decoder' needs path = an HF embedder directory (e.g. Qwen3-Embedding-4B)")
        return load_decoder_embedder(os.path.expanduser(path), dtype=dtype, batch_size=batch_size)
    raise ValueError(f"embedder: kind {kind!r} is not one of ('bert', 'decoder')")


def reward_from_config(config, *, tokenizer, workdir: str | os.PathLike | None = None, local_model=None):
    """The CCS RewardFn of an experiment config (configs/ccs.py): `config.ccs` field for field (a relative
    audit_path is taken relative to `workdir`), the reconstructor from `config.reconstructor` (build_judge),
    the NER from `config.ner`, the embedder from `config.embedder`; `tokenizer` is the policy's."""
    from searchjax.judges import build_judge
    fields = config.ccs.to_dict()
    fields["audit_path"] = audit_path_in(workdir, fields["audit_path"], "config.ccs.audit_path")
    cfg = CcsConfig(**fields)
    ner = load_ner(config.ner.backend, config.ner.model) if cfg.mask_queries and cfg.include_queries else None
    embedder = load_embedder(config.embedder.kind, config.embedder.path, dtype=config.embedder.dtype,
                             batch_size=config.embedder.batch_size)
    judge = build_judge(config.reconstructor, local_model=local_model)
    return make_ccs_reward(judge, embedder, ner, tokenizer, cfg)


def build_ccs_reward(config, components, workdir):
    """The trainer's reward builder (searchjax.experiment.loop.REWARD_FNS signature: config, components, workdir).

    A local reconstructor with `local_checkpoint` "policy" gets a frozen copy of the initial policy
    parameters, taken now, before any update can donate the buffers the policy starts from.
    """
    local_model = None
    if config.reconstructor.backend == "local" and config.reconstructor.local_checkpoint == "policy":
        import jax
        import jax.numpy as jnp
        local_model = (components.model, jax.tree.map(jnp.copy, components.params), components.tokenizer)
    return reward_from_config(config, tokenizer=components.tokenizer, workdir=workdir, local_model=local_model)

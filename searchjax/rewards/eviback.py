"""EviBack: evidence-constrained Teacher backoff for GRPO groups in which every rollout scores EM = 0.

Search-R1 trains with r = EM(answer, gold) and GRPO over G rollouts per question. When all G rollouts score
0 (73% of groups in the paper's audit), every advantage is 0 and the question teaches nothing. EviBack
keeps every verifiable Actor reward and calls a Teacher only for those all-zero groups:

1. Actor-first precedence. rewards = EM for every trajectory, always. A group with any EM > 0 ("mixed",
   or all correct) gets no override, so the trainer's GRPO advantages for it are bit-identical to plain
   GRPO.
2. Stage A, gold-blind. For each trajectory i of an all-zero group, the Teacher sees the question and the
   passages that trajectory actually retrieved (unique by id, in retrieval order, rendered as Search-R1's
   `Doc k(Title: ...) text` lines, at most `max_evidence_passages`, each cut to `max_passage_chars`) and
   returns v_i in {Supported, Insufficient, Ambiguous}. `stage_a_request(question, hits, ...)` takes no
   reference answer at all, so gold-blindness holds by construction (the request also carries the same
   chat with the evidence replaced by "(no documents were retrieved)", which only a local judge with
   contextual calibration uses). A trajectory that retrieved nothing is Insufficient by rule (no call).
   Identical Stage A requests within a step are asked once.
3. Stage B, gold-aware, only when v_i != Insufficient and the Actor gave a non-empty answer: the Teacher
   compares the Actor's answer with the reference answers and returns j_i in {Correct, Partial,
   Incorrect}. It refines the answer judgement only; it cannot change v_i, so it can never overturn
   Insufficient.
4. Hybrid fallback reward (our choice; the paper combines status and reference-aligned F1):

       F1_ref_i = max(F1(answer_i, golds), c(j_i))     c(Correct)=1, c(Partial)=0.5, c(Incorrect)=0
       r_i      = s(v_i) * (1 + F1_ref_i) / 2            s(Supported)=1, s(Ambiguous)=0.5
       r_i      = 0                                      v_i = Insufficient (no Stage B, no reference)

   Why this form. The status is a multiplicative gate: answer overlap earns credit only when the
   trajectory's own evidence supports an answer, so a lucky or hallucinated guess without evidence
   earns nothing (that is what makes the backoff evidence-constrained), and an Insufficient
   trajectory's reward is a constant that cannot depend on the reference. Inside the gate, half the
   credit is for having retrieved sufficient evidence (the search skill that all-zero groups most need
   to learn) and half grows with answer quality, so among evidence-supported rollouts the better
   answers still rank higher. F1_ref takes the max of SQuAD token F1 and the Teacher's judgement: the
   Teacher can add credit EM/F1 miss (aliases, units, formats: "JFK" for "John F. Kennedy") but cannot
   remove verified lexical overlap. The ranking this induces is Supported+Correct (1) > Supported+Partial
   (0.75) > Supported+Incorrect = Ambiguous+Correct (0.5) > Ambiguous+Incorrect (0.25) > Insufficient (0).
   The weights are config fields.
5. Within-group normalisation and lambda scaling: A_i = lambda * (r_i - mean(r)) / (std(r) + 1e-6), std
   unbiased (`searchjax.rl.advantages.grpo_advantages` on the group), lambda = 0.1. A z-score in a group of
   G is at most (G - 1) / sqrt(G) (Samuelson's inequality with the unbiased std), which is exactly what a
   single verified hit among G - 1 misses gets; so every fallback advantage is at most lambda times the
   advantage of a verified Actor hit, and auxiliary supervision stays weaker than a verified one.
   The group's advantages are returned as `advantage_overrides[uid]`.
6. Failures. If any Teacher request of a group fails (timeout, HTTP error, dead endpoint, a reply that is
   still malformed after the correction round), that group's override is all zeros (the same advantages
   plain GRPO gives an all-zero group) and `eviback/failed_groups` counts it. Nothing is raised.

The Teacher is used only in training; evaluation is Actor-only. Every Teacher request is appended to an
audit jsonl (`audit_path`): step, stage, the trajectories it covers, prompt name and sha256 of the prompt
file, sha256 of the request, the judge's description (never a key), the replies, the parsed verdict or
the error, tokens and latency.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from typing import TYPE_CHECKING, Sequence

import numpy as np

from retrieval.corpus import format_passages
from searchjax.judges.base import Judge, JsonOutcome, JudgeRequest, ask_json_many
from searchjax.judges.templates import PromptTemplate, load_prompt, render_prompt
from searchjax.rewards.base import RewardOutput
from searchjax.rewards.qa import exact_match, f1_score
from searchjax.rl.advantages import grpo_advantages

if TYPE_CHECKING:
    from searchjax.agent.rollout import Trajectory

SUPPORTED, INSUFFICIENT, AMBIGUOUS = "Supported", "Insufficient", "Ambiguous"
VERDICTS = (SUPPORTED, AMBIGUOUS, INSUFFICIENT)  # the order the prompt lists them
CORRECT, PARTIAL, INCORRECT = "Correct", "Partial", "Incorrect"
JUDGEMENTS = (CORRECT, PARTIAL, INCORRECT)
STAGE_A_SPEC = {"verdict": VERDICTS}
STAGE_B_SPEC = {"judgement": JUDGEMENTS}
STAGE_A_CHOICES = tuple(json.dumps({"verdict": v}) for v in VERDICTS)
STAGE_B_CHOICES = tuple(json.dumps({"judgement": j}) for j in JUDGEMENTS)
NO_EVIDENCE = "(no documents were retrieved)"


@dataclasses.dataclass(frozen=True)
class EvibackConfig:
    """EviBack's knobs (configs/eviback.py sets and comments each one)."""

    lam: float = 0.1                          # lambda: fallback advantages are lambda * group z-scores
    stage_a_prompt: str = "eviback_stage_a.v1"  # versioned prompt file (name in judges/prompts/ or a path)
    stage_b_prompt: str = "eviback_stage_b.v1"
    max_evidence_passages: int = 10           # unique retrieved passages shown to Stage A
    max_passage_chars: int = 1200             # each passage's text cut to this many characters
    max_reply_tokens: int = 32                # Teacher completion limit (the replies are one short JSON object)
    weight_supported: float = 1.0             # s(Supported)
    weight_ambiguous: float = 0.5             # s(Ambiguous); s(Insufficient) is 0 by design
    credit_correct: float = 1.0               # c(Correct)
    credit_partial: float = 0.5               # c(Partial); c(Incorrect) is 0
    correction_rounds: int = 1                # re-asks of a reply that cannot be parsed
    epsilon: float = 1e-6                     # GRPO std epsilon
    audit_path: str = ""                      # jsonl, one record per Teacher request; "" = no audit file

    def __post_init__(self):
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"EvibackConfig.lam must be in [0, 1], got {self.lam}")
        for name in ("weight_supported", "weight_ambiguous", "credit_correct", "credit_partial"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"EvibackConfig.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.max_evidence_passages < 1 or self.max_passage_chars < 1 or self.max_reply_tokens < 1:
            raise ValueError(f"EvibackConfig: evidence and reply limits must be >= 1, got {self}")


# --- requests ------------------------------------------------------------------------------------------------

def evidence_hits(retrieved: Sequence[Sequence], max_passages: int) -> list:
    """The unique passages of a trajectory's searches (by id, first retrieval wins), in retrieval order."""
    seen, out = set(), []
    for hits in retrieved:
        for hit in hits:
            if hit.id not in seen:
                seen.add(hit.id)
                out.append(hit)
    return out[:max_passages]


def format_evidence(hits: Sequence, max_passage_chars: int) -> str:
    """Search-R1 passage lines, each passage's text cut to `max_passage_chars` (with "..." when cut)."""
    if not hits:
        return NO_EVIDENCE
    cut = [dataclasses.replace(h, text=h.text if len(h.text) <= max_passage_chars
                               else h.text[:max_passage_chars].rstrip() + "...") for h in hits]
    return format_passages(cut).rstrip("\n")


def stage_a_request(question: str, hits: Sequence, template: PromptTemplate, cfg: EvibackConfig) -> JudgeRequest:
    """The gold-blind Stage A request: only the question and the retrieved passages enter it."""
    messages = render_prompt(template, question=question, evidence=format_evidence(hits, cfg.max_passage_chars))
    null = render_prompt(template, question=question, evidence=NO_EVIDENCE)  # for local contextual calibration
    return JudgeRequest(messages=messages, max_tokens=cfg.max_reply_tokens, choices=STAGE_A_CHOICES,
                        null_messages=null)


def stage_b_request(question: str, answer: str, golds: Sequence[str], template: PromptTemplate,
                    cfg: EvibackConfig) -> JudgeRequest:
    """The gold-aware Stage B request: question, the Actor's answer, the reference answers."""
    references = " | ".join(golds)
    messages = render_prompt(template, question=question, answer=answer, references=references)
    return JudgeRequest(messages=messages, max_tokens=cfg.max_reply_tokens, choices=STAGE_B_CHOICES)


def fallback_reward(verdict: str, judgement: str | None, answer: str | None, golds: Sequence[str],
                    cfg: EvibackConfig) -> float:
    """r = s(v) * (1 + max(F1, c(j))) / 2, and 0 for Insufficient (module docstring, item 4)."""
    if verdict == INSUFFICIENT:
        return 0.0
    if verdict not in (SUPPORTED, AMBIGUOUS):
        raise ValueError(f"fallback_reward: verdict {verdict!r} is not one of {VERDICTS}")
    status = cfg.weight_supported if verdict == SUPPORTED else cfg.weight_ambiguous
    credit = {CORRECT: cfg.credit_correct, PARTIAL: cfg.credit_partial, INCORRECT: 0.0, None: 0.0}[judgement]
    f1_ref = max(f1_score(answer, golds), credit)
    return status * (1.0 + f1_ref) / 2.0


# --- audit ---------------------------------------------------------------------------------------------------

_AUDIT_LOCK = threading.Lock()


def append_audit(path: str, records: Sequence[dict]) -> None:
    """Append records to a jsonl file (created with its folder), one JSON object per line."""
    if not path or not records:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with _AUDIT_LOCK, open(path, "a", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def audit_path_in(workdir: str | os.PathLike | None, audit: str, field: str) -> str:
    """The audit file a config names (`field`, for the error): kept when absolute or empty, else under workdir."""
    if not audit or os.path.isabs(audit):
        return audit
    if workdir is None:
        raise ValueError(f"{field}={audit!r} is relative: pass the run's workdir")
    return os.path.join(os.fspath(workdir), audit)


def _audit_record(outcome: JsonOutcome, stage: str, template: PromptTemplate, judge: Judge, step: int,
                  covers: list[tuple[str, int]], extra: dict) -> dict:
    error = outcome.error
    return {"time": time.time(), "step": step, "stage": stage, "trajectories": [list(c) for c in covers],
            "prompt_name": template.name, "prompt_sha256": template.sha256,
            "request_sha256": outcome.request.sha256(), "judge": judge.describe(), "ok": outcome.ok,
            "parsed": outcome.parsed, "error_kind": error.kind if error is not None else None,
            "error": str(error) if error is not None else None,
            "replies": [r.text for r in outcome.replies],
            "choice_scores": [list(r.choice_scores) if r.choice_scores else None for r in outcome.replies],
            "attempts": sum(r.attempts for r in outcome.replies),
            "prompt_tokens": sum(r.prompt_tokens for r in outcome.replies),
            "completion_tokens": sum(r.completion_tokens for r in outcome.replies),
            "latency_s": sum(r.latency_s for r in outcome.replies), **extra}


# --- the reward ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class EvibackResult:
    """Per-trajectory details of one EviBack step (all arrays [N] in trajectory order)."""

    em: np.ndarray                    # Actor rewards (EM), float32
    all_zero: np.ndarray              # bool: the trajectory's group is all-zero
    verdicts: list[str | None]        # Stage A verdict (None outside all-zero groups or on failure)
    judgements: list[str | None]      # Stage B judgement (None when Stage B did not run or failed)
    fallback: np.ndarray              # raw fallback reward r_i (0 outside all-zero groups), float64
    overrides: dict[str, np.ndarray]  # uid -> lambda * z-scores (zeros for failed groups)
    failed_groups: set[str]
    metrics: dict[str, float]


def _groups(trajectories: Sequence["Trajectory"]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(trajectories):
        groups.setdefault(t.prompt.uid, []).append(i)
    return groups


def eviback_fallback(trajectories: Sequence["Trajectory"], judge: Judge, cfg: EvibackConfig, *,
                     templates: tuple[PromptTemplate, PromptTemplate] | None = None, step: int = 0) -> EvibackResult:
    """Run EviBack on a batch (see the module docstring); never raises on Teacher failures."""
    if not trajectories:
        raise ValueError("eviback: no trajectories")
    template_a, template_b = templates or (load_prompt(cfg.stage_a_prompt), load_prompt(cfg.stage_b_prompt))
    n = len(trajectories)
    usage_before = judge.usage.snapshot()
    em = np.asarray([exact_match(t.answer, t.prompt.golden_answers) for t in trajectories], np.float32)
    groups = _groups(trajectories)
    zero_groups = {uid: members for uid, members in groups.items() if not np.any(em[members] > 0)}
    all_zero = np.zeros(n, bool)
    for members in zero_groups.values():
        all_zero[members] = True
    verdicts: list[str | None] = [None] * n
    judgements: list[str | None] = [None] * n
    failed: set[str] = set()
    records: list[dict] = []
    counts = {f"verdict/{v}": 0 for v in VERDICTS}
    counts.update({f"judgement/{j}": 0 for j in JUDGEMENTS})
    counts.update(verdict_no_evidence=0, stage_a_requests=0, stage_a_calls=0, stage_b_requests=0, stage_b_calls=0,
                  stage_b_skipped_no_answer=0, stage_a_deduplicated=0, teacher_failures=0)

    # Stage A (gold-blind): one request per distinct (question, evidence); no evidence -> Insufficient by rule.
    unique: dict[str, tuple[JudgeRequest, list[int]]] = {}
    for members in zero_groups.values():
        for i in members:
            t = trajectories[i]
            hits = evidence_hits(t.retrieved, cfg.max_evidence_passages)
            if not hits:
                verdicts[i] = INSUFFICIENT
                counts["verdict_no_evidence"] += 1
                continue
            request = stage_a_request(t.prompt.question, hits, template_a, cfg)
            key = request.sha256()
            if key in unique:
                counts["stage_a_deduplicated"] += 1
            unique.setdefault(key, (request, []))[1].append(i)
    requests_a = list(unique.values())
    outcomes_a = ask_json_many(judge, [r for r, _ in requests_a], STAGE_A_SPEC,
                               correction_rounds=cfg.correction_rounds)
    counts["stage_a_requests"] = len(requests_a)
    for (request, members), outcome in zip(requests_a, outcomes_a):
        counts["stage_a_calls"] += len(outcome.replies) + (outcome.error is not None and not outcome.replies)
        covers = [(trajectories[i].prompt.uid, trajectories[i].sample_index) for i in members]
        doc_ids = [h.id for h in evidence_hits(trajectories[members[0]].retrieved, cfg.max_evidence_passages)]
        records.append(_audit_record(outcome, "A", template_a, judge, step, covers, {"doc_ids": doc_ids}))
        for i in members:
            if outcome.ok:
                verdicts[i] = outcome.parsed["verdict"]
            else:
                failed.add(trajectories[i].prompt.uid)
        if not outcome.ok:
            counts["teacher_failures"] += 1
    for i in np.flatnonzero(all_zero):
        if verdicts[i] is not None:
            counts[f"verdict/{verdicts[i]}"] += 1

    # Stage B (gold-aware): only for verdict != Insufficient, a non-empty answer, in a group still alive.
    b_index = []
    for i in np.flatnonzero(all_zero):
        t = trajectories[i]
        if t.prompt.uid in failed or verdicts[i] in (None, INSUFFICIENT):
            continue
        if not (t.answer or "").strip():
            counts["stage_b_skipped_no_answer"] += 1
            continue
        b_index.append(int(i))
    requests_b = [stage_b_request(trajectories[i].prompt.question, trajectories[i].answer,
                                  trajectories[i].prompt.golden_answers, template_b, cfg) for i in b_index]
    outcomes_b = ask_json_many(judge, requests_b, STAGE_B_SPEC, correction_rounds=cfg.correction_rounds)
    counts["stage_b_requests"] = len(requests_b)
    for i, outcome in zip(b_index, outcomes_b):
        t = trajectories[i]
        counts["stage_b_calls"] += len(outcome.replies) + (outcome.error is not None and not outcome.replies)
        records.append(_audit_record(outcome, "B", template_b, judge, step, [(t.prompt.uid, t.sample_index)],
                                     {"verdict": verdicts[i], "answer": t.answer,
                                      "golden_answers": list(t.prompt.golden_answers)}))
        if outcome.ok:
            judgements[i] = outcome.parsed["judgement"]
            counts[f"judgement/{judgements[i]}"] += 1
        else:
            failed.add(t.prompt.uid)
            counts["teacher_failures"] += 1
    append_audit(cfg.audit_path, records)

    # Fallback rewards, group z-scores, lambda.
    fallback = np.zeros(n, np.float64)
    overrides: dict[str, np.ndarray] = {}
    for uid, members in zero_groups.items():
        if uid in failed:
            overrides[uid] = np.zeros(len(members), np.float32)
            continue
        for i in members:
            t = trajectories[i]
            fallback[i] = fallback_reward(verdicts[i], judgements[i], t.answer, t.prompt.golden_answers, cfg)
        z = grpo_advantages(fallback[members], [uid] * len(members), epsilon=cfg.epsilon)
        overrides[uid] = (np.float32(cfg.lam) * z).astype(np.float32)

    usage_after = judge.usage.snapshot()
    backed = [i for uid, m in zero_groups.items() if uid not in failed for i in m]
    adv = np.concatenate(list(overrides.values())) if overrides else np.zeros(0, np.float32)
    metrics = {"groups": float(len(groups)), "all_zero_groups": float(len(zero_groups)),
               "all_zero_group_frac": len(zero_groups) / len(groups), "failed_groups": float(len(failed)),
               "backed_off_groups": float(sum(1 for u, a in overrides.items() if u not in failed and np.any(a != 0))),
               "teacher_calls": float(usage_after["calls"] - usage_before["calls"]),
               "teacher_retries": float(usage_after["retries"] - usage_before["retries"]),
               "fallback_reward_mean": float(fallback[backed].mean()) if backed else 0.0,
               "fallback_adv_abs_max": float(np.abs(adv).max()) if adv.size else 0.0,
               "teacher_prompt_tokens": float(usage_after["prompt_tokens"] - usage_before["prompt_tokens"]),
               "teacher_completion_tokens": float(usage_after["completion_tokens"] - usage_before["completion_tokens"]),
               "teacher_cost_usd": float(usage_after["cost_usd"] - usage_before["cost_usd"])}
    metrics.update({k: float(v) for k, v in counts.items()})
    return EvibackResult(em=em, all_zero=all_zero, verdicts=verdicts, judgements=judgements, fallback=fallback,
                         overrides=overrides, failed_groups=failed, metrics=metrics)


def eviback_reward(trajectories: Sequence["Trajectory"], judge: Judge, cfg: EvibackConfig, *,
                   templates: tuple[PromptTemplate, PromptTemplate] | None = None, step: int = 0) -> RewardOutput:
    """RewardOutput: rewards = EM (Actor-first), advantage_overrides for all-zero groups, metrics "eviback/..."."""
    result = eviback_fallback(trajectories, judge, cfg, templates=templates, step=step)
    metrics = {f"eviback/{k}": v for k, v in result.metrics.items()}
    metrics["mean"] = float(result.em.mean())
    return RewardOutput(rewards=result.em, advantage_overrides=result.overrides, metrics=metrics)


def make_eviback_reward(judge: Judge, cfg: EvibackConfig):
    """A RewardFn (trajectories -> RewardOutput) that loads the prompts once and counts steps for the audit."""
    templates = (load_prompt(cfg.stage_a_prompt), load_prompt(cfg.stage_b_prompt))
    step = [0]

    def reward_fn(trajectories):
        out = eviback_reward(trajectories, judge, cfg, templates=templates, step=step[0])
        step[0] += 1
        return out
    reward_fn.judge = judge
    reward_fn.templates = templates
    return reward_fn


def reward_from_config(config, *, workdir: str | os.PathLike | None = None, local_model=None):
    """The EviBack RewardFn of an experiment config (configs/eviback.py): `config.eviback` field for field
    (a relative audit_path is taken relative to `workdir`) and the Teacher built from `config.teacher`."""
    from searchjax.judges import build_judge
    fields = config.eviback.to_dict()
    fields["audit_path"] = audit_path_in(workdir, fields["audit_path"], "config.eviback.audit_path")
    return make_eviback_reward(build_judge(config.teacher, local_model=local_model), EvibackConfig(**fields))


def build_eviback_reward(config, components, workdir):
    """The trainer's reward builder (searchjax.rl.loop.REWARD_FNS signature: config, components, workdir).

    With a local Teacher whose `local_checkpoint` is "policy", the judge gets a frozen copy of the initial
    policy parameters, taken now, before any update can donate the buffers the policy starts from.
    """
    local_model = None
    if config.teacher.backend == "local" and config.teacher.local_checkpoint == "policy":
        import jax
        import jax.numpy as jnp
        local_model = (components.model, jax.tree.map(jnp.copy, components.params), components.tokenizer)
    return reward_from_config(config, workdir=workdir, local_model=local_model)

"""EviBack: evidence-constrained Teacher backoff for GRPO groups in which every rollout scores EM = 0.

Search-R1 trains with r = EM(answer, gold) and GRPO over G rollouts per question. When all G rollouts score
0 (73% of groups in the paper's audit), every advantage is 0 and the question teaches nothing. EviBack
(Ma et al. 2026, arXiv:2607.23955; public release github.com/chery-nextai/eviback) keeps every verifiable
Actor reward and calls a Teacher only for those all-zero groups. The Teacher's whole policy (prompts, the
gating table, reward weights, reply parsers, Stage B mode) is one `searchjax.judges.teacher_bundle.TeacherPolicy`:
built from the config's prompt files, or loaded from a frozen bundle (`bundle`, hashes verified; E2E-APE in
`searchjax.judges.ape` produces them).

1. Actor-first precedence. rewards = EM for every trajectory, always. A group with any EM > 0 ("mixed",
   or all correct) gets no override, so the trainer's GRPO advantages for it are bit-identical to plain
   GRPO.
2. Stage A, gold-blind. For each trajectory i of an all-zero group, the Teacher sees the question and the
   passages that trajectory actually retrieved (unique by id, in retrieval order, rendered as Search-R1's
   `Doc k(Title: ...) text` lines, at most `max_evidence_passages`, each cut to `max_passage_chars`) and
   returns v_i in {Supported, Insufficient, Ambiguous}. `stage_a_request(question, hits, ...)` takes no
   reference answer at all, and a policy's Stage A prompt may hold no placeholder but {question} and
   {evidence}, so gold-blindness holds by construction (the request also carries the same chat with the
   evidence replaced by "(no documents were retrieved)", which only a local judge with contextual
   calibration uses). A trajectory that retrieved nothing is Insufficient by rule (no call). Identical
   Stage A requests within a step are asked once.
3. Stage B, gold-aware, only when the gate opens it (v_i in `open_stage_b`, by default Supported and
   Ambiguous: never Insufficient, so Stage B can never overturn an Insufficient verdict). Two modes:
   * "refine" (the paper's): the Teacher sees the question, the same evidence, the Actor's answer ("(no
     answer)" when there is none) and the references, which it may use only as a candidate to verify, never
     as evidence, and writes the answer the evidence supports in the references' form (y_i; "" when the
     evidence supports none). Called for every gate-passing trajectory, answered or not (as the release
     does); y_i is what the gate's gold-coverage figure measures.
   * "grade" (our earlier mode, kept as an option): only when the Actor gave a non-empty answer, the
     Teacher compares it with the references and returns j_i in {Correct, Partial, Incorrect}.
4. Fallback reward, r_i = 0 whenever v_i = Insufficient (no Stage B, no reference), else with
   s(Supported) = weight_supported = 1, s(Ambiguous) = weight_ambiguous = 0.5:

     refine:  r_i = s(v_i) * (beta * a_i + gamma * [answered_i] * F1(y_i, golds))
              a_i = 1 when the Actor answered, no_answer_factor (0.5) when it did not
     grade:   r_i = s(v_i) * (1 + max(F1(answer_i, golds), c(j_i))) / 2,  c(Correct)=1, c(Partial)=0.5

   beta = status_credit = 0.1 and gamma = answer_credit = 0.1 are the release's frozen reward ("base partial
   reward 0.1, gold token-F1 bonus 0.1"; only their ratio matters after the z-score below), and as in the
   release the answer term counts only for a trajectory that ended with an answer. `no_answer_factor` is our
   addition: in the release a supported trajectory that never answered earns beta, the same as one that
   answered and whose refined answer misses the reference; the paper credits EviBack with better stopping
   and valid-answer rates, so here a trajectory without an answer earns strictly less than any answered one
   with the same verdict (Supported: 0.05 < 0.1 <= 0.1 + 0.1 F1). In grade mode (unchanged) a missing
   answer earns what an Incorrect one does. The grade-mode form makes the status a multiplicative gate
   with half the credit for sufficient evidence and half growing with answer quality; F1_ref takes the max
   of SQuAD token F1 and the judgement so the Teacher can add credit EM/F1 miss but never remove verified
   overlap. All weights live in the gate table.
5. Within-group normalisation and lambda scaling: A_i = lambda * (r_i - mean(r)) / (std(r) + 1e-6), std
   unbiased (`searchjax.rl.advantages.grpo_advantages` on the group), lambda = 0.1. A z-score in a group of
   G is at most (G - 1) / sqrt(G) (Samuelson's inequality with the unbiased std), which is exactly what a
   single verified hit among G - 1 misses gets; so every fallback advantage is at most lambda times the
   advantage of a verified Actor hit, and auxiliary supervision stays weaker than a verified one.
   The group's advantages are returned as `advantage_overrides[uid]`.
6. Failures. If any Teacher request of a group fails (timeout, HTTP error, dead endpoint, a reply that is
   still unparseable after the correction round, a reasoning reply cut inside its think block), that
   group's override is all zeros (the same advantages plain GRPO gives an all-zero group) and
   `eviback/failed_groups` counts it. Nothing is raised. (The release instead falls back to Stage A's result
   when Stage B fails; we keep one rule for both stages.)

The Teacher is used only in training; evaluation is Actor-only. Every Teacher request is appended to an
audit jsonl (`audit_path`): step, stage, the trajectories it covers, prompt name and sha256 of the prompt
file, the policy (name, bundle path and manifest hash), sha256 of the request, the judge's description
(never a key), the replies, the parsed fields or the error, tokens and latency.
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
from searchjax.judges.base import Judge, JsonOutcome, JudgeRequest
from searchjax.judges.teacher_bundle import (AMBIGUOUS, CORRECT, INCORRECT, INSUFFICIENT, JUDGEMENTS,  # noqa: F401
                                             MODES, PARTIAL, SUPPORTED, VERDICTS, Gate, TeacherPolicy,
                                             ask_parsed_many, default_parsers, load_bundle, policy_from_prompts)
from searchjax.judges.templates import PromptTemplate, render_prompt
from searchjax.rewards.base import RewardOutput
from searchjax.rewards.qa import exact_match, f1_score
from searchjax.rl.advantages import grpo_advantages

if TYPE_CHECKING:
    from searchjax.agent.rollout import Trajectory

STAGE_A_SPEC = {"verdict": VERDICTS}
STAGE_B_SPEC = {"judgement": JUDGEMENTS}
STAGE_A_CHOICES = tuple(json.dumps({"verdict": v}) for v in VERDICTS)
STAGE_B_CHOICES = tuple(json.dumps({"judgement": j}) for j in JUDGEMENTS)
NO_EVIDENCE = "(no documents were retrieved)"
NO_ANSWER = "(no answer)"


@dataclasses.dataclass(frozen=True)
class EvibackConfig:
    """EviBack's knobs (configs/eviback.py sets and comments each one)."""

    lam: float = 0.1                          # lambda: fallback advantages are lambda * group z-scores
    stage_a_prompt: str = "eviback_stage_a.v1"  # versioned prompt file (name in judges/prompts/ or a path)
    stage_b_prompt: str = "eviback_stage_b.v1"
    stage_b_mode: str = "grade"               # "refine" (the paper's) | "grade"
    bundle: str = ""                          # a frozen Teacher bundle directory: replaces the policy fields
    max_evidence_passages: int = 10           # unique retrieved passages shown to the Teacher
    max_passage_chars: int = 1200             # each passage's text cut to this many characters
    max_reply_tokens: int = 32                # Teacher completion limit (a reasoning Teacher needs thousands)
    open_stage_b: tuple[str, ...] = (SUPPORTED, AMBIGUOUS)  # Stage A verdicts that open Stage B
    weight_supported: float = 1.0             # s(Supported)
    weight_ambiguous: float = 0.5             # s(Ambiguous); s(Insufficient) is 0 by design
    credit_correct: float = 1.0               # grade: c(Correct)
    credit_partial: float = 0.5               # grade: c(Partial); c(Incorrect) is 0
    status_credit: float = 0.1                # refine: beta
    answer_credit: float = 0.1                # refine: gamma
    no_answer_factor: float = 0.5             # refine: beta's factor for a trajectory without an answer
    correction_rounds: int = 1                # re-asks of a reply that cannot be parsed
    epsilon: float = 1e-6                     # GRPO std epsilon
    audit_path: str = ""                      # jsonl, one record per Teacher request; "" = no audit file

    def __post_init__(self):
        object.__setattr__(self, "open_stage_b", tuple(self.open_stage_b))
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"EvibackConfig.lam must be in [0, 1], got {self.lam}")
        if self.stage_b_mode not in MODES:
            raise ValueError(f"EvibackConfig.stage_b_mode={self.stage_b_mode!r}; valid: {MODES}")
        if self.max_evidence_passages < 1 or self.max_passage_chars < 1 or self.max_reply_tokens < 1:
            raise ValueError(f"EvibackConfig: evidence and reply limits must be >= 1, got {self}")
        try:
            gate_from_config(self)
        except ValueError as e:
            raise ValueError(f"EvibackConfig: {e}") from None


def gate_from_config(cfg: EvibackConfig) -> Gate:
    """The gating table the config's fields describe (used when no bundle is given)."""
    return Gate(open_stage_b=cfg.open_stage_b, weight_supported=cfg.weight_supported,
                weight_ambiguous=cfg.weight_ambiguous, credit_correct=cfg.credit_correct,
                credit_partial=cfg.credit_partial, status_credit=cfg.status_credit, answer_credit=cfg.answer_credit,
                no_answer_factor=cfg.no_answer_factor)


def policy_from_config(cfg: EvibackConfig) -> TeacherPolicy:
    """The Teacher policy: the frozen bundle `cfg.bundle` (verified; refused on a hash mismatch), else the
    config's prompt files, Stage B mode and gate fields with the default JSON parsers."""
    if cfg.bundle:
        return load_bundle(cfg.bundle)
    return policy_from_prompts(cfg.stage_a_prompt, cfg.stage_b_prompt, mode=cfg.stage_b_mode,
                               gate=gate_from_config(cfg))


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


def _render(template: PromptTemplate, values: dict) -> tuple[dict, ...]:
    """The template filled with the values it has placeholders for (a Stage B prompt may omit some)."""
    return render_prompt(template, **{k: v for k, v in values.items() if k in template.fields})


def stage_a_request(question: str, hits: Sequence, template: PromptTemplate, cfg: EvibackConfig, *,
                    choices: Sequence[str] = STAGE_A_CHOICES) -> JudgeRequest:
    """The gold-blind Stage A request: only the question and the retrieved passages enter it."""
    messages = render_prompt(template, question=question, evidence=format_evidence(hits, cfg.max_passage_chars))
    null = render_prompt(template, question=question, evidence=NO_EVIDENCE)  # for local contextual calibration
    return JudgeRequest(messages=messages, max_tokens=cfg.max_reply_tokens, choices=tuple(choices),
                        null_messages=null if choices else ())


def stage_b_request(question: str, answer: str | None, golds: Sequence[str], template: PromptTemplate,
                    cfg: EvibackConfig, *, hits: Sequence = (), choices: Sequence[str] = STAGE_B_CHOICES) -> JudgeRequest:
    """The gold-aware Stage B request: question, the Actor's answer, the reference answers, and (for a prompt
    with an {evidence} placeholder, e.g. refine mode) the same evidence Stage A saw."""
    values = {"question": question, "answer": answer if (answer or "").strip() else NO_ANSWER, "references": " | ".join(golds),
              "evidence": format_evidence(hits, cfg.max_passage_chars)}
    return JudgeRequest(messages=_render(template, values), max_tokens=cfg.max_reply_tokens, choices=tuple(choices))


def grade_reward(verdict: str, judgement: str | None, answer: str | None, golds: Sequence[str], gate: Gate) -> float:
    """Grade mode: r = s(v) * (1 + max(F1, c(j))) / 2, and 0 for Insufficient (module docstring, item 4)."""
    if verdict not in VERDICTS:
        raise ValueError(f"fallback reward: verdict {verdict!r} is not one of {VERDICTS}")
    if verdict == INSUFFICIENT:
        return 0.0
    credit = {CORRECT: gate.credit_correct, PARTIAL: gate.credit_partial, INCORRECT: 0.0, None: 0.0}[judgement]
    return gate.status_weight(verdict) * (1.0 + max(f1_score(answer, golds), credit)) / 2.0


def refine_reward(verdict: str, refined: str | None, answered: bool, golds: Sequence[str], gate: Gate) -> float:
    """Refine mode: r = s(v) * (beta * a + gamma * [answered] * F1(refined, golds)), 0 for Insufficient."""
    if verdict not in VERDICTS:
        raise ValueError(f"fallback reward: verdict {verdict!r} is not one of {VERDICTS}")
    if verdict == INSUFFICIENT:
        return 0.0
    status = gate.status_credit * (1.0 if answered else gate.no_answer_factor)
    answer = gate.answer_credit * f1_score(refined, golds) if answered and refined else 0.0
    return gate.status_weight(verdict) * (status + answer)


def fallback_reward(verdict: str, judgement: str | None, answer: str | None, golds: Sequence[str],
                    cfg: EvibackConfig) -> float:
    """Grade-mode fallback reward with the config's weights."""
    return grade_reward(verdict, judgement, answer, golds, gate_from_config(cfg))


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


def _audit_record(outcome: JsonOutcome, stage: str, template: PromptTemplate, policy: TeacherPolicy, judge: Judge,
                  step: int, covers: list[tuple[str, int]], extra: dict) -> dict:
    error = outcome.error
    return {"time": time.time(), "step": step, "stage": stage, "trajectories": [list(c) for c in covers],
            "prompt_name": template.name, "prompt_sha256": template.sha256,
            "policy": policy.name, "bundle": policy.path, "bundle_sha256": policy.sha256,
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
    judgements: list[str | None]      # grade mode: Stage B judgement (None when Stage B did not run or failed)
    fallback: np.ndarray              # raw fallback reward r_i (0 outside all-zero groups), float64
    overrides: dict[str, np.ndarray]  # uid -> lambda * z-scores (zeros for failed groups)
    failed_groups: set[str]
    metrics: dict[str, float]
    refined: list[str | None] = dataclasses.field(default_factory=list)  # refine mode: y_i ("" = none supported)
    failures: list[dict] = dataclasses.field(default_factory=list)  # per failed request: stage, uid, kind, error, reply


def _groups(trajectories: Sequence["Trajectory"]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(trajectories):
        groups.setdefault(t.prompt.uid, []).append(i)
    return groups


def _calls(outcome: JsonOutcome) -> int:
    return len(outcome.replies) + (outcome.error is not None and not outcome.replies)


def _failure(stage: str, uid: str, outcome: JsonOutcome) -> dict:
    return {"stage": stage, "uid": uid, "kind": outcome.error.kind, "error": str(outcome.error)[:300],
            "reply": outcome.replies[-1].text[:500] if outcome.replies else None}


def eviback_fallback(trajectories: Sequence["Trajectory"], judge: Judge, cfg: EvibackConfig, *,
                     templates: tuple[PromptTemplate, PromptTemplate] | None = None,
                     policy: TeacherPolicy | None = None, step: int = 0) -> EvibackResult:
    """Run EviBack on a batch (see the module docstring); never raises on Teacher failures.

    policy: the Teacher policy (default `policy_from_config(cfg)`); templates: (Stage A, Stage B) prompts with
    the config's mode, gate and the default parsers, for callers that load prompts themselves."""
    if not trajectories:
        raise ValueError("eviback: no trajectories")
    if policy is None and templates is not None:
        parser_a, parser_b = default_parsers(cfg.stage_b_mode)
        policy = TeacherPolicy(f"{templates[0].name}+{templates[1].name}", templates[0], templates[1], parser_a,
                               parser_b, cfg.stage_b_mode, gate_from_config(cfg))
    policy = policy or policy_from_config(cfg)
    gate, refine = policy.gate, policy.mode == "refine"
    choices_a = tuple(text for _, text in policy.parser_a.choices)
    choices_b = () if refine else tuple(text for _, text in policy.parser_b.choices)
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
    refined: list[str | None] = [None] * n
    failed: set[str] = set()
    failures: list[dict] = []
    records: list[dict] = []
    counts = {f"verdict/{v}": 0 for v in VERDICTS}
    counts.update({f"judgement/{j}": 0 for j in JUDGEMENTS})
    counts.update(verdict_no_evidence=0, stage_a_requests=0, stage_a_calls=0, stage_b_requests=0, stage_b_calls=0,
                  stage_b_skipped_no_answer=0, stage_a_deduplicated=0, teacher_failures=0, teacher_malformed=0,
                  refined_answers=0, refined_empty=0)

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
            request = stage_a_request(t.prompt.question, hits, policy.stage_a, cfg, choices=choices_a)
            key = request.sha256()
            if key in unique:
                counts["stage_a_deduplicated"] += 1
            unique.setdefault(key, (request, []))[1].append(i)
    requests_a = list(unique.values())
    outcomes_a = ask_parsed_many(judge, [r for r, _ in requests_a], policy.parser_a,
                                 correction_rounds=cfg.correction_rounds)
    counts["stage_a_requests"] = len(requests_a)
    for (request, members), outcome in zip(requests_a, outcomes_a):
        counts["stage_a_calls"] += _calls(outcome)
        covers = [(trajectories[i].prompt.uid, trajectories[i].sample_index) for i in members]
        doc_ids = [h.id for h in evidence_hits(trajectories[members[0]].retrieved, cfg.max_evidence_passages)]
        records.append(_audit_record(outcome, "A", policy.stage_a, policy, judge, step, covers, {"doc_ids": doc_ids}))
        for i in members:
            if outcome.ok:
                verdicts[i] = outcome.parsed["verdict"]
            else:
                failed.add(trajectories[i].prompt.uid)
        if not outcome.ok:
            counts["teacher_failures"] += 1
            counts["teacher_malformed"] += outcome.error.kind == "malformed"
            failures.append(_failure("A", trajectories[members[0]].prompt.uid, outcome))
    for i in np.flatnonzero(all_zero):
        if verdicts[i] is not None:
            counts[f"verdict/{verdicts[i]}"] += 1

    # Stage B (gold-aware): only where the gate opens it, in a group still alive; grade mode needs an answer.
    b_index = []
    for i in np.flatnonzero(all_zero):
        t = trajectories[i]
        if t.prompt.uid in failed or verdicts[i] not in gate.open_stage_b:
            continue
        if not refine and not (t.answer or "").strip():
            counts["stage_b_skipped_no_answer"] += 1
            continue
        b_index.append(int(i))
    requests_b = [stage_b_request(trajectories[i].prompt.question, trajectories[i].answer,
                                  trajectories[i].prompt.golden_answers, policy.stage_b, cfg,
                                  hits=evidence_hits(trajectories[i].retrieved, cfg.max_evidence_passages),
                                  choices=choices_b) for i in b_index]
    outcomes_b = ask_parsed_many(judge, requests_b, policy.parser_b, correction_rounds=cfg.correction_rounds)
    counts["stage_b_requests"] = len(requests_b)
    for i, outcome in zip(b_index, outcomes_b):
        t = trajectories[i]
        counts["stage_b_calls"] += _calls(outcome)
        records.append(_audit_record(outcome, "B", policy.stage_b, policy, judge, step, [(t.prompt.uid, t.sample_index)],
                                     {"verdict": verdicts[i], "answer": t.answer, "mode": policy.mode,
                                      "golden_answers": list(t.prompt.golden_answers)}))
        if outcome.ok and refine:
            refined[i] = outcome.parsed["answer"]
            counts["refined_answers" if refined[i] else "refined_empty"] += 1
        elif outcome.ok:
            judgements[i] = outcome.parsed["judgement"]
            counts[f"judgement/{judgements[i]}"] += 1
        else:
            failed.add(t.prompt.uid)
            counts["teacher_failures"] += 1
            counts["teacher_malformed"] += outcome.error.kind == "malformed"
            failures.append(_failure("B", t.prompt.uid, outcome))
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
            fallback[i] = (refine_reward(verdicts[i], refined[i], bool((t.answer or "").strip()),
                                         t.prompt.golden_answers, gate) if refine else
                           grade_reward(verdicts[i], judgements[i], t.answer, t.prompt.golden_answers, gate))
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
                         overrides=overrides, failed_groups=failed, metrics=metrics, refined=refined, failures=failures)


def eviback_reward(trajectories: Sequence["Trajectory"], judge: Judge, cfg: EvibackConfig, *,
                   templates: tuple[PromptTemplate, PromptTemplate] | None = None,
                   policy: TeacherPolicy | None = None, step: int = 0) -> RewardOutput:
    """RewardOutput: rewards = EM (Actor-first), advantage_overrides for all-zero groups, metrics "eviback/..."."""
    result = eviback_fallback(trajectories, judge, cfg, templates=templates, policy=policy, step=step)
    metrics = {f"eviback/{k}": v for k, v in result.metrics.items()}
    metrics["mean"] = float(result.em.mean())
    return RewardOutput(rewards=result.em, advantage_overrides=result.overrides, metrics=metrics)


def make_eviback_reward(judge: Judge, cfg: EvibackConfig):
    """A RewardFn (trajectories -> RewardOutput) that loads the Teacher policy once (a bundle is verified here,
    before the first step) and counts steps for the audit."""
    policy = policy_from_config(cfg)
    step = [0]

    def reward_fn(trajectories):
        out = eviback_reward(trajectories, judge, cfg, policy=policy, step=step[0])
        step[0] += 1
        return out
    reward_fn.judge = judge
    reward_fn.policy = policy
    reward_fn.templates = (policy.stage_a, policy.stage_b)
    return reward_fn


def reward_from_config(config, *, workdir: str | os.PathLike | None = None, local_model=None):
    """The EviBack RewardFn of an experiment config (configs/eviback.py): `config.eviback` field for field
    (a relative audit_path is taken relative to `workdir`) and the Teacher built from `config.teacher`."""
    from searchjax.judges import build_judge
    fields = config.eviback.to_dict()
    fields["audit_path"] = audit_path_in(workdir, fields["audit_path"], "config.eviback.audit_path")
    cfg = EvibackConfig(**fields)
    policy_from_config(cfg)  # a bad bundle fails here, before the Teacher (maybe a model) is loaded
    return make_eviback_reward(build_judge(config.teacher, local_model=local_model), cfg)


def build_eviback_reward(config, components, workdir):
    """The trainer's reward builder (searchjax.experiment.loop.REWARD_FNS signature: config, components, workdir).

    With a local Teacher whose `local_checkpoint` is "policy", the judge gets a frozen copy of the initial
    policy parameters, taken now, before any update can donate the buffers the policy starts from.
    """
    local_model = None
    if config.teacher.backend == "local" and config.teacher.local_checkpoint == "policy":
        import jax
        import jax.numpy as jnp
        local_model = (components.model, jax.tree.map(jnp.copy, components.params), components.tokenizer)
    return reward_from_config(config, workdir=workdir, local_model=local_model)

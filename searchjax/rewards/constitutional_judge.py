"""Constitutional Judge (CJ): a rubric LLM judge's score as the reward, the gold-free LLM-judge baseline of
Cycle-Consistent Search (CCS, An et al. 2026, arXiv:2604.12967).

A judge (any `searchjax.judges` backend) reads the question and the trajectory and scores it against three
principles, each on an integer scale [lo, hi] (the prompt file `constitutional_judge.v1` states the scale
and the rubric; `CjConfig.score_min` / `score_max` fill it, 1..5 by default):

    s_RQ  Response Quality       the final response answers the question asked, clearly and specifically
    s_SP  Search Progression     the queries move toward the needed information and build on the results
    s_ES  Evidence Synthesis     the final response is supported by, and combines, the retrieved results

The reward is the weighted mean of the three scores mapped to [0, 1]:

    r(tau) = ( (w_RQ s_RQ + w_SP s_SP + w_ES s_ES) / (w_RQ + w_SP + w_ES) - lo ) / (hi - lo)

with equal weights by default. What the judge sees (`render_trajectory`): the question, then per executed
search its query and the passages it retrieved (Search-R1 `Doc k(Title: ...)` lines, at most
`max_passages_per_step`, each cut to `max_passage_chars`), then the final response (the generated text after
the last observation, <think> blocks removed, cut to `max_response_chars`). Never a golden answer: the
reward is gold-free by construction (the request is built from those fields only).

Parsing. The reply must hold a JSON object with the three fields (`searchjax.judges.base.parse_json_reply`
repairs fences, prose, quotes); each value must be a number inside [lo, hi], else the reply is malformed
and is re-asked once with a correction message (`correction_rounds`); a reply still unusable after that is
a failure. Fractional scores inside the range are accepted as they are.

Failures (a transport error after the backend's retries, or a reply still malformed) are handled as in
EviBack and CCS: the trajectory's whole group gets zero advantages (`advantage_overrides[uid]`), its
reward 0, and `cj/failed_groups` counts it; a failure never becomes a score. The RewardFn the loop uses
(`make_cj_reward`) also stops the run when more than `max_failure_rate` of one step's requests fail
(`searchjax.rewards.judge_failures`). Identical requests of a step are asked once. With `audit_path`, one JSON
line per request: step, trajectories, prompt name and sha256, request sha256, judge, replies, parsed
scores or the error.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Sequence

import numpy as np

from searchjax.judges.base import Judge, JudgeRequest, ask_json_many
from searchjax.judges.templates import PromptTemplate, load_prompt, render_prompt
from searchjax.rewards.base import RewardOutput
from searchjax.rewards.cycle import final_response_text
from searchjax.rewards.eviback import append_audit, audit_path_in, format_evidence
from searchjax.rewards.judge_failures import check_failure_rate

if TYPE_CHECKING:
    from searchjax.agent.rollout import Trajectory

DIMENSIONS = ("response_quality", "search_progression", "evidence_synthesis")
NO_SEARCHES = "(the agent made no searches)"
NO_RESPONSE = "(no final response)"


@dataclasses.dataclass(frozen=True)
class CjConfig:
    """The Constitutional Judge's knobs (configs/ccs.py sets and comments each one)."""

    prompt: str = "constitutional_judge.v1"  # versioned rubric prompt (name in judges/prompts/ or a path)
    score_min: int = 1                       # lo of the scale the prompt asks for
    score_max: int = 5                       # hi
    weights: tuple = (1.0, 1.0, 1.0)         # w_RQ, w_SP, w_ES
    max_passages_per_step: int = 3           # retrieved passages shown per search
    max_passage_chars: int = 600             # each cut to this many characters
    max_response_chars: int = 2000           # the final response cut to this many characters
    max_reply_tokens: int = 64               # judge completion limit (one JSON object)
    correction_rounds: int = 1               # re-asks of a reply that cannot be parsed or is out of range
    max_failure_rate: float = 0.5            # stop the run when more of a step's requests fail
    audit_path: str = ""                     # jsonl, one record per request; "" = none

    def __post_init__(self):
        if not self.score_min < self.score_max:
            raise ValueError(f"CjConfig: score_min={self.score_min} must be < score_max={self.score_max}")
        weights = tuple(float(w) for w in self.weights)
        if len(weights) != len(DIMENSIONS) or min(weights) < 0 or sum(weights) <= 0:
            raise ValueError(f"CjConfig.weights={self.weights!r} must be {len(DIMENSIONS)} non-negative numbers "
                             f"(for {DIMENSIONS}) with a positive sum")
        object.__setattr__(self, "weights", weights)
        if min(self.max_passages_per_step, self.max_passage_chars, self.max_response_chars, self.max_reply_tokens) < 1:
            raise ValueError(f"CjConfig: passage, response and reply limits must be >= 1, got {self}")
        if not 0.0 <= self.max_failure_rate <= 1.0:
            raise ValueError(f"CjConfig.max_failure_rate={self.max_failure_rate} must be in [0, 1]")

    def spec(self) -> dict:
        """parse_json_reply's spec: each dimension a number in [score_min, score_max]."""
        return {d: (float, float(self.score_min), float(self.score_max)) for d in DIMENSIONS}


# --- the request -----------------------------------------------------------------------------------------------

def render_trajectory(t: "Trajectory", final_response: str, cfg: CjConfig) -> str:
    """Per search "Step k / Search query / Results", then "Final response:" (module docstring)."""
    parts = []
    for k, (query, hits) in enumerate(zip(t.queries, t.retrieved), start=1):
        evidence = format_evidence(list(hits)[:cfg.max_passages_per_step], cfg.max_passage_chars)
        parts.append(f"Step {k}\nSearch query: {query}\nResults:\n{evidence}\n")
    if not parts:
        parts.append(NO_SEARCHES + "\n")
    response = final_response.strip()
    if len(response) > cfg.max_response_chars:
        response = response[:cfg.max_response_chars].rstrip() + "..."
    parts.append(f"Final response:\n{response or NO_RESPONSE}")
    return "\n".join(parts)


def judge_request(question: str, trajectory_text: str, template: PromptTemplate, cfg: CjConfig) -> JudgeRequest:
    """The judge's request: the prompt file with the question, the rendered trajectory and the scale."""
    messages = render_prompt(template, question=question, trajectory=trajectory_text,
                             score_min=str(cfg.score_min), score_max=str(cfg.score_max))
    return JudgeRequest(messages=messages, max_tokens=cfg.max_reply_tokens)


def rubric_reward(scores: dict, cfg: CjConfig) -> float:
    """r = (weighted mean of the scores - lo) / (hi - lo), in [0, 1]."""
    mean = sum(w * float(scores[d]) for w, d in zip(cfg.weights, DIMENSIONS)) / sum(cfg.weights)
    return (mean - cfg.score_min) / (cfg.score_max - cfg.score_min)


# --- the reward ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class CjResult:
    """Per-trajectory details of one step ([N] in trajectory order)."""

    rewards: np.ndarray                    # float32
    scores: list[dict | None]              # parsed scores (None on failure)
    requests: list[JudgeRequest]
    overrides: dict[str, np.ndarray]       # uid -> zeros for groups with a failure
    failed_groups: set[str]
    failed_requests: int
    unique_requests: int
    metrics: dict[str, float]


def cj_rewards(trajectories: Sequence["Trajectory"], judge: Judge, tokenizer, cfg: CjConfig, *,
               template: PromptTemplate | None = None, step: int = 0) -> CjResult:
    """Score a batch with the judge (module docstring); never raises on judge failures."""
    if not trajectories:
        raise ValueError("constitutional_judge: no trajectories")
    template = template or load_prompt(cfg.prompt)
    n = len(trajectories)
    usage_before = judge.usage.snapshot()
    requests = [judge_request(t.prompt.question, render_trajectory(t, final_response_text(t, tokenizer), cfg),
                              template, cfg) for t in trajectories]
    unique: dict[str, tuple[JudgeRequest, list[int]]] = {}
    for i, request in enumerate(requests):
        unique.setdefault(request.sha256(), (request, []))[1].append(i)
    asked = list(unique.values())
    outcomes = ask_json_many(judge, [r for r, _ in asked], cfg.spec(), correction_rounds=cfg.correction_rounds)
    scores: list[dict | None] = [None] * n
    failed: set[str] = set()
    errors: dict[str, int] = {}
    records = []
    for (request, members), outcome in zip(asked, outcomes):
        if outcome.ok:
            for i in members:
                scores[i] = outcome.parsed
        else:
            errors[outcome.error.kind] = errors.get(outcome.error.kind, 0) + 1
            failed.update(trajectories[i].prompt.uid for i in members)
        records.append({"time": time.time(), "step": step,
                        "trajectories": [[trajectories[i].prompt.uid, trajectories[i].sample_index] for i in members],
                        "prompt_name": template.name, "prompt_sha256": template.sha256,
                        "request_sha256": request.sha256(), "judge": judge.describe(), "ok": outcome.ok,
                        "scores": outcome.parsed, "replies": [r.text for r in outcome.replies],
                        "error_kind": outcome.error.kind if outcome.error is not None else None,
                        "error": str(outcome.error) if outcome.error is not None else None})
    append_audit(cfg.audit_path, records)

    rewards = np.zeros(n, np.float64)
    for i, t in enumerate(trajectories):
        if scores[i] is not None and t.prompt.uid not in failed:
            rewards[i] = rubric_reward(scores[i], cfg)
    groups: dict[str, int] = {}
    for t in trajectories:
        groups[t.prompt.uid] = groups.get(t.prompt.uid, 0) + 1
    overrides = {uid: np.zeros(groups[uid], np.float32) for uid in failed}
    usage_after = judge.usage.snapshot()
    scored = [s for s in scores if s is not None]
    failed_requests = sum(not o.ok for o in outcomes)
    metrics = {f"score/{d}": float(np.mean([s[d] for s in scored])) if scored else 0.0 for d in DIMENSIONS}
    metrics.update({f"failures/{k}": float(v) for k, v in sorted(errors.items())})
    metrics.update({"groups": float(len(groups)), "failed_groups": float(len(failed)),
                    "requests": float(len(asked)), "failed_requests": float(failed_requests),
                    "deduplicated": float(n - len(asked)),
                    "judge_calls": float(usage_after["calls"] - usage_before["calls"]),
                    "judge_retries": float(usage_after["retries"] - usage_before["retries"]),
                    "judge_prompt_tokens": float(usage_after["prompt_tokens"] - usage_before["prompt_tokens"]),
                    "judge_completion_tokens": float(usage_after["completion_tokens"]
                                                     - usage_before["completion_tokens"]),
                    "judge_cost_usd": float(usage_after["cost_usd"] - usage_before["cost_usd"])})
    return CjResult(rewards=rewards.astype(np.float32), scores=scores, requests=requests, overrides=overrides,
                    failed_groups=failed, failed_requests=failed_requests, unique_requests=len(asked),
                    metrics=metrics)


def _output(result: CjResult) -> RewardOutput:
    metrics = {f"cj/{k}": v for k, v in result.metrics.items()}
    metrics["mean"] = float(result.rewards.mean())
    return RewardOutput(rewards=result.rewards, advantage_overrides=result.overrides, metrics=metrics)


def cj_reward(trajectories: Sequence["Trajectory"], judge: Judge, tokenizer, cfg: CjConfig, *,
              template: PromptTemplate | None = None, step: int = 0) -> RewardOutput:
    """RewardOutput: rewards r(tau), zero-advantage overrides for failed groups, metrics "cj/..."."""
    return _output(cj_rewards(trajectories, judge, tokenizer, cfg, template=template, step=step))


def make_cj_reward(judge: Judge, tokenizer, cfg: CjConfig):
    """The loop's RewardFn: loads the prompt once, counts steps for the audit, and stops the run when a step's
    failure rate exceeds cfg.max_failure_rate (after its audit records are written)."""
    template = load_prompt(cfg.prompt)
    step = [0]

    def reward_fn(trajectories):
        result = cj_rewards(trajectories, judge, tokenizer, cfg, template=template, step=step[0])
        step[0] += 1
        check_failure_rate(result.failed_requests, result.unique_requests, cfg.max_failure_rate,
                           "config.cj.max_failure_rate")
        return _output(result)
    reward_fn.judge, reward_fn.template = judge, template
    return reward_fn


def build_cj_reward(config, components, workdir):
    """The trainer's reward builder (searchjax.experiment.loop.REWARD_FNS signature): config.cj -> CjConfig (a
    relative audit_path is taken relative to workdir), the judge from config.cj_judge (build_judge). A local
    judge with local_checkpoint "policy" gets a frozen copy of the initial policy parameters, taken now."""
    from searchjax.judges import build_judge
    fields = config.cj.to_dict()
    fields["weights"] = tuple(fields["weights"])
    fields["audit_path"] = audit_path_in(workdir, fields["audit_path"], "config.cj.audit_path")
    local_model = None
    if config.cj_judge.backend == "local" and config.cj_judge.local_checkpoint == "policy":
        import jax
        import jax.numpy as jnp
        local_model = (components.model, jax.tree.map(jnp.copy, components.params), components.tokenizer)
    return make_cj_reward(build_judge(config.cj_judge, local_model=local_model), components.tokenizer,
                          CjConfig(**fields))

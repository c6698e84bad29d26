"""E2E-APE: a controller LLM searches the whole EviBack Teacher policy and freezes the winner as a bundle.

The EviBack paper (Ma et al. 2026, arXiv:2607.23955) builds its Teacher with E2E-APE: a controller LLM (GPT-5.5
there) partitions the rollout data, generates candidate prompts and workflows, evaluates them against explicit
constraints (evidence-boundary compliance, stability, cost), selects a gated two-stage policy and freezes
versioned prompts, gating logic, parsers, hashes and logs, with no manual step after launch. The public release
(github.com/chery-nextai/eviback, ape/) publishes only the controller's instructions; the loop below is ours.

    result = run_ape(traces, teacher, controller, eviback_cfg, ApeConfig(), seeds=[v1_policy], output_dir=d)

1. Partition (`partition`): labelled traces (searchjax.eval.stage_a_harness) are grouped by normalised question
   (all rollouts of a question stay on one side, as the release requires), the groups shuffled with
   `seed`, and cut into search / validation / held-out by `fractions`.
2. Seeds: the given policies (e.g. the v1 bundle) are executed on the search split.
3. Rounds: per round, `candidates_per_round` requests go to the controller (any `Judge`: an OpenAI-compatible
   endpoint, or the rule-based stand-in of `searchjax.judges.ape_rules` served over HTTP). Each request
   (`controller_request`, prompt file ape_controller.v1) carries the bundle contract and the state: budget
   left, the current best candidate in reply form, the scoreboard, the current best's diagnostics (traces
   it misjudged, gold it failed to cover, parse failures with the raw reply) and the errors of rejected
   replies. The reply must be one complete candidate (`parse_candidate`: Stage A and Stage B prompt files,
   the Stage B mode, the gate table, both parser specs); a reply that is not one, or whose Stage A prompt
   spells out a gold answer of the search split, is rejected with its reason logged and shown to the
   controller, and the loop goes on.
4. Execution: each candidate runs end to end on the search split through training's own code
   (`evaluate_policy`: request builders, judge backend, parsers, gate), `repeats` times. Scores:
   insufficient-evidence F1 (the evidence-boundary metric), our gold coverage, parse-failure rate,
   verdict stability across the repeats, tokens and dollars per trace. Objective (the release's default):
   0.5 x insufficient F1 + 0.5 x gold coverage (coverage 0 for a grade-mode policy, which writes no
   answer). Feasible: parse-failure rate <= max_parse_failure_rate and stability >= min_stability. The
   best feasible candidate on search is the next round's "current best".
5. Selection on validation: the `finalists` best feasible candidates on search (seeds included) run on the
   validation split; the winner has the best validation objective (ties: search objective, then fewer
   tokens). The held-out split is run for the winner and the first seed and reported, never used to choose.
6. Budget: the loop stops at `rounds`, `max_candidates` proposals, `max_tokens` tokens or `max_usd`
   dollars (controller and Teacher together), whichever comes first; the reason is logged.
7. Freeze: the winner is written with `searchjax.judges.teacher_bundle.freeze_bundle` into `output_dir`,
   with controller_log.jsonl (every request, reply, verdict and score) and scores.json, all in the
   sha256 manifest. Training loads it with config.eviback.bundle and refuses it if a hash differs.

launch/ape.py runs it from a config (configs/ape.py).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from typing import Sequence

import numpy as np

from searchjax.judges.ape_edits import EDITS, ape_search, insert_instruction  # noqa: F401  (Stage-A-only search)
from searchjax.judges.base import Judge, JudgeError, JudgeRequest, strip_reasoning
from searchjax.judges.teacher_bundle import (BUNDLE_FORMAT, STAGE_A_FILE, STAGE_B_FILE, TeacherPolicy, freeze_bundle,
                                             policy_from_dict, policy_to_dict, template_text)
from searchjax.judges.templates import load_prompt, render_prompt

CONTRACT = """A candidate is one JSON object with these keys:
- "name": a short name; "hypothesis": what this candidate changes and why.
- "stage_a_prompt": the complete Stage A prompt file. Lines "[system]", "[user]", "[assistant]" start chat
  messages. Stage A is gold-blind: its only placeholders are {question} and {evidence} (the passages the
  agent retrieved), each used at least once.
- "stage_b_mode": "refine" (Stage B writes the answer the evidence supports, in the reference's form) or
  "grade" (Stage B judges the agent's answer against the reference).
- "stage_b_prompt": the complete Stage B prompt file. Placeholders among {question}, {evidence}, {answer}
  (the agent's answer), {references} (gold answers joined by " | "); refine needs {evidence} and
  {references}, grade needs {answer} and {references}. The reference is a candidate to check, never evidence.
- "gate": {"open_stage_b": verdicts that open Stage B (a subset of Supported, Ambiguous; never
  Insufficient), "weight_supported", "weight_ambiguous", "credit_correct", "credit_partial",
  "status_credit", "answer_credit", "no_answer_factor": numbers in [0, 1]}.
- "stage_a_parser", "stage_b_parser": declarative reply parsers, {"kind": "json", "fields": {...}} or
  {"kind": "regex", "pattern": "...(?P<field>...)...", "fields": {...}}, a field being {"enum": [...],
  "aliases": {...}} or {"type": "string", "max_chars": N, "none_values": [...]}; optional "choices"
  {value: exact reply text} for closed-choice Teachers. Stage A needs the enum field "verdict" (values among
  Supported, Ambiguous, Insufficient, with Supported and Insufficient); refine needs the string field
  "answer"; grade needs the enum field "judgement" (among Correct, Partial, Incorrect).
Scores on the search split: insufficient-evidence F1 (Insufficient positive), gold coverage (share of traces
with the gold in their evidence whose final answer matches it), parse-failure rate, stability across repeated
runs, tokens per trace. Objective 0.5 x F1 + 0.5 x coverage; a candidate with a parse-failure rate above the
limit or stability below the limit cannot be selected. Never copy answers of the traces into a prompt."""
CANDIDATE_KEYS = ("stage_a_prompt", "stage_b_prompt", "stage_b_mode", "gate", "stage_a_parser", "stage_b_parser")


@dataclasses.dataclass(frozen=True)
class ApeConfig:
    """E2E-APE's knobs (configs/ape.py sets and comments each one)."""

    seed: int = 0
    fractions: tuple[float, float, float] = (0.5, 0.25, 0.25)  # search / validation / held-out
    rounds: int = 3
    candidates_per_round: int = 2
    max_candidates: int = 12          # controller proposals in all
    max_tokens: int = 2_000_000       # controller + Teacher tokens
    max_usd: float = 20.0             # controller + Teacher dollars
    repeats: int = 2                  # Teacher runs per candidate on the search split (stability)
    finalists: int = 3                # best feasible candidates on search that run on validation
    max_parse_failure_rate: float = 0.1
    min_stability: float = 0.9
    max_diagnostics: int = 8          # examples of each mistake kind shown to the controller
    controller_max_tokens: int = 8192

    def __post_init__(self):
        object.__setattr__(self, "fractions", tuple(self.fractions))
        if len(self.fractions) != 3 or min(self.fractions) <= 0 or abs(sum(self.fractions) - 1) > 1e-6:
            raise ValueError(f"ApeConfig.fractions={self.fractions}: three positive shares summing to 1")
        if min(self.rounds, self.candidates_per_round, self.max_candidates, self.repeats, self.finalists) < 1:
            raise ValueError(f"ApeConfig: rounds, candidates and repeats must be >= 1, got {self}")


@dataclasses.dataclass
class Entry:
    """One scored candidate."""

    name: str
    policy: TeacherPolicy
    hypothesis: str
    round: int                         # -1 for seeds
    search: dict
    diagnostics: dict
    validation: dict | None = None


@dataclasses.dataclass
class ApeResult:
    winner: Entry
    entries: list[Entry]
    heldout: dict                      # name -> held-out metrics (winner and first seed)
    stop_reason: str
    log: list[dict]
    bundle: pathlib.Path | None = None


# --- data, scores, diagnostics -------------------------------------------------------------------------------

def partition(traces: Sequence, seed: int, fractions=(0.5, 0.25, 0.25)) -> tuple[list, list, list]:
    """(search, validation, held-out): traces grouped by normalised question, groups shuffled with `seed`."""
    from searchjax.rewards.qa import normalize_answer
    groups: dict[str, list] = {}
    for t in traces:
        groups.setdefault(normalize_answer(t.question), []).append(t)
    keys = sorted(groups)
    order = np.random.default_rng(seed).permutation(len(keys))
    cuts = np.rint(np.cumsum(fractions)[:2] * len(keys)).astype(int)
    splits = [[t for k in order[a:b] for t in groups[keys[k]]] for a, b in
              zip((0, cuts[0], cuts[1]), (cuts[0], cuts[1], len(keys)))]
    if not all(splits):
        raise ValueError(f"partition: {len(keys)} questions cannot fill search / validation / held-out "
                         f"with fractions {tuple(fractions)}; label more traces")
    return splits[0], splits[1], splits[2]


def objective(metrics: dict) -> float:
    return 0.5 * metrics["insufficient_f1"] + 0.5 * (metrics["gold_coverage"] or 0.0)


def feasible(metrics: dict, cfg: ApeConfig) -> bool:
    return metrics["parse_failure_rate"] <= cfg.max_parse_failure_rate and metrics["stability"] >= cfg.min_stability


def diagnostics(result: dict, traces: Sequence, limit: int) -> dict:
    """What the controller sees of a candidate's mistakes: missed / false Insufficient, uncovered gold, parse
    failures (each at most `limit` examples, with counts)."""
    from searchjax.rewards.qa import exact_match
    by_uid = {t.uid: t for t in traces}
    evidence = lambda t: " | ".join(f"{h.title}: {h.text[:200]}" for h in t.hits[:3])  # noqa: E731
    kinds = {"missed_insufficient": [], "false_insufficient": [], "uncovered_gold": []}
    for row in result["rows"]:
        t = by_uid[row["uid"]]
        item = {"question": t.question, "evidence": evidence(t), "label": row["label"], "verdict": row["verdict"],
                "output": row["output"], "golds": list(t.golden_answers)}
        if row["label"] == "Insufficient" and row["verdict"] != "Insufficient":
            kinds["missed_insufficient"].append(item)
        elif row["label"] != "Insufficient" and row["verdict"] == "Insufficient":
            kinds["false_insufficient"].append(item)
        elif row["label"] != "Insufficient" and not exact_match(row["output"], t.golden_answers):
            kinds["uncovered_gold"].append(item)  # a grading policy writes no answer: all of its gold is uncovered
    out = {f"{k}_count": len(v) for k, v in kinds.items()}
    out.update({k: v[:limit] for k, v in kinds.items()})
    parse = [f for f in result["failures"] if f["kind"] == "malformed"]
    out["parse_failures_count"] = len(parse)
    out["parse_failures"] = [{"stage": f["stage"], "error": f["error"], "reply": f["reply"]} for f in parse[:limit]]
    return out


# --- the controller's side -----------------------------------------------------------------------------------

def candidate_dict(policy: TeacherPolicy, hypothesis: str = "") -> dict:
    """A policy in the controller's reply form."""
    bundle = policy_to_dict(policy)
    return {"name": policy.name, "hypothesis": hypothesis, "stage_a_prompt": template_text(policy.stage_a),
            "stage_b_mode": policy.mode, "stage_b_prompt": template_text(policy.stage_b), "gate": bundle["gate"],
            "stage_a_parser": bundle["stage_a"]["parser"], "stage_b_parser": bundle["stage_b"]["parser"]}


def _summary(entry: Entry) -> dict:
    keep = ("insufficient_f1", "insufficient_precision", "insufficient_recall", "gold_coverage",
            "parse_failure_rate", "stability", "tokens_per_trace", "cost_usd")
    return {"name": entry.name, "round": entry.round, "hypothesis": entry.hypothesis,
            "objective": objective(entry.search), **{k: entry.search[k] for k in keep}}


def controller_request(best: Entry, entries: Sequence[Entry], rejections: Sequence[str], budget_left: dict,
                       index: int, cfg: ApeConfig) -> JudgeRequest:
    """The controller's chat for one candidate (prompt file ape_controller.v1)."""
    state = {"budget_left": budget_left, "candidate_index_in_round": index,
             "limits": {"max_parse_failure_rate": cfg.max_parse_failure_rate, "min_stability": cfg.min_stability},
             "current_best": candidate_dict(best.policy, best.hypothesis), "current_best_scores": _summary(best),
             "current_best_diagnostics": best.diagnostics, "scoreboard": [_summary(e) for e in entries],
             "rejected_replies": list(rejections[-cfg.max_diagnostics:])}
    messages = render_prompt(load_prompt("ape_controller.v1"), contract=CONTRACT,
                             state=json.dumps(state, indent=1, ensure_ascii=False))
    return JudgeRequest(messages=messages, max_tokens=cfg.controller_max_tokens)


def parse_candidate(text: str, *, where: str = "controller reply") -> tuple[TeacherPolicy, str]:
    """(policy, hypothesis) from a controller reply; ValueError saying why the reply is not a bundle."""
    try:
        text = strip_reasoning(text)
    except JudgeError as e:
        raise ValueError(f"{where}: {e}") from None
    fenced = re.search(r"```(?:json)?\s*(\{.*\})\s*```", text, re.DOTALL)
    body = fenced.group(1) if fenced else text[text.find("{"):text.rfind("}") + 1]
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not a bundle: no JSON object ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is not a bundle: the JSON is a {type(obj).__name__}, not an object")
    missing = [k for k in CANDIDATE_KEYS if k not in obj]
    if missing:
        raise ValueError(f"{where} is not a bundle: missing {missing}")
    if not isinstance(obj["stage_a_prompt"], str) or not isinstance(obj["stage_b_prompt"], str):
        raise ValueError(f"{where} is not a bundle: stage_a_prompt and stage_b_prompt must be prompt file texts")
    policy = {"format": BUNDLE_FORMAT, "name": str(obj.get("name") or "candidate"),
              "stage_a": {"prompt": STAGE_A_FILE, "parser": obj["stage_a_parser"]},
              "stage_b": {"prompt": STAGE_B_FILE, "parser": obj["stage_b_parser"], "mode": obj["stage_b_mode"]},
              "gate": obj["gate"], "provenance": {"hypothesis": str(obj.get("hypothesis", ""))}}
    texts = {STAGE_A_FILE: obj["stage_a_prompt"], STAGE_B_FILE: obj["stage_b_prompt"]}
    try:
        return policy_from_dict(policy, texts, where=where), str(obj.get("hypothesis", ""))
    except ValueError as e:
        raise ValueError(f"{where} is not a valid bundle: {e}") from None


def gold_leak(policy: TeacherPolicy, traces: Sequence) -> str | None:
    """A gold answer of `traces` (3+ characters normalised) that the Stage A prompt spells out, if any."""
    from searchjax.rewards.qa import normalize_answer
    text = f" {normalize_answer(' '.join(c for _, c in policy.stage_a.messages))} "
    for t in traces:
        for g in t.golden_answers:
            norm = normalize_answer(g)
            if len(norm) >= 3 and f" {norm} " in text:
                return g
    return None


# --- the loop ------------------------------------------------------------------------------------------------

def run_ape(traces: Sequence, teacher: Judge, controller: Judge, eviback_cfg, cfg: ApeConfig, *,
            seeds: Sequence[TeacherPolicy], output_dir: str | pathlib.Path | None = None) -> ApeResult:
    """E2E-APE (module docstring). `eviback_cfg`: the EvibackConfig whose evidence and reply limits every
    candidate runs with; `seeds`: the starting policies. Returns the scored candidates, the winner and, with
    `output_dir`, the path of the frozen bundle."""
    from searchjax.eval.stage_a_harness import evaluate_policy  # the harness imports rewards, not judges
    if not seeds:
        raise ValueError("run_ape: give at least one seed policy")
    search, validation, heldout = partition(traces, cfg.seed, cfg.fractions)
    log: list[dict] = [{"event": "partition", "seed": cfg.seed, "search": [t.uid for t in search],
                        "validation": [t.uid for t in validation], "heldout": [t.uid for t in heldout]}]
    spent = lambda: {k: sum(j.usage.snapshot()[k] for j in {id(teacher): teacher, id(controller): controller}.values())  # noqa: E731
                     for k in ("prompt_tokens", "completion_tokens", "cost_usd")}

    def run(policy: TeacherPolicy, split: Sequence, repeats: int) -> dict:
        return evaluate_policy(split, teacher, policy, eviback_cfg, repeats=repeats)

    entries: list[Entry] = []
    for policy in seeds:
        result = run(policy, search, cfg.repeats)
        entries.append(Entry(policy.name, policy, "seed", -1, result["metrics"],
                             diagnostics(result, search, cfg.max_diagnostics)))
        log.append({"event": "seed", "name": policy.name, "search": result["metrics"]})

    def best_entry() -> Entry:
        pool = [e for e in entries if feasible(e.search, cfg)] or entries
        return max(pool, key=lambda e: (objective(e.search), -e.search["tokens_per_trace"]))

    rejections: list[str] = []
    proposed, stop_reason = 0, "rounds"
    for round_index in range(cfg.rounds):
        for k in range(cfg.candidates_per_round):
            used = spent()
            tokens = used["prompt_tokens"] + used["completion_tokens"]
            stop_reason = ("max_candidates" if proposed >= cfg.max_candidates else "max_tokens"
                           if tokens >= cfg.max_tokens else "max_usd" if used["cost_usd"] >= cfg.max_usd else "")
            if stop_reason:
                break
            best = best_entry()
            request = controller_request(best, entries, rejections, {
                "rounds": cfg.rounds - round_index, "candidates": cfg.max_candidates - proposed,
                "tokens": cfg.max_tokens - tokens, "usd": round(cfg.max_usd - used["cost_usd"], 4)}, k, cfg)
            reply = controller.complete_many([request])[0]
            proposed += 1
            record = {"event": "candidate", "round": round_index, "index": k, "based_on": best.name,
                      "request": [dict(m) for m in request.messages],
                      "reply": None if isinstance(reply, JudgeError) else reply.text}
            where = f"controller reply {round_index}.{k}"
            try:
                if isinstance(reply, JudgeError):
                    raise ValueError(f"{where}: the controller call failed: {reply}")
                policy, hypothesis = parse_candidate(reply.text, where=where)
                leaked = gold_leak(policy, search)
                if leaked is not None:
                    raise ValueError(f"{where}: the Stage A prompt spells out the gold answer {leaked!r} of a "
                                     f"search trace (a gold-blind gate must not contain answers)")
            except ValueError as e:
                rejections.append(str(e))
                log.append({**record, "accepted": False, "error": str(e)})
                continue
            policy = dataclasses.replace(policy, name=f"r{round_index}.{k}:{policy.name}")
            result = run(policy, search, cfg.repeats)
            entries.append(Entry(policy.name, policy, hypothesis, round_index, result["metrics"],
                                 diagnostics(result, search, cfg.max_diagnostics)))
            log.append({**record, "accepted": True, "name": policy.name, "hypothesis": hypothesis,
                        "search": result["metrics"], "feasible": feasible(result["metrics"], cfg)})
        if stop_reason:
            break
    else:
        stop_reason = "rounds"

    pool = sorted([e for e in entries if feasible(e.search, cfg)] or entries,
                  key=lambda e: (objective(e.search), -e.search["tokens_per_trace"]), reverse=True)
    for entry in pool[:cfg.finalists]:
        entry.validation = run(entry.policy, validation, 1)["metrics"]
        log.append({"event": "validation", "name": entry.name, "validation": entry.validation})
    winner = max(pool[:cfg.finalists], key=lambda e: (objective(e.validation), objective(e.search),
                                                      -e.search["tokens_per_trace"]))
    heldout_scores = {winner.name: run(winner.policy, heldout, 1)["metrics"]}
    if entries[0] is not winner:
        heldout_scores[entries[0].name] = run(entries[0].policy, heldout, 1)["metrics"]
    log.append({"event": "selected", "winner": winner.name, "stop_reason": stop_reason, "heldout": heldout_scores,
                "spent": spent()})
    result = ApeResult(winner, entries, heldout_scores, stop_reason, log)
    if output_dir is not None:
        scores = {"objective": "0.5 * insufficient_f1 + 0.5 * gold_coverage", "winner": winner.name,
                  "stop_reason": stop_reason, "split_sizes": [len(search), len(validation), len(heldout)],
                  "candidates": [{**_summary(e), "feasible": feasible(e.search, cfg), "search": e.search,
                                  "validation": e.validation} for e in entries], "heldout": heldout_scores,
                  "config": dataclasses.asdict(cfg)}
        provenance = {"written_by": "searchjax.judges.ape.run_ape", "winner": winner.name,
                      "hypothesis": winner.hypothesis, "controller": controller.describe(),
                      "teacher": teacher.describe(), "search_objective": objective(winner.search),
                      "validation_objective": objective(winner.validation),
                      "heldout": heldout_scores[winner.name]}
        result.bundle = freeze_bundle(winner.policy, output_dir, provenance=provenance, extra_files={
            "controller_log.jsonl": "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in log),
            "scores.json": json.dumps(scores, indent=1, default=str) + "\n"})
    return result

"""Gate quality of an EviBack Teacher on labelled traces: insufficient-evidence F1 and gold coverage.

A labelled trace is (question, evidence passages, gold answers, an Actor answer, label), label in
{"Sufficient", "Insufficient"}. The paper reports two figures for its frozen gate (insufficient-evidence F1
0.8924, gold coverage 0.6825) and a gold coverage of 0.6399 for a gold-aware single prompt. Definitions:

* insufficient-evidence F1: Insufficient is the positive class. With TP = traces labelled and judged
  Insufficient, P = TP / #judged Insufficient, R = TP / #labelled Insufficient, F1 = 2PR / (P + R)
  (0 when TP = 0). Supported and Ambiguous both count as "not Insufficient"; a Teacher failure too.
* gold coverage (ours: the papers do not define it, and this one applies to every Teacher alike): among the
  traces whose evidence, as the Teacher is shown it, contains a gold answer (`evidence_has_gold`: the
  normalised gold as a whole-token run of the normalised titles and texts, `searchjax.rewards.qa.
  normalize_answer`), the share for which the Teacher's final output matches a gold under normalize_answer
  (`exact_match`). The final output is the refined answer of a refine-mode bundle (none when Stage A says
  Insufficient or Stage B finds no supported answer) or the answer of a single-prompt Teacher (none when
  its verdict is Insufficient). A grade-mode Teacher writes no answer: its coverage is reported as None.

Where labelled traces come from:

* real rollouts (`label_trajectories`, run by launch/label_traces.py): a policy rolls out on a QA set; only
  all-zero groups (every rollout EM 0: the groups EviBack backs off on) are kept, and of those the
  trajectories with at least one passage the Actor saw (the others are Insufficient by rule and never
  reach the Teacher). The evidence is what the Actor saw, as truncated in its context: each search's
  observation tokens are decoded from the trajectory (`visible_hits`), a passage is kept when its title
  line was visible and its text is cut where the observation was cut; then, as EviBack's Stage A shows it,
  unique by id and capped to `max_passages` passages of `passage_chars` characters. The label is derived
  from the gold: Sufficient when that evidence contains a gold answer (`evidence_has_gold`), else
  Insufficient. (A paraphrase of the gold, "1,000" for "1000", stays invisible to this test; an answer
  that is present but not connected to the question still counts as present.)
* the embedded default (`build_labelled_set`, synthetic, sufficiency by construction): for each default
  question (FanOutQA sub-questions whose answer string occurs in their evidence article's extract) a
  Sufficient trace (a window of the gold article plus `topk - 1` other BM25 hits, the gold passage at a
  position that rotates with the question) and an Insufficient one (the `topk` best BM25 hits that are
  not the gold article and do not contain the answer string). Its Actor answer is "It is {gold}.", EM 0
  against the gold but naming it. `evaluate_stage_a` is the earlier grade-mode check on it (its
  `gold_coverage` counts Stage B credits, Correct or Partial, among traces with the gold in evidence: an
  older definition, kept for that check only).

Teachers are evaluated end to end through training's own code: `evaluate_policy` runs
`searchjax.rewards.eviback.eviback_fallback` (request builders, the policy's parsers, correction round,
gating) with each trace as its own group; `evaluate_single_prompt` uses the same evidence rendering and
parser machinery for the one-call baselines. Run:

    python -m launch.label_traces --config=configs/eviback.py:quickstart --output=/tmp/traces.jsonl
    python -m searchjax.eval.stage_a_harness --config=configs/eviback.py:quickstart --traces=/tmp/traces.jsonl \
        --baselines --bundles=/tmp/ape_bundle
    python -m searchjax.eval.stage_a_harness --config=configs/eviback.py:quickstart --limit=10   # synthetic set
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

from retrieval.corpus import Hit
from searchjax.data.jsonl import iter_jsonl
from searchjax.judges.base import Judge, JudgeRequest, ask_json_many
from searchjax.judges.teacher_bundle import Parser, TeacherPolicy, ask_parsed_many, parser_from_spec
from searchjax.judges.templates import PromptTemplate, load_prompt, render_prompt
from searchjax.rewards import eviback
from searchjax.rewards.qa import exact_match, normalize_answer

SUFFICIENT, INSUFFICIENT = "Sufficient", eviback.INSUFFICIENT
LABELS = (SUFFICIENT, INSUFFICIENT)
CREDITED = (eviback.CORRECT, eviback.PARTIAL)


@dataclasses.dataclass(frozen=True)
class StageATrace:
    """One labelled trace: the gate sees question + hits; Stage B sees question + answer + golds."""

    uid: str
    question: str
    hits: tuple[Hit, ...]
    golden_answers: tuple[str, ...]
    answer: str
    label: str

    def __post_init__(self):
        if self.label not in LABELS:
            raise ValueError(f"StageATrace {self.uid}: label {self.label!r} is not one of {LABELS}")


def actor_answer(gold: str) -> str:
    """The Actor answer of a labelled trace: names the gold but scores EM 0 against it."""
    return f"It is {gold}."


def _window(text: str, answer: str, chars: int) -> str:
    """At most `chars` characters of `text` containing the first case-insensitive occurrence of `answer`."""
    if len(text) <= chars:
        return text
    k = text.lower().find(answer.lower())
    if k < 0:
        return text[:chars]
    start = max(0, min(k - chars // 3, len(text) - chars))
    return text[start:start + chars]


def build_labelled_set(questions=None, index=None, *, topk: int = 3, passage_chars: int = 600,
                       limit: int | None = None) -> list[StageATrace]:
    """Two traces per default question, Sufficient then Insufficient (module docstring).

    questions: `searchjax.data.default_questions.default_questions()` by default; index: a retriever with
    `.search(queries, topk)` over the default corpus (`retrieval.default_index("bm25")` by default).
    """
    if topk < 1 or passage_chars < 1:
        raise ValueError(f"build_labelled_set: topk and passage_chars must be >= 1, got {topk}, {passage_chars}")
    from retrieval.corpus import default_corpus
    if questions is None:
        from searchjax.data.default_questions import default_questions
        questions = default_questions()
    if index is None:
        from retrieval import default_index
        index = default_index("bm25")
    questions = list(questions)[:limit] if limit is not None else list(questions)
    by_title = {p.title: p for p in default_corpus()}
    depth = topk + 20  # enough candidates to skip the gold article and answer-bearing passages
    results = index.search([q.question for q in questions], depth)
    traces = []
    for k, (q, hits) in enumerate(zip(questions, results)):
        gold = q.golden_answers[0]
        if q.gold_title not in by_title:
            raise ValueError(f"default question {q.id}: gold article {q.gold_title!r} is not in the default corpus")
        article = by_title[q.gold_title]
        window = _window(article.text, gold, passage_chars)
        if gold.lower() not in window.lower():
            raise ValueError(f"default question {q.id}: answer {gold!r} not in its article {q.gold_title!r}")
        gold_hit = Hit(id=article.id, title=article.title, text=window, score=0.0)
        others = [h for h in hits if h.title != q.gold_title]
        support = [dataclasses.replace(h, text=h.text[:passage_chars]) for h in others[:topk - 1]]
        support.insert(k % topk if topk > 1 else 0, gold_hit)
        clean = [dataclasses.replace(h, text=h.text[:passage_chars]) for h in others
                 if gold.lower() not in h.text.lower()][:topk]
        if len(clean) < topk:
            raise ValueError(f"default question {q.id}: fewer than {topk} answer-free passages in the top {depth}")
        answer = actor_answer(gold)
        traces.append(StageATrace(f"{q.id}/sufficient", q.question, tuple(support), q.golden_answers, answer,
                                  SUFFICIENT))
        traces.append(StageATrace(f"{q.id}/insufficient", q.question, tuple(clean), q.golden_answers, answer,
                                  INSUFFICIENT))
    return traces


def evidence_contains_gold(trace: StageATrace) -> bool:
    text = " ".join(h.text for h in trace.hits).lower()
    return any(g.lower() in text for g in trace.golden_answers)


# --- files ---------------------------------------------------------------------------------------------------

def write_traces_jsonl(traces: Sequence[StageATrace], path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for t in traces:
            f.write(json.dumps({"uid": t.uid, "question": t.question, "golden_answers": list(t.golden_answers),
                                "answer": t.answer, "label": t.label,
                                "evidence": [{"id": h.id, "title": h.title, "text": h.text} for h in t.hits]},
                               ensure_ascii=False) + "\n")


def read_traces_jsonl(path: str | os.PathLike) -> list[StageATrace]:
    """Labelled traces: one JSON object per line with uid, question, golden_answers, answer, label, evidence
    (a list of {id, title, text})."""
    traces = []
    for where, row in iter_jsonl(path):
        try:
            hits = tuple(Hit(id=str(e["id"]), title=e["title"], text=e["text"], score=0.0)
                         for e in row["evidence"])
            traces.append(StageATrace(row["uid"], row["question"], hits, tuple(row["golden_answers"]),
                                      row["answer"], row["label"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: bad labelled trace: {e}") from e
    return traces


# --- evaluation ----------------------------------------------------------------------------------------------

def insufficient_f1(labels: Sequence[str], verdicts: Sequence[str | None]) -> dict[str, float]:
    """Precision, recall and F1 with Insufficient as the positive class (None = a failure = not Insufficient)."""
    tp = sum(1 for y, v in zip(labels, verdicts) if y == INSUFFICIENT and v == INSUFFICIENT)
    predicted = sum(1 for v in verdicts if v == INSUFFICIENT)
    actual = sum(1 for y in labels if y == INSUFFICIENT)
    precision = tp / predicted if predicted else 0.0
    recall = tp / actual if actual else 0.0
    f1 = 2 * precision * recall / (precision + recall) if tp else 0.0
    return {"insufficient_precision": precision, "insufficient_recall": recall, "insufficient_f1": f1}


def evaluate_stage_a(traces: Sequence[StageATrace], judge: Judge, cfg: eviback.EvibackConfig, *,
                     templates: tuple[PromptTemplate, PromptTemplate] | None = None,
                     run_stage_b: bool = True) -> dict:
    """Run the gate (and Stage B on the traces it passes) exactly as EviBack does; return metrics and rows."""
    if not traces:
        raise ValueError("evaluate_stage_a: no traces")
    template_a, template_b = templates or (load_prompt(cfg.stage_a_prompt), load_prompt(cfg.stage_b_prompt))
    requests = [eviback.stage_a_request(t.question, list(t.hits), template_a, cfg) for t in traces]
    outcomes = ask_json_many(judge, requests, eviback.STAGE_A_SPEC, correction_rounds=cfg.correction_rounds)
    verdicts = [o.parsed["verdict"] if o.ok else None for o in outcomes]
    judgements: list[str | None] = [None] * len(traces)
    gold_in = [evidence_contains_gold(t) for t in traces]
    if run_stage_b:
        passed = [i for i, v in enumerate(verdicts) if v not in (None, INSUFFICIENT) and gold_in[i]]
        requests_b = [eviback.stage_b_request(traces[i].question, traces[i].answer, traces[i].golden_answers,
                                              template_b, cfg) for i in passed]
        for i, o in zip(passed, ask_json_many(judge, requests_b, eviback.STAGE_B_SPEC,
                                              correction_rounds=cfg.correction_rounds)):
            judgements[i] = o.parsed["judgement"] if o.ok else None
    labels = [t.label for t in traces]
    metrics = insufficient_f1(labels, verdicts)
    with_gold = [i for i in range(len(traces)) if gold_in[i]]
    metrics["accuracy"] = sum((v == INSUFFICIENT) == (y == INSUFFICIENT) for y, v in zip(labels, verdicts)
                              if v is not None) / len(traces)
    if with_gold and run_stage_b:
        metrics["gold_coverage"] = sum(judgements[i] in CREDITED for i in with_gold) / len(with_gold)
        metrics["gold_coverage_strict"] = sum(judgements[i] == eviback.CORRECT for i in with_gold) / len(with_gold)
    metrics["gate_pass_with_gold"] = (sum(verdicts[i] not in (None, INSUFFICIENT) for i in with_gold)
                                      / len(with_gold)) if with_gold else 0.0
    metrics["traces"] = len(traces)
    metrics["failures"] = sum(v is None for v in verdicts)
    for v in eviback.VERDICTS:
        metrics[f"verdict/{v}"] = sum(x == v for x in verdicts)
    rows = [{"uid": t.uid, "label": t.label, "verdict": v, "judgement": j, "gold_in_evidence": g}
            for t, v, j, g in zip(traces, verdicts, judgements, gold_in)]
    return {"metrics": metrics, "rows": rows, "prompt_sha256": {"A": template_a.sha256, "B": template_b.sha256}}


def teacher_from_config(config) -> Judge:
    """The Teacher of an EviBack experiment config; a local "policy" Teacher loads the initial policy weights."""
    from searchjax.judges import build_judge
    local_model = None
    if config.teacher.backend == "local" and config.teacher.local_checkpoint == "policy":
        from searchjax.models import load_pretrained
        from searchjax.data.assets import resolve_model_path
        from searchjax.tokenization import load_tokenizer
        path = resolve_model_path(config.model.path)  # the initial policy, as the training run's Teacher
        model, params = load_pretrained(path, dtype=config.teacher.local_dtype)
        local_model = (model, params, load_tokenizer(path))
    return build_judge(config.teacher, local_model=local_model)


# --- labelled traces from real rollouts ---------------------------------------------------------------------

def evidence_has_gold(hits: Sequence[Hit], golds: Sequence[str]) -> bool:
    """A normalised gold answer occurs as a whole-token run in the normalised titles and texts of the hits."""
    text = f" {normalize_answer(' '.join(f'{h.title} {h.text}' for h in hits))} "
    return any(normalize_answer(g) and f" {normalize_answer(g)} " in text for g in golds)


def _observation_spans(trajectory, tokenizer) -> list[str]:
    """The decoded text of every observation (maximal runs of loss-mask-0 response tokens), in order."""
    spans, start = [], None
    for k, m in enumerate(list(trajectory.loss_mask) + [1]):
        if m == 0 and start is None:
            start = k
        elif m != 0 and start is not None:
            spans.append(tokenizer.decode(trajectory.response_ids[start:k]))
            start = None
    return spans


def visible_hits(trajectory, tokenizer) -> list[list[Hit]]:
    """Per executed search, its hits as the Actor saw them: the observation decoded from the trajectory's
    tokens; a hit kept when its `Doc k(Title: ...) ` line head was visible, its text cut where the observation
    was cut (searchjax.agent.rollout truncates an observation to max_obs_tokens, marker before the tail)."""
    from retrieval.corpus import format_passages
    from searchjax.agent import protocol
    from searchjax.agent.rollout import TRUNCATION_MARKER
    head, tail = protocol.information_block("\0").split("\0")
    observations = [o for o in _observation_spans(trajectory, tokenizer) if o.startswith(head)]
    if len(observations) != len(trajectory.retrieved):
        raise ValueError(f"trajectory {trajectory.prompt.uid}#{trajectory.sample_index}: {len(observations)} "
                         f"information blocks for {len(trajectory.retrieved)} searches")
    out = []
    for hits, observation in zip(trajectory.retrieved, observations):
        body = observation[len(head):]
        body = body[:-len(tail)] if body.endswith(tail) else body
        body = body[:-len(TRUNCATION_MARKER)] if body.endswith(TRUNCATION_MARKER) else body
        full = protocol.information_block(format_passages(hits))[len(head):-len(tail)]
        seen = next((k for k, (a, b) in enumerate(zip(body, full)) if a != b), min(len(body), len(full)))
        kept, offset = [], 0
        for i, hit in enumerate(hits, start=1):
            block = format_passages([hit]).replace("Doc 1(", f"Doc {i}(", 1)
            text_start = offset + len(block) - len(hit.text) - 1  # the block is "Doc i(Title: t) " + text + "\n"
            if seen >= text_start:
                kept.append(dataclasses.replace(hit, text=hit.text[:max(0, seen - text_start)]))
            offset += len(block)
        out.append(kept)
    return out


def label_trajectories(trajectories: Sequence, tokenizer, *, max_passages: int,
                       passage_chars: int) -> tuple[list[StageATrace], dict[str, int]]:
    """Labelled traces from rollouts (module docstring): all-zero groups, Actor-visible evidence as Stage A is
    shown it, the label from the gold. Returns (traces, counts of what was kept and dropped)."""
    groups: dict[str, list] = {}
    for t in trajectories:
        groups.setdefault(t.prompt.uid, []).append(t)
    counts = {"trajectories": len(trajectories), "groups": len(groups), "all_zero_groups": 0,
              "all_zero_trajectories": 0, "no_visible_evidence": 0, "traces": 0, "sufficient": 0}
    traces = []
    for uid, members in groups.items():
        if any(exact_match(t.answer, t.prompt.golden_answers) > 0 for t in members):
            continue
        counts["all_zero_groups"] += 1
        counts["all_zero_trajectories"] += len(members)
        for t in members:
            hits = eviback.evidence_hits(visible_hits(t, tokenizer), max_passages)
            hits = [dataclasses.replace(h, text=h.text[:passage_chars], score=0.0) for h in hits]
            if not hits:
                counts["no_visible_evidence"] += 1
                continue
            label = SUFFICIENT if evidence_has_gold(hits, t.prompt.golden_answers) else INSUFFICIENT
            counts["sufficient"] += label == SUFFICIENT
            traces.append(StageATrace(f"{uid}#{t.sample_index}", t.prompt.question, tuple(hits),
                                      tuple(t.prompt.golden_answers), t.answer or "", label))
    counts["traces"] = len(traces)
    return traces, counts


# --- a Teacher's figures on labelled traces ------------------------------------------------------------------

def _as_trajectory(trace: StageATrace):
    """The trace as a one-trajectory group, as eviback_fallback sees a rollout."""
    from searchjax.agent.rollout import Prompt, Trajectory
    answer = trace.answer or None
    if exact_match(answer, trace.golden_answers) > 0:
        raise ValueError(f"trace {trace.uid}: the Actor answer {answer!r} matches a gold (EM 1); labelled traces "
                         f"come from all-zero groups")
    return Trajectory(prompt=Prompt(trace.uid, trace.question, trace.golden_answers), sample_index=0, prompt_ids=[],
                      response_ids=[], loss_mask=[], sampler_logprobs=[], response_text="", queries=[trace.question],
                      doc_ids=[[h.id for h in trace.hits]], retrieved=[list(trace.hits)], answer=answer,
                      num_searches=1, duplicate_queries=0, forced_termination=answer is None,
                      valid_answer=answer is not None)


def shown_hits(trace: StageATrace, cfg: eviback.EvibackConfig) -> list[Hit]:
    """The trace's evidence as the Teacher is shown it: unique passages, capped and cut as EviBack does."""
    hits = eviback.evidence_hits([list(trace.hits)], cfg.max_evidence_passages)
    return [dataclasses.replace(h, text=h.text[:cfg.max_passage_chars]) for h in hits]


def gate_figures(traces: Sequence[StageATrace], verdicts: Sequence[str | None], outputs: Sequence[str | None] | None,
                 cfg: eviback.EvibackConfig) -> dict[str, float | None]:
    """Insufficient-evidence F1 (with P, R) and our gold coverage (None when the Teacher writes no answers)."""
    out: dict[str, float | None] = dict(insufficient_f1([t.label for t in traces], verdicts))
    with_gold = [k for k, t in enumerate(traces) if evidence_has_gold(shown_hits(t, cfg), t.golden_answers)]
    out["gold_in_evidence"] = len(with_gold)
    out["gold_coverage"] = (None if outputs is None else
                            sum(exact_match(outputs[k], traces[k].golden_answers) for k in with_gold) / len(with_gold)
                            if with_gold else 0.0)
    return out


def evaluate_policy(traces: Sequence[StageATrace], judge: Judge, policy: TeacherPolicy, cfg: eviback.EvibackConfig,
                    *, repeats: int = 1) -> dict:
    """A Teacher policy end to end on labelled traces: figures, cost, parse failures, stability, per-trace rows.

    stability: the share of traces whose verdict and refined answer are the same in all `repeats` runs."""
    if not traces or repeats < 1:
        raise ValueError(f"evaluate_policy: needs traces and repeats >= 1, got {len(traces)}, {repeats}")
    trajectories = [_as_trajectory(t) for t in traces]
    runs = [eviback.eviback_fallback(trajectories, judge, cfg, policy=policy) for _ in range(repeats)]
    first = runs[0]
    refine = policy.mode == "refine"
    outputs = [first.refined[k] if refine and first.verdicts[k] not in (None, INSUFFICIENT) else None
               for k in range(len(traces))]
    metrics = gate_figures(traces, first.verdicts, outputs if refine else None, cfg)
    requests = sum(r.metrics["stage_a_requests"] + r.metrics["stage_b_requests"] for r in runs)
    tokens = sum(r.metrics["teacher_prompt_tokens"] + r.metrics["teacher_completion_tokens"] for r in runs)
    metrics.update(traces=len(traces), failures=sum(v is None for v in first.verdicts),
                   parse_failure_rate=sum(r.metrics["teacher_malformed"] for r in runs) / max(requests, 1),
                   stability=sum(len({(r.verdicts[k], r.refined[k]) for r in runs}) == 1
                                 for k in range(len(traces))) / len(traces),
                   tokens_per_trace=tokens / (repeats * len(traces)),
                   cost_usd=sum(r.metrics["teacher_cost_usd"] for r in runs) / repeats,
                   **{f"verdict/{v}": sum(x == v for x in first.verdicts) for v in eviback.VERDICTS})
    rows = [{"uid": t.uid, "label": t.label, "verdict": first.verdicts[k], "judgement": first.judgements[k],
             "output": outputs[k], "golden_answers": list(t.golden_answers)} for k, t in enumerate(traces)]
    return {"metrics": metrics, "rows": rows, "failures": [f for r in runs for f in r.failures],
            "policy": policy.describe()}


SINGLE_PROMPT_PARSER = {"kind": "json", "fields": {
    "verdict": {"enum": list(eviback.VERDICTS)},
    "answer": {"type": "string", "none_values": ["N/A", "none", "unknown"]}}}


def evaluate_single_prompt(traces: Sequence[StageATrace], judge: Judge, template: PromptTemplate,
                           cfg: eviback.EvibackConfig, *, parser: Parser | None = None) -> dict:
    """A one-call Teacher (verdict and answer together; {references} in the prompt makes it gold-aware) on
    labelled traces, with training's evidence rendering and the correction round. The figures as
    `evaluate_policy` (its answer counts only with a verdict other than Insufficient)."""
    parser = parser or parser_from_spec(SINGLE_PROMPT_PARSER, "single prompt parser")
    requests = []
    for t in traces:
        values = {"question": t.question, "references": " | ".join(t.golden_answers),
                  "evidence": eviback.format_evidence(eviback.evidence_hits([list(t.hits)], cfg.max_evidence_passages),
                                                      cfg.max_passage_chars)}
        requests.append(JudgeRequest(render_prompt(template, **{k: v for k, v in values.items() if k in template.fields}),
                                     max_tokens=cfg.max_reply_tokens))
    usage = judge.usage.snapshot()
    outcomes = ask_parsed_many(judge, requests, parser, correction_rounds=cfg.correction_rounds)
    after = judge.usage.snapshot()
    verdicts = [o.parsed["verdict"] if o.ok else None for o in outcomes]
    outputs = [o.parsed["answer"] or None if o.ok and o.parsed["verdict"] != INSUFFICIENT else None for o in outcomes]
    metrics = gate_figures(traces, verdicts, outputs, cfg)
    metrics.update(traces=len(traces), failures=sum(v is None for v in verdicts),
                   parse_failure_rate=sum(o.error is not None and o.error.kind == "malformed"
                                          for o in outcomes) / len(outcomes),
                   tokens_per_trace=(after["prompt_tokens"] + after["completion_tokens"] - usage["prompt_tokens"]
                                     - usage["completion_tokens"]) / len(traces),
                   cost_usd=after["cost_usd"] - usage["cost_usd"])
    rows = [{"uid": t.uid, "label": t.label, "verdict": v, "output": y} for t, v, y in zip(traces, verdicts, outputs)]
    return {"metrics": metrics, "rows": rows, "prompt": template.name, "prompt_sha256": template.sha256}


def main(argv):
    """The configured Teacher's figures: on --traces (labelled rollouts: the config's policy unless
    --noconfig_policy, the two single-prompt baselines with --baselines, frozen bundles with --bundles) or,
    without --traces, the grade-mode check on the synthetic set. Each Teacher's metrics are printed (and the
    --output file rewritten) as soon as it is done."""
    del argv
    from absl import flags
    from searchjax.judges.teacher_bundle import load_bundle
    f = flags.FLAGS
    config = f.config
    judge = teacher_from_config(config)
    cfg = eviback.EvibackConfig(**{**config.eviback.to_dict(), "audit_path": ""})
    result = {}

    def done(name, value):
        result[name] = value
        print(json.dumps({"teacher": name, **value["metrics"]}), flush=True)
        if f.output:
            with open(f.output, "w", encoding="utf-8") as out:
                json.dump({**result, "judge": judge.describe(), "traces": f.traces}, out, indent=1)
    if not f.traces:
        traces = build_labelled_set(topk=config.harness.topk, passage_chars=config.harness.passage_chars,
                                    limit=f.limit)
        done("synthetic", evaluate_stage_a(traces, judge, cfg))
        return
    traces = read_traces_jsonl(f.traces)[:f.limit]
    if f.config_policy:
        policy = eviback.policy_from_config(cfg)
        done(f"config policy {policy.name}", evaluate_policy(traces, judge, policy, cfg))
    if f.baselines:
        for name in ("eviback_single_dual.v1", "eviback_single_gold.v1"):
            done(name, evaluate_single_prompt(traces, judge, load_prompt(name), cfg))
    for path in [p for p in f.bundles.split(",") if p]:
        done(path, evaluate_policy(traces, judge, load_bundle(path), cfg))


if __name__ == "__main__":
    import os
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from absl import app, flags
    from ml_collections import config_flags
    config_flags.DEFINE_config_file("config", None, "an EviBack config file, e.g. configs/eviback.py:quickstart",
                                    lock_config=True)
    flags.DEFINE_integer("limit", None, "use only the first N traces (synthetic set: N default questions)")
    flags.DEFINE_string("traces", "", "a labelled traces jsonl (launch/label_traces.py); '' = the synthetic set")
    flags.DEFINE_bool("baselines", False, "also evaluate the manual and the gold-aware single-prompt Teachers")
    flags.DEFINE_bool("config_policy", True, "evaluate the policy the config's eviback section describes")
    flags.DEFINE_string("bundles", "", "comma-separated frozen Teacher bundle directories to evaluate")
    flags.DEFINE_string("output", "", "write metrics and per-trace rows to this JSON file")
    app.run(main)

"""Stage A quality harness: how well EviBack's gold-blind gate separates sufficient from insufficient evidence.

A labelled trace is (question, evidence passages, gold answers, an Actor answer, label), label in
{"Sufficient", "Insufficient"}. Two numbers, as the paper reports them for its frozen gate (insufficient-
evidence F1 0.8924, gold-answer coverage 0.6825):

* insufficient-evidence F1: Insufficient is the positive class. With TP = traces labelled and judged
  Insufficient, P = TP / #judged Insufficient, R = TP / #labelled Insufficient, F1 = 2PR / (P + R)
  (0 when TP = 0). Supported and Ambiguous both count as "not Insufficient".
* gold coverage: among traces whose evidence contains the gold answer (label Sufficient), the fraction
  that the gate passes (verdict != Insufficient) AND Stage B credits (judgement Correct or Partial:
  c(j) > 0 in the fallback reward). `gold_coverage_strict` counts Correct only.
Teacher failures count as not passing / not crediting (and are reported as `failures`).

The labelled set on the embedded default (`build_labelled_set`), sufficiency known by construction:
for each default question (FanOutQA sub-questions whose answer string occurs in their evidence article's
extract) two traces,

* Sufficient: a window of the gold article (at most `passage_chars` characters, placed so the first
  case-insensitive occurrence of the answer is inside it) plus the `topk - 1` best BM25 hits for the
  question that are not the gold article, the gold passage at a position that rotates with the question;
* Insufficient: the `topk` best BM25 hits for the question among passages that are not the gold article
  and do not contain the answer string (case-insensitively) anywhere in their text.

So the answer string is, respectively, verbatim in the evidence or absent from it. (A paraphrase of the
answer, "1,000" for "1000", could still make an Insufficient trace answerable; the string test cannot see
that.) The Actor answer Stage B judges is "It is {gold}.", EM 0 against the gold (as in an all-zero group)
but naming it. Run on the embedded default:

    python -m searchjax.eval.stage_a_harness --config=configs/eviback.py:quickstart --limit=10
    python -m searchjax.judges.ape --config=configs/eviback.py:quickstart --limit=12 --output_dir=/tmp/prompts
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

from retrieval.corpus import Hit
from searchjax.data.jsonl import iter_jsonl
from searchjax.judges.base import Judge, ask_json_many
from searchjax.judges.templates import PromptTemplate, load_prompt
from searchjax.rewards import eviback

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
        from searchjax.rl.setup import resolve_model_path
        from searchjax.tokenization import load_tokenizer
        path = resolve_model_path(config.model.path)  # the initial policy, as the training run's Teacher
        model, params = load_pretrained(path, dtype=config.teacher.local_dtype)
        local_model = (model, params, load_tokenizer(path))
    return build_judge(config.teacher, local_model=local_model)


def main(argv):
    """Evaluate the configured Teacher's gate on the embedded-default labelled set and print the metrics."""
    del argv
    from absl import flags
    config = flags.FLAGS.config
    judge = teacher_from_config(config)
    traces = build_labelled_set(topk=config.harness.topk, passage_chars=config.harness.passage_chars,
                                limit=flags.FLAGS.limit)
    cfg = eviback.EvibackConfig(**{**config.eviback.to_dict(), "audit_path": ""})
    result = evaluate_stage_a(traces, judge, cfg)
    result["metrics"]["teacher"] = judge.describe()
    print(json.dumps(result["metrics"], indent=2))
    if flags.FLAGS.output:
        with open(flags.FLAGS.output, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    import os
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from absl import app, flags
    from ml_collections import config_flags
    config_flags.DEFINE_config_file("config", None, "an EviBack config file, e.g. configs/eviback.py:quickstart",
                                    lock_config=True)
    flags.DEFINE_integer("limit", None, "use only the first N default questions (2 traces each)")
    flags.DEFINE_string("output", "", "write metrics and per-trace rows to this JSON file")
    app.run(main)

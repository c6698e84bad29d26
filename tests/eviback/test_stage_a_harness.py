"""The Stage A harness: the labelled set on the embedded default is labelled correctly by construction, and its
metrics agree with scikit-learn on a scripted Teacher's verdicts; APE picks and versions a better prompt."""

import json

import numpy as np
import pytest

from eviback_scripts import STAGE_A_MARK, STAGE_B_MARK, rule_judgement
from retrieval.corpus import Hit
from searchjax.eval.stage_a_harness import (INSUFFICIENT, SUFFICIENT, StageATrace, build_labelled_set,
                                            evaluate_stage_a, read_traces_jsonl, write_traces_jsonl)
from searchjax.judges.ape import EDITS, ape_search
from searchjax.judges.openai_compat import OpenAICompatConfig, OpenAICompatJudge
from searchjax.judges.templates import load_prompt
from searchjax.judges.testing_server import serve_scripted
from searchjax.rewards.eviback import EvibackConfig
from searchjax.rewards.qa import exact_match


@pytest.fixture(scope="module")
def labelled_set():
    from retrieval import default_index
    from searchjax.data.default_questions import default_questions
    questions = default_questions()[:12]
    return questions, build_labelled_set(questions, default_index("bm25"), topk=3, passage_chars=600)


def test_labelled_set_is_labelled_by_construction(labelled_set):
    questions, traces = labelled_set
    assert [t.label for t in traces] == [SUFFICIENT, INSUFFICIENT] * len(questions)
    for q, (sufficient, insufficient) in zip(questions, zip(traces[::2], traces[1::2])):
        gold = q.golden_answers[0].lower()
        assert len(sufficient.hits) == len(insufficient.hits) == 3
        assert any(h.title == q.gold_title and gold in h.text.lower() for h in sufficient.hits)
        assert all(gold not in h.text.lower() and h.title != q.gold_title for h in insufficient.hits)
        assert all(len(h.text) <= 600 for h in sufficient.hits + insufficient.hits)
        for t in (sufficient, insufficient):
            assert t.question == q.question and exact_match(t.answer, t.golden_answers) == 0.0
            assert gold in t.answer.lower()


def test_traces_jsonl_round_trip(labelled_set, tmp_path):
    _, traces = labelled_set
    write_traces_jsonl(traces, tmp_path / "traces.jsonl")
    assert read_traces_jsonl(tmp_path / "traces.jsonl") == [
        StageATrace(t.uid, t.question, tuple(Hit(h.id, h.title, h.text, 0.0) for h in t.hits), t.golden_answers,
                    t.answer, t.label) for t in traces]
    (tmp_path / "bad.jsonl").write_text('{"uid": "x"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        read_traces_jsonl(tmp_path / "bad.jsonl")


def _hash_verdict(body):
    """A scripted gate that is right on some traces and wrong on others, deterministically by content."""
    user = body["messages"][1]["content"]
    return ("Supported", "Insufficient", "Ambiguous")[sum(map(ord, user)) % 3]


def test_metrics_match_sklearn(labelled_set):
    from sklearn.metrics import precision_recall_fscore_support
    _, traces = labelled_set

    def responder(body):
        if body["messages"][0]["content"].startswith(STAGE_A_MARK):
            return '{"verdict": "%s"}' % _hash_verdict(body)
        assert body["messages"][0]["content"].startswith(STAGE_B_MARK)
        user = body["messages"][1]["content"]
        answer = user.split("System's answer: ")[1].split("\n")[0]
        references = user.split("Reference answer(s): ")[1].split("\n")[0].split(" | ")
        return '{"judgement": "%s"}' % rule_judgement(answer, references)
    with serve_scripted(responder) as server:
        judge = OpenAICompatJudge(OpenAICompatConfig(base_url=server.base_url, model="m", api_key_env=""))
        result = evaluate_stage_a(traces, judge, EvibackConfig())
        bodies = server.request_bodies()
    rows, metrics = result["rows"], result["metrics"]
    y_true = [r["label"] == INSUFFICIENT for r in rows]
    y_pred = [r["verdict"] == INSUFFICIENT for r in rows]
    assert 0 < sum(y_pred) < len(rows) and 0 < sum(a == b for a, b in zip(y_true, y_pred)) < len(rows)
    p, r, f1, _ = precision_recall_fscore_support(y_true, y_pred, average="binary", zero_division=0)
    assert metrics["insufficient_precision"] == pytest.approx(p)
    assert metrics["insufficient_recall"] == pytest.approx(r)
    assert metrics["insufficient_f1"] == pytest.approx(f1)
    # Gold coverage: traces with the gold in evidence that pass the gate and that Stage B credits. The
    # answers "It is <gold>." contain the gold, so the rule credits every one Stage B sees.
    with_gold = [x for x in rows if x["gold_in_evidence"]]
    assert [x["label"] for x in with_gold] == [SUFFICIENT] * len(with_gold)
    passed = [x for x in with_gold if x["verdict"] != INSUFFICIENT]
    assert metrics["gold_coverage"] == pytest.approx(len(passed) / len(with_gold))
    assert sum(b["messages"][0]["content"].startswith(STAGE_B_MARK) for b in bodies) == len(passed)
    assert result["prompt_sha256"]["A"] == load_prompt("eviback_stage_a.v1").sha256


# --- APE ---------------------------------------------------------------------------------------------------

def _synthetic_traces(n):
    traces = []
    for i in range(n):
        label = SUFFICIENT if i % 2 == 0 else INSUFFICIENT
        text = f"Item {i} was made in {'Lyon' if label == SUFFICIENT else 'an unknown place'}."
        traces.append(StageATrace(f"s{i}", f"Where was item {i} made?", (Hit(str(i), f"Item {i}", text, 1.0),),
                                  ("Lyon",), "It is Lyon.", label))
    return traces


def test_ape_keeps_the_best_candidate_and_writes_a_new_version(tmp_path):
    train, heldout = _synthetic_traces(8), _synthetic_traces(12)[8:]
    labels = {t.question: t.label for t in train + heldout}
    magic = dict(EDITS)["find_sentence"]
    proposer_calls = []

    def responder(body):
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if system.startswith("You improve instructions"):
            proposer_calls.append(user)
            # one valid rewrite (keeps both placeholders) and, on the second call, an invalid one
            if len(proposer_calls) % 2:
                return "Question: {question}\n\nDocuments:\n{evidence}\n\nAnswer Supported or Insufficient."
            return "Judge {question} only."
        question = user.split("Question: ")[1].split("\n")[0]
        if magic in user:  # the gate works only when told to look for an answering sentence
            verdict = "Insufficient" if labels[question] == INSUFFICIENT else "Supported"
        else:
            verdict = "Supported"
        return '{"verdict": "%s"}' % verdict
    with serve_scripted(responder) as server:
        judge = OpenAICompatJudge(OpenAICompatConfig(base_url=server.base_url, model="m", api_key_env=""))
        result = ape_search(judge, train, EvibackConfig(), heldout_traces=heldout, proposer=judge, rounds=1,
                            num_proposals=2, output_dir=tmp_path)
    names = [name for name, _ in result.history]
    assert names[0] == "base" and result.history[0][1]["insufficient_f1"] == 0.0
    assert result.best.name == "edit:find_sentence"
    assert dict(result.history)["edit:find_sentence"]["insufficient_f1"] == 1.0
    # Two identical proposer requests go out concurrently, so which one got the invalid rewrite is up to the
    # server's thread order: exactly one proposal (the valid rewrite) survives, the invalid one is dropped.
    assert len([n for n in names if n in ("proposal:0.0", "proposal:0.1")]) == 1
    assert len(proposer_calls) == 2 and "Where was item" in proposer_calls[0]  # misjudged cases were shown
    assert result.base_heldout["insufficient_f1"] == 0.0 and result.best_heldout["insufficient_f1"] == 1.0
    assert result.written == tmp_path / "eviback_stage_a.v2.txt"
    written = load_prompt(result.written)
    base = load_prompt("eviback_stage_a.v1")
    assert written.fields == base.fields and written.sha256 != base.sha256
    assert magic in written.messages[-1][1]
    assert result.written.read_text().startswith("# written by searchjax.judges.ape from eviback_stage_a.v1")
    assert [m[0] for m in written.messages] == [m[0] for m in base.messages]
    assert np.isclose(json.loads(json.dumps(result.best_heldout))["accuracy"], 1.0)

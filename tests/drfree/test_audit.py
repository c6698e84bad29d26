"""Dr.Free's audits (searchjax.drfree.audit): Table 4 (proposer behaviour), Table 5 (gold-blind counterfactual
audit with a scripted judge), Table 14 (train-test overlap on the embedded default), against hand-computed
counts, Wilson intervals and Fisher p-values (hypergeometric sums written out here)."""

import json
import math

import pytest

from retrieval.corpus import Hit
from searchjax.data.qa_datasets import default_prompts
from searchjax.drfree import audit
from searchjax.drfree.audit import AuditQuestion
from searchjax.judges.base import Judge, JudgeReply

# Wilson 95 % intervals of k / 4 (z = 1.959964), worked by hand: centre (p + z^2/2n) / (1 + z^2/n),
# half-width z sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n).
WILSON_OF_4 = {0: (0.0, 0.4899), 1: (0.0456, 0.6994), 2: (0.1500, 0.8500), 3: (0.3006, 0.9544), 4: (0.5101, 1.0)}


def q(qid, method, hops, answer, seed_text, *, searches=0, components=(), question=None, aliases=()):
    passages = (("Seed", seed_text),) + tuple((f"Part {k}", t) for k, t in enumerate(components, start=1))
    return AuditQuestion(id=qid, question=question or f"Question {qid}?", answer=answer, method=method, hops=hops,
                         num_searches=searches, aliases=tuple(aliases), passages=passages)


def test_table4_proposer_behaviour_by_hand(tmp_path):
    questions = [
        q("o1", "ours", 1, "Paris", "Paris is in France."),  # single hop: not counted
        q("o2", "ours", 2, "Ang Lee", "The film was directed by Ang Lee."),  # answer in seed
        q("o3", "ours", 2, "Taiwan", "The film is from 2000."),
        q("o4", "ours", 3, "1990", "It opened in 19901."),  # token boundary: not a mention
        q("o5", "ours", 3, "Rome", "A city."),
        q("z1", "drzero", 2, "Tan Dun", "Music by Tan Dun.", searches=0),
        q("z2", "drzero", 3, "Lyon", "Lyon hosts it.", searches=2),
        q("z3", "drzero", 3, "Oslo", "A fjord.", searches=0),
        q("z4", "drzero", 2, "Nile", "A river.", searches=1),
    ]
    rows = {(r["method"], r["measure"]): r for r in audit.proposer_behaviour(questions)}
    expected = {("ours", "no_search"): 4, ("ours", "answer_in_seed"): 1,
                ("drzero", "no_search"): 2, ("drzero", "answer_in_seed"): 2}
    for key, count in expected.items():
        row = rows[key]
        assert (row["count"], row["n"], row["rate"]) == (count, 4, count / 4)
        assert (row["ci_low"], row["ci_high"]) == pytest.approx(WILSON_OF_4[count], abs=1e-4)
    md, jsonl = audit.write_table(list(rows.values()), tmp_path, "table4")
    assert md.read_text().splitlines()[0] == "| table | method | measure | count | n | rate | ci_low | ci_high |"
    assert [json.loads(x)["count"] for x in jsonl.read_text().splitlines()] == [4, 1, 2, 2]


class ScriptedJudge(Judge):
    """Replies by (question, condition evidence marker); records every request; optional temperature."""

    def __init__(self, answers, temperature=0.0):
        super().__init__(max_concurrency=1)
        self.answers, self.temperature, self.requests = answers, temperature, []

    def describe(self):
        return {"backend": "scripted", "temperature": self.temperature}

    def _complete(self, request):
        self.requests.append(request)
        user = request.messages[1]["content"]  # the first user turn (a correction re-ask appends turns)
        question = user.split("Question: ", 1)[1].split("\n", 1)[0]
        marker = "closed_book"
        for tag in ("SEED", "RETRIEVED", "PART1", "PART2"):
            if tag in user:
                marker = tag
        text = self.answers.get((question, marker), '{"answer": "ABSTAIN"}')
        return JudgeReply(text=text, prompt_tokens=1, completion_tokens=1)


class OneHitRetriever:
    def search(self, queries, topk):
        return [[Hit(id=f"r/{i}", title="Result", text=f"RETRIEVED text for {query}", score=1.0)]
                for i, query in enumerate(queries)]


def fisher_greater_by_hand(a, b, c, d):
    """P(X >= a) for X ~ Hypergeometric(N = a+b+c+d, K = a+c successes, n = a+b draws)."""
    n_total, k, n = a + b + c + d, a + c, a + b
    return sum(math.comb(k, x) * math.comb(n_total - k, n - x) for x in range(a, min(k, n) + 1)) / \
        math.comb(n_total, n)


def test_table5_gold_blind_counterfactual_audit_by_hand(tmp_path):
    questions = [
        q("o1", "ours", 2, "Pingtung County", "SEED The film by a director.", components=("PART1 a man", "PART2 x")),
        q("o2", "ours", 2, "Taiwan", "SEED A county.", components=("PART1 y", "PART2 z")),
        q("z1", "drzero", 2, "Tan Dun", "SEED Music by Tan Dun.", searches=1),
        q("z2", "drzero", 2, "Lyon", "SEED Lyon.", searches=0, aliases=("Lyons",)),
    ]
    answers = {
        ("Question o1?", "PART1"): '{"answer": "Pingtung County"}',  # a hop component alone gives it away
        ("Question o1?", "closed_book"): '{"answer": "Kaohsiung"}',  # answered, wrong: no shortcut
        ("Question o2?", "RETRIEVED"): '{"answer": "ABSTAIN"}',
        ("Question z1?", "SEED"): '{"answer": "tan dun."}',  # the seed alone: a shortcut (SQuAD-normalised EM)
        ("Question z1?", "closed_book"): '{"answer": "Tan Dun"}',
        ("Question z2?", "RETRIEVED"): '{"answer": "Lyons"}',  # an alias counts
        ("Question z2?", "SEED"): "not json at all",  # malformed twice: an error, no shortcut
    }
    judge = ScriptedJudge(answers)
    records = audit.counterfactual_audit(questions, judge, OneHitRetriever(), topk=1)
    conditions = {(r["id"], r["condition"]) for r in records}
    assert conditions == {(i, c) for i in ("o1", "o2") for c in ("closed_book", "source", "retrieval", "hop_1",
                                                                  "hop_2")} | \
        {(i, c) for i in ("z1", "z2") for c in ("closed_book", "source", "retrieval")}
    shortcuts = sorted((r["id"], r["condition"]) for r in records if r["shortcut"])
    assert shortcuts == [("o1", "hop_1"), ("z1", "closed_book"), ("z1", "source"), ("z2", "retrieval")]
    errors = [(r["id"], r["condition"]) for r in records if r["error"]]
    assert errors == [("z2", "source")]
    # gold-blind: no request carries a gold answer unless the evidence itself states it
    for request in judge.requests:
        text = request.canonical_bytes().decode()
        for question in questions:
            for gold in question.golds:
                if gold in text:
                    assert "SEED Music by Tan Dun." in text or "SEED Lyon." in text
    rows = {(r["method"], r["condition"]): r for r in audit.shortcut_table(records)}
    assert (rows["ours", "hop_1"]["count"], rows["ours", "hop_1"]["n"]) == (1, 2)
    assert (rows["ours", "any"]["count"], rows["ours", "any"]["n"]) == (1, 2)
    assert (rows["drzero", "any"]["count"], rows["drzero", "any"]["n"]) == (2, 2)
    assert (rows["drzero", "source"]["count"], rows["drzero", "source"]["errors"]) == (1, 1)
    assert rows["ours", "closed_book"]["abstain_rate"] == 0.5
    # Wilson of 1/2 by hand (z = 1.959964): centre 0.5, half z sqrt(1/8 + z^2/16) / (1 + z^2/2)
    z = 1.959964
    half = z * math.sqrt(0.125 + z * z / 16) / (1 + z * z / 2)
    assert (rows["ours", "any"]["ci_low"], rows["ours", "any"]["ci_high"]) == pytest.approx((0.5 - half, 0.5 + half),
                                                                                           abs=1e-5)
    comparisons = {(r["method_a"], r["method_b"], r["condition"]): r for r in audit.fisher_comparisons(
        list(rows.values()))}
    assert comparisons["drzero", "ours", "any"]["p_a_greater"] == pytest.approx(fisher_greater_by_hand(2, 0, 1, 1))
    assert comparisons["ours", "drzero", "any"]["p_a_greater"] == pytest.approx(fisher_greater_by_hand(1, 1, 2, 0))
    assert ("ours", "drzero", "hop_1") not in comparisons  # drzero has no chain components
    audit.write_table(list(rows.values()), tmp_path, "table5")
    assert "| drzero | any | 2 | 2 | 1.000 |" in (tmp_path / "table5.md").read_text()
    with pytest.raises(ValueError, match="temperature 0"):
        audit.counterfactual_audit(questions, ScriptedJudge(answers, temperature=0.7))


def test_table14_train_test_overlap_on_the_embedded_default(tmp_path):
    assert audit.token_jaccard("What is the headquarter of Apple Inc?", "What is the headquarter of Apple?") == 5 / 6
    assert audit.token_jaccard("the", "a") == 0.0
    dev = default_prompts()
    apple = next(p for p in dev if p.question == "What is the headquarter of Apple?")
    train = [
        q("t1", "ours", 1, "Cupertino, California", "", question="What is the headquarter of Apple Inc?"),  # J = 5/6
        q("t2", "ours", 1, "Cupertino", "", question="What is the headquarter of Apple?"),  # no shared alias
        q("t3", "ours", 1, "Cupertino, California", "",  # shared alias, J = 3/9
          question="Where is the headquarters of the company Apple located?"),
        q("t4", "ours", 1, "Redwood", "", aliases=("cupertino california",),  # alias match after normalisation,
          question="What is the headquarter of Apple company?"),  # J = 5/6
    ]
    rows, pairs = audit.train_test_overlap(train, {"default": dev})
    assert (rows[0]["count"], rows[0]["n"], rows[0]["train_questions"]) == (1, len(dev), 4)
    assert sorted((p["eval_id"], p["train_id"]) for p in pairs) == [(apple.uid, "t1"), (apple.uid, "t4")]
    assert all(p["jaccard"] == pytest.approx(5 / 6) for p in pairs)
    md, jsonl = audit.write_table(rows, tmp_path, "table14")
    assert json.loads(jsonl.read_text())["rate"] == pytest.approx(1 / len(dev))


def test_read_questions_names_the_bad_row(tmp_path):
    good = {"uid": "x/0", "question": "Q?", "answer": "A", "golden_answers": ["A", "a1"], "hops": 2,
            "passages": [{"title": "S", "text": "seed"}]}
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "hops": 0}) + "\n")
    with pytest.raises(ValueError, match=r"pairs.jsonl:2: field 'hops' must be an integer >= 1"):
        audit.read_questions(path, "ours")
    path.write_text(json.dumps(good) + "\n")
    (read,) = audit.read_questions(path, "ours")
    assert (read.id, read.golds, read.passages, read.method) == ("x/0", ("A", "a1"), (("S", "seed"),), "ours")
    path.write_text(json.dumps({k: v for k, v in good.items() if k != "passages"}) + "\n")
    with pytest.raises(ValueError, match=r"pairs.jsonl:1: missing field\(s\) \['passages'\]"):
        audit.read_questions(path, "ours")


def test_run_audits_writes_every_table(tmp_path):
    row = {"uid": "x/0", "question": "What is the headquarter of Apple Inc?", "answer": "Cupertino, California",
           "hops": 2, "num_searches": 0,
           "passages": [{"title": "S", "text": "SEED Apple is based in Cupertino, California."}]}
    (tmp_path / "ours.jsonl").write_text(json.dumps(row) + "\n")
    judge = ScriptedJudge({("What is the headquarter of Apple Inc?", "SEED"): '{"answer": "Cupertino, California"}'})
    tables = audit.run_audits({"ours": tmp_path / "ours.jsonl"}, tmp_path / "out", judge=judge)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        f"{name}.{ext}" for name in tables for ext in ("md", "jsonl"))
    assert tables["table4_proposer_behaviour"][1]["count"] == 1  # the answer is in the seed passage
    assert tables["table14_overlap"][0]["count"] == 1  # the embedded default's Apple question
    assert tables["table5_fisher"] == []  # one method: nothing to compare
    calls = tables["table5_calls"]
    assert [(r["condition"], r["shortcut"]) for r in calls] == [("closed_book", False), ("source", True)]

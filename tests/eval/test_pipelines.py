"""The inference baselines' exact prompts and retrieval calls, with a scripted model and a recording retriever.

Expected prompt texts are written out here from the sources' wording (FlashRAG's base_prompt.py and
run_exp.py, IRCoT's pipeline in active_pipeline.py, Search-o1's scripts/prompts.py), not built from the
module's constants, except for the long IRCoT demonstration and Search-o1 instructions, whose key sentences
are checked literally."""

import dataclasses
import json

import pytest

from scripted_lm import RecordingRetriever, ScriptedLM, hits_for, tiny_tokenizer
from searchjax.agent.rollout import Prompt
from searchjax.eval import pipeline_prompts as P
from searchjax.eval import pipelines
from searchjax.eval.benchmarks import summary_rows

Q1 = Prompt(uid="nq/1", question="Which city is the capital of France?", golden_answers=("Paris",), data_source="nq")
Q2 = Prompt(uid="hotpotqa/2", question="Where is Lyon?", golden_answers=("France",), data_source="hotpotqa")


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def _run(name, lm, retriever, prompts, batch_size=2, **fields):
    cfg = dataclasses.replace(pipelines.SYSTEMS[name], **fields)
    return pipelines.run_pipeline(cfg, None, None, lm.tokenizer, retriever, prompts, system=name,
                                  batch_size=batch_size, logits_fn=lm.logits_fn)


def test_direct_and_cot_prompts_and_answers(tokenizer):
    lm = ScriptedLM(tokenizer)
    direct_system = ("Answer the question based on your own knowledge. Only give me the answer and do not output "
                     "any other words.")
    lm.add(lm.chat([{"role": "system", "content": direct_system},
                    {"role": "user", "content": "Question: Which city is the capital of France?"}]), "\n Paris \nLyon")
    lm.add(lm.chat([{"role": "system", "content": direct_system},
                    {"role": "user", "content": "Question: Where is Lyon?"}]), "France")
    records = _run("direct", lm, None, [Q1, Q2])
    assert lm.unmatched == [] and lm.used == {0, 1}
    assert [r["answer"] for r in records] == ["Paris", "France"]  # first non-empty line, stripped
    assert [(r["system"], r["id"], r["em"], r["searches"], r["flags"]["end_reason"]) for r in records] == [
        ("direct", "nq/1", 1.0, [], "answer"), ("direct", "hotpotqa/2", 1.0, [], "answer")]

    lm = ScriptedLM(tokenizer)
    cot = ("Please answer the following question. You should think step by step to solve it.\n\n"
           "Provide your final answer in the format \\boxed{YOUR_ANSWER}.\n\nQuestion:\n{q}\n\n")
    lm.add(lm.chat([{"role": "user", "content": cot.replace("{q}", Q1.question)}]),
           "France's capital is \\boxed{Lyon}, no: \\boxed{\\text{Paris}}")
    lm.add(lm.chat([{"role": "user", "content": cot.replace("{q}", Q2.question)}]), "I do not know.")
    records = _run("cot", lm, None, [Q1, Q2])
    assert lm.unmatched == []
    assert [r["answer"] for r in records] == ["Paris", None]  # the last box, its \text{}; no box: no answer
    assert [r["flags"]["valid_answer"] for r in records] == [True, False]
    assert records[1]["flags"]["end_reason"] == "eos"


def test_rag_retrieves_once_per_batch_and_lists_documents(tokenizer):
    lm = ScriptedLM(tokenizer)
    retriever = RecordingRetriever()
    for q, answer in ((Q1, "Paris"), (Q2, "in France")):
        docs = "".join(f"Doc {k + 1}(Title: T{k} {q.question}) text {k} about {q.question}\n" for k in range(3))
        system = ("Answer the question based on the given document. Only give me the answer and do not output any "
                  f"other words.\nThe following are given documents.\n\n{docs}")
        lm.add(lm.chat([{"role": "system", "content": system}, {"role": "user", "content": f"Question: {q.question}"}]),
               answer)
    records = _run("rag", lm, retriever, [Q1, Q2], topk=3)
    assert lm.unmatched == []
    assert retriever.calls == [([Q1.question, Q2.question], 3)]
    assert [(r["answer"], r["searches"], r["doc_ids"]) for r in records] == [
        ("Paris", [Q1.question], [[f"{Q1.question}#{k}" for k in range(3)]]),
        ("in France", [Q2.question], [[f"{Q2.question}#{k}" for k in range(3)]])]
    assert [r["f1"] for r in records] == [1.0, pytest.approx(2 / 3)]  # "in France" vs "France": P 1/2, R 1

    lm = ScriptedLM(tokenizer)  # a failing retriever: no documents, an error counted, the run goes on
    failing = RecordingRetriever(fail_calls=(0,))
    system = ("Answer the question based on the given document. Only give me the answer and do not output any "
              "other words.\nThe following are given documents.\n\n")
    lm.add(lm.chat([{"role": "system", "content": system}, {"role": "user", "content": f"Question: {Q1.question}"}]),
           "Paris")
    (record,) = _run("rag", lm, failing, [Q1], topk=3)
    assert lm.unmatched == [] and record["answer"] == "Paris"
    assert record["flags"]["retrieval_errors"] == 1 and record["doc_ids"] == [[]]


def _hit(doc_id, title, text, score):
    from retrieval.corpus import Hit
    return Hit(id=doc_id, title=title, text=text, score=score)


def test_ircot_interleaves_thoughts_and_retrieval(tokenizer):
    lm = ScriptedLM(tokenizer)
    t1 = "Paris is the capital city of France."
    # The thought's retrieval returns a passage already seen (now with a better score) and a new one.
    table = {t1: [_hit(f"{Q1.question}#1", "T1 again", "better text", 20.0), _hit("new", "N", "n", 0.5)]}
    retriever = RecordingRetriever(table)
    head = P.IRCOT_INSTRUCTION + "\n\n" + P.IRCOT_EXAMPLE + "\n\n"
    assert P.IRCOT_INSTRUCTION.endswith('If you reach what you believe to be the final step, start with "So the '
                                        'answer is:".')
    assert P.IRCOT_EXAMPLE.endswith("Question: Are both Kurram Garhi and Trojkrsti located in the same country?\n"
                                    "Thought: Kurram Garhi is located in the country of Pakistan. Trojkrsti is located "
                                    "in the country of Republic of Macedonia. Thus, they are not in the same country. "
                                    "So the answer is: no.\n\n")

    def prompt(q, docs, thoughts=""):
        reference = "".join(f"Wikipedia Title: {title}\n{text}\n\n" for title, text in docs)
        return tokenizer.encode(head + f"{reference}Question: {q}\nThought:" + thoughts)

    q1_docs = [(f"T{k} {Q1.question}", f"text {k} about {Q1.question}") for k in range(2)]
    q2_docs = [(f"T{k} {Q2.question}", f"text {k} about {Q2.question}") for k in range(2)]
    lm.add(prompt(Q1.question, q1_docs), " " + t1 + "\nignored")  # the thought ends at the newline
    lm.add(prompt(Q2.question, q2_docs), " Lyon is in France, so the answer is: France\n")  # no marker (case)
    merged = [("T1 again", "better text"), q1_docs[0], ("N", "n")]  # best score first
    lm.add(prompt(Q1.question, merged, " " + t1), " So the answer is: Paris. Not read")  # ends at ". "
    q2_thought = "Lyon is in France, so the answer is: France"
    new_docs = [(f"T{k} {q2_thought}", f"text {k} about {q2_thought}") for k in range(2)]
    # Scores 10, 9 for both retrievals: a stable sort by score interleaves them.
    lm.add(prompt(Q2.question, [q2_docs[0], new_docs[0], q2_docs[1], new_docs[1]], " " + q2_thought),
           "\n")  # an empty last thought
    records = _run("ircot", lm, retriever, [Q1, Q2], topk=2, max_iterations=2)
    assert lm.unmatched == [] and lm.used == {0, 1, 2, 3}
    assert retriever.calls == [([Q1.question, Q2.question], 2), ([t1, q2_thought], 2)]
    assert records[0]["answer"] == "Paris" and records[0]["trajectory"] == t1 + " So the answer is: Paris."
    assert records[0]["searches"] == [Q1.question, t1] and records[0]["flags"]["num_turns"] == 2
    assert records[0]["doc_ids"] == [[f"{Q1.question}#0", f"{Q1.question}#1"], [f"{Q1.question}#1", "new"]]
    assert records[0]["flags"]["end_reason"] == "answer" and not records[0]["flags"]["forced_termination"]
    # No "So the answer is:" after max_iterations: FlashRAG's fallback, the joined thoughts, is the answer.
    assert records[1]["answer"] == q2_thought and records[1]["flags"]["forced_termination"]
    assert records[1]["flags"]["end_reason"] in ("eos", "turns") and records[1]["flags"]["num_turns"] == 2


def test_answer_and_reasoning_helpers():
    assert pipelines.boxed_answer("x \\boxed{1} then \\boxed{(Marie Curie)}") == "Marie Curie"
    assert pipelines.boxed_answer("\\boxed{\\text{Paris}}") == "Paris"
    assert pipelines.boxed_answer("no box") is None and pipelines.boxed_answer("\\boxed{}") is None
    assert pipelines.cut_thought(" It is 3.5 m tall. Next") == "It is 3.5 m tall."
    assert pipelines.cut_thought("a\nb. c") == "a"
    assert pipelines.final_information("x\n**Final Information**\n\nParis is\nthe capital.") == "Paris isthe capital."
    assert pipelines.final_information("Nothing here.") == "No helpful information found."
    assert pipelines.last_query("<|begin_search_query|> a <|end_search_query|> <|begin_search_query|> b "
                                "<|end_search_query|>") == "b"
    # Search-o1's step list: more than 5 steps keep the first, the search steps and the last 4, gaps as "...".
    text = "a\nb\n\nc\n<|begin_search_query|>q<|end_search_query|>\nd\ne\nf\ng"
    assert pipelines.reasoning_steps(text) == ("Step 1: a\n\n...\n\nStep 4: <|begin_search_query|>q<|end_search_query|>"
                                               "\n\n...\n\nStep 6: e\n\nStep 7: f\n\nStep 8: g")
    assert pipelines.reasoning_steps("a\nb") == "Step 1: a\n\nStep 2: b"


def test_search_o1_searches_reasons_in_documents_and_resumes(tokenizer):
    lm = ScriptedLM(tokenizer)
    retriever = RecordingRetriever()
    q3 = Prompt(uid="musique/3", question="Who?", golden_answers=("Nobody",), data_source="musique")
    single = P.SEARCH_O1_SINGLE_HOP.replace("{limit}", "2")
    multi = P.SEARCH_O1_MULTI_HOP.replace("{limit}", "2")
    assert "The maximum number of search attempts is limited to 2.\n\n" in single
    assert 'Question: "Who got the first Nobel Prize in Physics?"' in single
    assert 'Question: "Alice David is the voice of Lara Croft in a video game developed by which company?"' in multi
    cot = ("Please answer the following question. You should think step by step to solve it.\n\n"
           "Provide your final answer in the format \\boxed{YOUR_ANSWER}.\n\nQuestion:\n{q}\n\n")

    def main(head, q):
        return lm.chat([{"role": "user", "content": head + cot.replace("{q}", q.question)}])

    def query(q):
        return f"<|begin_search_query|>{q}<|end_search_query|>"

    def pages(q):
        return "".join(f"**Web Page {k + 1}:**\n" + json.dumps({"title": f"T{k} {q}", "text": f"text {k} about {q}"},
                                                               ensure_ascii=False, indent=2) + "\n" for k in range(2))

    def reason(steps, q, reply):
        text = P.REASON_IN_DOCUMENTS.format(prev_reasoning=steps, search_query=q, document=pages(q))
        assert text.startswith("**Task Instruction:**\n\nYou are tasked with reading and analyzing web pages")
        assert text.endswith(f'based on the current search query "{q}" and previous reasoning steps.\n')
        lm.add(lm.chat([{"role": "user", "content": text}]), reply)

    def result(info):
        return tokenizer.encode(f"\n\n<|begin_search_result|>{info}<|end_search_result|>\n\n")

    repeated = tokenizer.encode("\n<|begin_search_result|>\nYou have searched this query. Please refer to previous "
                                "results.\n<|end_search_result|>\n")
    limit = tokenizer.encode("\n<|begin_search_result|>\nThe maximum search limit is exceeded. You are not allowed "
                             "to search.\n<|end_search_result|>\n")
    # Q1 (single-hop): search, read, answer.
    t1 = "I need the capital.\n" + query("capital of France")
    lm.add(main(single, Q1), t1, result("Paris is thecapital."), "So \\boxed{Paris}")
    reason("Step 1: I need the capital.\n\nStep 2: " + query("capital of France"), "capital of France",
           "Reading.\n**Final Information**\n\nParis is the\ncapital.")
    # Q2 (multi-hop): search, repeat the query (refused), search again, a last-turn query (not executed).
    r2 = result("No helpful information found.")
    lm.add(main(multi, Q2), query("Lyon"), r2, query("Lyon"), repeated, query("Lyon city"), result("In France."),
           query("more"))
    reason("Step 1: " + query("Lyon"), "Lyon", "nothing useful")
    steps = pipelines.reasoning_steps(query("Lyon") + tokenizer.decode(r2) + query("Lyon") + tokenizer.decode(repeated)
                                      + query("Lyon city"))
    reason(steps, "Lyon city", "Found.\n**Final Information**\nIn France.")
    # Q3: two searches, then a third query is over the limit; then it stops without a box.
    lm.add(main(multi, q3), query("a"), result("A."), query("b"), result("B."), query("c"), limit, "I give up.")
    reason("Step 1: " + query("a"), "a", "\n**Final Information** A.")
    reason(pipelines.reasoning_steps(query("a") + tokenizer.decode(result("A.")) + query("b")), "b",
           "\n**Final Information** B.")
    records = _run("search_o1", lm, retriever, [Q1, Q2, q3], batch_size=3, topk=2, max_searches=2, max_turns=4,
                   max_new_tokens=48, max_info_tokens=64, reason_max_new_tokens=32)
    assert lm.unmatched == [] and lm.used == set(range(len(lm.scripts)))
    assert retriever.calls == [(["capital of France", "Lyon", "a"], 2), (["b"], 2), (["Lyon city"], 2)]
    assert [r["answer"] for r in records] == ["Paris", None, None]
    assert [r["searches"] for r in records] == [["capital of France"], ["Lyon", "Lyon city"], ["a", "b"]]
    assert [r["flags"]["num_turns"] for r in records] == [2, 4, 4]
    assert [r["flags"]["forced_termination"] for r in records] == [False, True, False]
    assert [r["flags"]["end_reason"] for r in records] == ["answer", "turns", "eos"]
    assert records[0]["em"] == 1.0 and records[0]["trajectory"].startswith(t1)

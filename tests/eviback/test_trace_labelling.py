"""Labelled traces from real rollouts (the rollout loop on a tiny model driven by a scripted policy, a fake
retriever, a byte-level tokenizer): all-zero groups only, evidence as the Actor saw it (checked against the text
the Actor was conditioned on), labels from the gold; then the gate's figures against scikit-learn and by hand."""

import numpy as np
import pytest

from retrieval.corpus import Hit
from searchjax.agent import protocol
from searchjax.agent.rollout import Prompt, RolloutConfig, rollout
from searchjax.eval.stage_a_harness import (INSUFFICIENT, SUFFICIENT, StageATrace, evaluate_policy,
                                            evaluate_single_prompt, evidence_has_gold, label_trajectories,
                                            read_traces_jsonl, write_traces_jsonl)
from searchjax.judges.openai_compat import OpenAICompatConfig, OpenAICompatJudge
from searchjax.judges.teacher_bundle import policy_from_prompts
from searchjax.judges.templates import load_prompt
from searchjax.judges.testing_server import serve_scripted
from searchjax.rewards.eviback import EvibackConfig

FILLER = " ".join(f"word{k}" for k in range(120))
HITS = {"visible": [Hit("v1", "Khartoum", "The Blue Nile meets the White Nile at Khartoum.", 1.0),
                    Hit("v2", "Sudan", "Sudan is a country in Africa.", 0.5)],
        "cut": [Hit("c1", "Rivers", f"{FILLER} The Blue Nile is the answer.", 1.0),
                Hit("c2", "Blue Nile dam", "A dam on the river.", 0.5)]}


class Retriever:
    def search(self, queries, topk):
        return [HITS[q][:topk] for q in queries]


@pytest.fixture(scope="module")
def policy(tiny_judge_model):
    """(model, params, tokenizer): the tiny random Qwen3 with its byte-level tokenizer (any text encodes)."""
    model, params, tok, _ = tiny_judge_model
    return model, params, tok


def _scripted(tok, prompts, texts, group):
    """logits_fn making row r write texts[r] and then EOS (the rollout appends the observations itself)."""
    import jax.numpy as jnp
    table = np.full((len(texts), 2048), tok.eos_token_ids[0], np.int32)
    for r, text in enumerate(texts):
        ids = tok.encode(protocol.build_prompt(prompts[r // group].question, tok)) + tok.encode(text)
        table[r, :len(ids)] = ids
    table = jnp.asarray(table)

    def logits_fn(tokens, lengths):
        rows = jnp.minimum(jnp.arange(tokens.shape[0]), table.shape[0] - 1)
        target = table[rows, jnp.minimum(lengths, table.shape[1] - 1)]
        return jnp.where(jnp.arange(tok.vocab_size)[None, :] == target[:, None], 0.0, -1e4).astype(jnp.float32)
    return logits_fn


def test_labels_from_a_real_rollout_with_truncated_observations(policy, tmp_path):
    model, params, tok = policy
    prompts = [Prompt("t/zero", "Which river meets the White Nile?", ("Blue Nile",)),
               Prompt("t/mixed", "Which river is blue?", ("Blue Nile",)),
               Prompt("t/none", "Which river is long?", ("Nile",))]
    texts = ["<search> visible </search>", "<search> cut </search>",        # all-zero, both searched
             "<answer> Blue Nile </answer>", "<search> visible </search>",   # mixed: an EM 1 rollout
             "<answer> Paris </answer>", "<answer> Rome </answer>"]          # all-zero, no search
    cfg = RolloutConfig(group_size=2, max_turns=1, max_new_tokens_per_turn=48, max_obs_tokens=200, topk=2,
                        max_cache_len=1024)
    trajectories = rollout(model, params, tok, Retriever(), prompts, cfg, seed=0,
                           logits_fn=_scripted(tok, prompts, texts, 2))
    assert [t.num_searches for t in trajectories] == [1, 1, 0, 1, 0, 0], [t.response_text[:80] for t in trajectories]
    assert trajectories[1].truncated_observations == 1
    traces, counts = label_trajectories(trajectories, tok, max_passages=3, passage_chars=1000)
    assert counts == {"trajectories": 6, "groups": 3, "all_zero_groups": 2, "all_zero_trajectories": 4,
                      "no_visible_evidence": 2, "traces": 2, "sufficient": 1}
    seen, cut = traces
    assert (seen.uid, seen.label, cut.uid, cut.label) == ("t/zero#0", SUFFICIENT, "t/zero#1", INSUFFICIENT)
    # What the Actor saw is exactly the text it was conditioned on.
    assert [h.text for h in seen.hits] == [h.text for h in HITS["visible"]]
    assert all(f"(Title: \"{h.title}\") {h.text}" in trajectories[0].response_text for h in seen.hits)
    [first] = cut.hits  # the second passage's title line was cut off with the rest of the observation
    full = HITS["cut"][0].text
    assert 0 < len(first.text) < len(full) and full.startswith(first.text)
    assert first.text in trajectories[1].response_text and full[:len(first.text) + 1] not in trajectories[1].response_text
    assert "Blue Nile" in full and "Blue Nile" not in first.text and "Blue Nile dam" not in trajectories[1].response_text
    assert seen.answer == cut.answer == ""  # the scripted rollouts stopped without answering
    write_traces_jsonl(traces, tmp_path / "t.jsonl")
    assert read_traces_jsonl(tmp_path / "t.jsonl") == traces


def test_evidence_has_gold_uses_the_qa_normaliser():
    hit = Hit("1", "The Nile", "The Blue-Nile's source is Lake Tana.", 0.0)
    assert not evidence_has_gold([hit], ["Blue Nile"])  # "bluenile" after dropping punctuation
    assert evidence_has_gold([hit], ["Lake Tana."]) and evidence_has_gold([hit], ["the nile"])
    assert not evidence_has_gold([hit], ["Tan"]) and not evidence_has_gold([hit], ["the"])


def _traces():
    out = []
    for i, (label, answer) in enumerate([(SUFFICIENT, "Paris")] * 5 + [(INSUFFICIENT, "")] * 5 + [(SUFFICIENT, "")] * 2):
        text = f"Item {i} was made in Lyon." if label == SUFFICIENT else f"Item {i} is in a museum."
        out.append(StageATrace(f"q{i}", f"Where was item {i} made?", (Hit(str(i), f"Item {i}", text, 0.0),),
                               ("Lyon",), answer, label))
    return out


def teacher(body):
    """Stage A: Insufficient for items 0 and 5-8 (item 0 wrongly, item 9 missed), else Supported; answers: "Lyon" for even items,
    "Lyon city" (no match) for odd ones; the single prompts answer the same way."""
    user = body["messages"][1]["content"]
    i = int(user.split("Where was item ")[1].split(" ")[0])
    verdict = "Insufficient" if i in (0, 5, 6, 7, 8) else "Supported"
    answer = "Lyon" if i % 2 == 0 else "Lyon city"
    if "auditor and answer writer" in body["messages"][0]["content"]:
        return '{"verdict": "%s", "answer": "%s"}' % (verdict, answer)
    if "evidence auditor" in body["messages"][0]["content"]:
        return '{"verdict": "%s"}' % verdict
    return '{"answer": "%s"}' % (answer if "was made in" in user else "N/A")


def test_gate_figures_match_sklearn_and_our_coverage_by_hand():
    from sklearn.metrics import precision_recall_fscore_support
    traces = _traces()
    cfg = EvibackConfig(stage_b_mode="refine", stage_b_prompt="eviback_stage_b_refine.v1")
    with serve_scripted(teacher) as server:
        judge = OpenAICompatJudge(OpenAICompatConfig(base_url=server.base_url, model="m", api_key_env=""))
        policy = policy_from_prompts("eviback_stage_a.v1", "eviback_stage_b_refine.v1", mode="refine")
        two_stage = evaluate_policy(traces, judge, policy, cfg, repeats=2)
        single = evaluate_single_prompt(traces, judge, load_prompt("eviback_single_gold.v1"), cfg)
        grade = evaluate_policy(traces, judge, policy_from_prompts("eviback_stage_a.v1", "eviback_stage_b.v1"), cfg)
    y_true = [t.label == INSUFFICIENT for t in traces]
    y_pred = [i in (0, 5, 6, 7, 8) for i in range(12)]
    p, r, f1, _ = precision_recall_fscore_support(y_true, y_pred, average="binary")
    for result in (two_stage, single):
        m = result["metrics"]
        assert (m["insufficient_precision"], m["insufficient_recall"]) == pytest.approx((p, r))
        assert m["insufficient_f1"] == pytest.approx(f1)
        # Gold in evidence: items 0-4, 10, 11 (7). Covered: passed the gate (not 0) and answered "Lyon" (even):
        # items 2, 4, 10 -> 3 / 7.
        assert m["gold_in_evidence"] == 7 and m["gold_coverage"] == pytest.approx(3 / 7)
    assert two_stage["metrics"]["stability"] == 1.0 and two_stage["metrics"]["parse_failure_rate"] == 0.0
    assert two_stage["metrics"]["traces"] == 12 and two_stage["metrics"]["tokens_per_trace"] > 0
    assert grade["metrics"]["gold_coverage"] is None  # a grading Teacher writes no answer
    with pytest.raises(ValueError, match="matches a gold"):
        evaluate_policy([StageATrace("x", "q?", traces[0].hits, ("Lyon",), "lyon", SUFFICIENT)], None, policy, cfg)

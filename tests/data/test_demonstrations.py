"""SFT demonstrations (searchjax.data.demonstrations) on real default-QA train questions, the default BM25 index and
SmolLM2's tokenizer: tag structure, masks, observations identical to the rollout's (by its formatter, and by
replaying each demonstration through `rollout` itself), the jsonl round trip through load_demonstrations, the
keep rule on a fake retriever with hand-computed outcomes, and the tokenizer-mismatch errors."""

import json
import re

import jax.numpy as jnp
import numpy as np
import pytest

from retrieval.corpus import Hit
from searchjax.agent import protocol
from searchjax.agent.rollout import Prompt, RolloutConfig, rollout
from searchjax.data import default_qa, demonstrations
from searchjax.rewards.qa import normalize_answer

# the quickstart's observation settings: 2 passages cut to 96 tokens, 48-token turns, 2 searching turns
CFG = RolloutConfig(group_size=1, max_turns=2, max_new_tokens_per_turn=48, max_obs_tokens=96, topk=2,
                    temperature=1.0, max_cache_len=768)


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf_path):
    from searchjax.tokenization import load_tokenizer
    return load_tokenizer(smollm2_gguf_path)


@pytest.fixture(scope="module")
def retriever():
    from retrieval.index import default_index
    return default_index("bm25")


@pytest.fixture(scope="module")
def rows():
    train = default_qa.default_qa_split("train")
    return [r for r in train if r["hops"] == 1][:16] + [r for r in train if r["hops"] == 2][:6]


@pytest.fixture(scope="module")
def built(rows, tokenizer, retriever):
    return demonstrations.build_demonstrations(rows, tokenizer, retriever, CFG)


def _runs(mask):
    """(value, start, end) of each maximal run of equal mask values."""
    edges = [0] + [i for i in range(1, len(mask)) if mask[i] != mask[i - 1]] + [len(mask)]
    return [(mask[a], a, b) for a, b in zip(edges, edges[1:])]


def test_yield_and_tag_structure(built, rows, tokenizer):
    assert sum(built.reasons.values()) == len(rows)
    assert built.reasons["kept"] == len(built.records) >= 12
    assert any(len(r["queries"]) == 2 for r in built.records)  # a two-hop demonstration survived
    for r in built.records:
        runs = _runs(r["loss_mask"])
        policy = [tokenizer.decode(r["response_ids"][a:b]) for v, a, b in runs if v == 1]
        observations = [tokenizer.decode(r["response_ids"][a:b]) for v, a, b in runs if v == 0]
        assert [v for v, _, _ in runs] == [1, 0] * len(r["queries"]) + [1]
        for turn, query in zip(policy, r["queries"]):
            m = re.fullmatch(r"<think> [^<]+ </think>\n<search> (.+) </search>", turn)
            assert m and m.group(1) == query, turn
        m = re.fullmatch(r"<think> [^<]+ </think>\n<answer> (.+) </answer>", policy[-1])
        assert m and m.group(1) == r["answer"] and r["answer"] in r["golden_answers"], policy[-1]
        for obs in observations:
            assert obs.startswith("\n\n<information>Doc 1(Title: ") and obs.endswith("</information>\n\n")
        # kept only when the answer is in what the policy reads
        assert f" {normalize_answer(r['answer'])} " in f" {normalize_answer(observations[-1])} "
        assert r["queries"][-1] == r["question"] or len(r["queries"]) == 2


def test_information_block_is_the_protocols_for_the_same_hits(rows, tokenizer, retriever):
    cfg = RolloutConfig(max_turns=2, max_new_tokens_per_turn=48, max_obs_tokens=4096, topk=2)  # nothing truncated
    records = demonstrations.build_demonstrations(rows, tokenizer, retriever, cfg).records
    assert len(records) >= 12
    for r in records:
        observations = [r["response_ids"][a:b] for v, a, b in _runs(r["loss_mask"]) if v == 0]
        for query, obs_ids, doc_ids in zip(r["queries"], observations, r["doc_ids"]):
            hits = retriever.search([query], 2)[0]
            assert [h.id for h in hits] == doc_ids
            assert obs_ids == tokenizer.encode(protocol.search_observation(hits))


def test_replaying_a_demonstration_through_the_rollout_gives_the_same_trajectory(built, tokenizer, retriever):
    """A policy forced to emit each demonstration's sequence, run by `rollout` with the same retriever: the rollout
    appends its own observations, so the sequences stay in step only if the demonstration's are the rollout's."""
    records = built.records
    sequences = [r["prompt_ids"] + r["response_ids"] for r in records]
    eos = tokenizer.eos_token_ids[0]
    table = np.full((len(sequences), CFG.max_cache_len), eos, np.int32)
    for i, seq in enumerate(sequences):
        table[i, :len(seq)] = seq
    table = jnp.asarray(table)

    def logits_fn(tokens, lengths):  # all mass on the scripted next token of each row
        row = jnp.minimum(jnp.arange(tokens.shape[0]), table.shape[0] - 1)
        target = table[row, jnp.minimum(lengths, table.shape[1] - 1)]
        return jnp.where(jnp.arange(tokenizer.vocab_size)[None] == target[:, None], 0.0, -1e4)

    prompts = [Prompt(uid=f"default_qa/{r['id']}", question=r["question"], golden_answers=tuple(r["golden_answers"]))
               for r in records]
    trajectories = rollout(None, None, tokenizer, retriever, prompts, CFG, seed=0, logits_fn=logits_fn)
    for r, t in zip(records, trajectories):
        assert t.prompt_ids == r["prompt_ids"]
        assert t.response_ids == r["response_ids"]
        assert t.loss_mask == r["loss_mask"]
        assert t.queries == r["queries"] and t.answer == r["answer"] and t.end_reason == "answer"


def test_round_trip_through_load_demonstrations(built, tokenizer, tmp_path):
    from searchjax.rl.sft import load_demonstrations
    path = demonstrations.write_demonstrations(built.records, tmp_path / "demos.jsonl")
    loaded = load_demonstrations(path)
    assert [(list(d.prompt_ids), list(d.response_ids), list(d.loss_mask)) for d in loaded] == \
        [(r["prompt_ids"], r["response_ids"], r["loss_mask"]) for r in built.records]
    assert demonstrations.check_demonstrations(path, tokenizer) == len(built.records)


# ------------------------------------------------------------------------------------ the keep rule, by hand

class _TableRetriever:
    """Hits by query from a dict; queries it does not know get one unrelated passage."""

    def __init__(self, table):
        self.table = table

    def search(self, queries, topk):
        return [[Hit(id=f"{q}#{k}", title=t, text=x, score=1.0) for k, (t, x) in enumerate(self.table.get(
            q, [("Elsewhere", "Nothing relevant here.")])[:topk])] for q in queries]


def test_keep_rule_and_drop_reasons(tokenizer):
    table = {
        "Who wrote The Long Road?": [("Road", "A road is a way."), ("The Long Road", "A 1920 novel by Jane Doe.")],
        "Where was Jane Doe born?": [("Jane Doe", "Jane Doe was born in Bristol.")],
    }
    rows = [
        {"id": "a", "question": "Who wrote The Long Road?", "golden_answers": ["Jane Doe"], "hops": 1},
        {"id": "b", "question": "Who wrote Another Book?", "golden_answers": ["Joe Bloggs"], "hops": 1},
        {"id": "c", "question": "Where was the author of The Long Road born?", "golden_answers": ["Bristol"], "hops": 2,
         "metadata": {"bridge": {"question": "Who wrote The Long Road?", "answer": "Jane Doe", "title": "Jane Doe",
                                 "second_question": "Where was Jane Doe born?"}}},
        {"id": "d", "question": "Where was the author of Another Book born?", "golden_answers": ["Bristol"],
         "hops": 2, "metadata": {"bridge": {"question": "Who wrote Another Book?", "answer": "Joe Bloggs",
                                            "title": "Joe Bloggs", "second_question": "Where was Jane Doe born?"}}},
        {"id": "e", "question": "Who wrote " + "a very long title " * 12 + "?", "golden_answers": ["x"], "hops": 1},
    ]
    cfg = RolloutConfig(max_turns=2, max_new_tokens_per_turn=48, max_obs_tokens=256, topk=2)
    out = demonstrations.build_demonstrations(rows, tokenizer, _TableRetriever(table), cfg)
    assert dict(out.reasons) == {"kept": 2, "answer_not_retrieved": 1, "bridge_not_retrieved": 1, "turn_too_long": 1}
    first, second = out.records
    text = tokenizer.decode(first["response_ids"])
    assert text.endswith("<think> Doc 2 gives the answer. </think>\n<answer> Jane Doe </answer>")  # Doc 1 lacks it
    text = tokenizer.decode(second["response_ids"])
    assert "<think> Doc 2 gives Jane Doe. </think>\n<search> Where was Jane Doe born? </search>" in text
    assert text.endswith("<think> Doc 1 gives the answer. </think>\n<answer> Bristol </answer>")
    one_turn = RolloutConfig(max_turns=1, max_new_tokens_per_turn=48, max_obs_tokens=256, topk=2)
    out = demonstrations.build_demonstrations(rows[2:3], tokenizer, _TableRetriever(table), one_turn)
    assert dict(out.reasons) == {"more_hops_than_max_turns": 1}


# ----------------------------------------------------------------------------------- tokenizer mismatch

@pytest.fixture(scope="module")
def tiny_tokenizer():
    from tiny_bpe import tiny_bpe
    from searchjax.tokenization import Tokenizer
    template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"
    hf = tiny_bpe(["Answer the given question.", "Who wrote the book?", "<search> query </search>"],
                  vocab_size=300, chat_template=template)
    return Tokenizer(hf, source="tiny")


def test_a_demonstration_made_with_another_tokenizer_names_file_and_line(built, tokenizer, tiny_tokenizer, tmp_path):
    path = demonstrations.write_demonstrations(built.records[:3], tmp_path / "demos.jsonl")
    with pytest.raises(ValueError, match=rf"{path}:1: made with another tokenizer"):
        demonstrations.check_demonstrations(path, tiny_tokenizer)
    # rows without a fingerprint (the loop's trajectory dumps): the ids themselves give it away
    bare = [{k: r[k] for k in ("prompt_ids", "response_ids", "loss_mask")} for r in built.records[:3]]
    path.write_text("".join(json.dumps(r) + "\n" for r in bare))
    with pytest.raises(ValueError, match=rf"{path}:1: token id \d+ is outside the policy tokenizer's vocabulary"):
        demonstrations.check_demonstrations(path, tiny_tokenizer)
    assert demonstrations.check_demonstrations(path, tokenizer) == 3
    # line 2 holds another question's prompt under its own question: wrong for this policy too
    rows = [dict(r) for r in built.records[:3]]
    rows[1]["prompt_ids"] = rows[0]["prompt_ids"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=rf"{path}:2: prompt_ids are not the policy tokenizer's prompt"):
        demonstrations.check_demonstrations(path, tokenizer)

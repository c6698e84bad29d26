"""The rollout benchmark's scripted policy (searchjax/bench/rollout.py) at small budgets: each turn is exactly
its budget and ends in the action the script means, and the real rollout driven through the logits processor
(the model's own logits + a bias) reproduces every row's scripted stream, observations included."""

import pytest

from searchjax.bench import rollout as bench


@pytest.fixture
def small_budgets(monkeypatch):
    for name, value in {"TURN_TOKENS": 48, "TURNS": 2, "OBS_TOKENS": 64, "GROUP": 2, "CACHE_LEN": 1024}.items():
        monkeypatch.setattr(bench, name, value)


def test_the_scripted_rollout_follows_its_script(rollout_tokenizer, tiny_policy, small_budgets):
    from retrieval.bm25 import BM25Index
    from retrieval.client import InProcessRetriever
    from retrieval.corpus import default_corpus
    from searchjax.agent import protocol
    from searchjax.agent.rollout import END_ANSWER, rollout
    from searchjax.data.qa_datasets import default_prompts
    tokenizer = rollout_tokenizer
    passages = default_corpus()[:300]
    retriever = InProcessRetriever(BM25Index.build(passages))
    prompts = default_prompts()[:2]
    script = bench.script(tokenizer, retriever, prompts, passages)
    rows = len(prompts) * bench.GROUP
    assert len(script.turns) == rows
    for r in range(rows):
        assert [len(t) for t in script.turns[r]] == [48, 48, 48]
        texts = [tokenizer.decode(t) for t in script.turns[r]]
        assert all(text.endswith("</search>") for text in texts[:2]) and texts[2].endswith("</answer>")
        assert protocol.parse_action(texts[2]) == protocol.Action("answer", prompts[r // 2].golden_answers[0])
        assert all(len(o) <= 64 for o in script.observations[r])

    model, params = tiny_policy
    table = bench.stream_table(script, bench.CACHE_LEN)
    trajectories = rollout(model, params, tokenizer, retriever, prompts, bench.rollout_config(), seed=0,
                           logits_processor=bench.forcing_processor(table))
    for r, t in enumerate(trajectories):
        assert t.response_ids == script.response(r)
        assert t.end_reason == END_ANSWER and t.num_turns == 3 and t.num_searches == 2
        assert t.queries == [protocol.parse_action(tokenizer.decode(turn)).content for turn in script.turns[r][:2]]
        observed = [i for i, m in enumerate(t.loss_mask) if m == 0]
        assert len(observed) == sum(len(o) for o in script.observations[r])  # observations: the only masked tokens

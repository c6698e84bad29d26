"""The rollout loop driven by scripted policies (a logits_fn forcing known outputs) on a tiny random model.

Expected values are written out by hand from the scripts: which turns search, what the retriever is asked,
which tokens are observations, and the metrics of docs/architecture.md of the batch.
"""

import dataclasses
import logging

import numpy as np
import pytest

from rollout_scripts import (CountingRetriever, OBS, expected_mask, fake_hits, gen, mask_runs, obs,
                             scripted_logits_fn, search_obs, sequence)
from retrieval.corpus import Hit
from searchjax.agent import protocol
from searchjax.agent.rollout import (RETRIEVAL_ERROR_OBSERVATION, TRUNCATION_MARKER, Prompt, RolloutConfig,
                                     rollout)
from searchjax.eval.metrics import trajectory_metrics
from searchjax.rewards.qa import extract_answer

PROMPTS = (Prompt(uid="nq/1", question="What is the capital of France", golden_answers=("Paris",), data_source="nq"),
           Prompt(uid="hotpotqa/1", question="What is six times seven?", golden_answers=("42",),
                  data_source="hotpotqa"))


def _prompt_ids(tok, prompt):
    return tok.encode(protocol.build_prompt(prompt.question, tok))


def _run(tiny_policy, tok, prompts, scripts, cfg, retriever, seed=0):
    """Roll out with row r forced to follow scripts[r] (prompt-major rows, group_size per prompt)."""
    model, params = tiny_policy
    rows = [_prompt_ids(tok, p) for p in prompts for _ in range(cfg.group_size)]
    fn = scripted_logits_fn([sequence(ids, segs) for ids, segs in zip(rows, scripts)], tok.eos_token_ids[0],
                            tok.vocab_size)
    return rollout(model, params, tok, retriever, list(prompts), cfg, seed=seed, logits_fn=fn)


def _check_tokens(tok, trajectory, segments):
    """Token ids, loss mask, log-probs and text against the hand-written segments."""
    assert trajectory.response_ids == [t for s in segments for t in s.ids]
    assert trajectory.loss_mask == expected_mask(segments)
    logprobs = np.asarray(trajectory.sampler_logprobs)
    mask = np.asarray(trajectory.loss_mask, bool)
    assert np.all(logprobs[~mask] == 0.0)
    np.testing.assert_allclose(logprobs[mask], 0.0, atol=1e-6)  # every generated token had all the mass
    # No re-tokenisation drift: the recorded ids decode to the segments' texts, observations verbatim.
    assert trajectory.response_text == tok.decode(trajectory.response_ids) == "".join(s.text for s in segments)
    for s in segments:
        if s.kind == OBS:
            assert tok.decode(s.ids) == s.text


def test_scripted_batch_tokens_retriever_calls_and_metrics(tiny_policy, rollout_tokenizer):
    tok = rollout_tokenizer
    cfg = RolloutConfig(group_size=2, max_turns=2, max_new_tokens_per_turn=24, max_obs_tokens=128, topk=2,
                        temperature=1.0, max_cache_len=768)
    long_text = "Let me think about this question step by step, carefully and at length, " * 3
    scripts = [
        # prompt 0, sample 0: search, read, answer.
        [gen(tok, "<think>I need to look this up.</think><search> capital of France </search>"),
         search_obs(tok, "capital of France", 2),
         gen(tok, "<think>Found it.</think><answer> Paris </answer>")],
        # prompt 0, sample 1: searches in both searching turns (the second a duplicate after normalisation),
        # then searches again in the final turn: not executed, forced termination, no answer.
        [gen(tok, "<search> Eiffel Tower </search>"), search_obs(tok, "Eiffel Tower", 2),
         gen(tok, "<think>again</think><search>the Eiffel tower!</search>"), search_obs(tok, "the Eiffel tower!", 2),
         gen(tok, "<search> one more </search>")],
        # prompt 1, sample 0: a turn cut by the token budget (invalid), an empty query (invalid), then the
        # final turn answers: forced (it used both searching turns) but valid.
        [gen(tok, long_text, budget=24), obs(tok, protocol.INVALID_ACTION_OBSERVATION),
         gen(tok, "<search>   </search>"), obs(tok, protocol.INVALID_ACTION_OBSERVATION),
         gen(tok, "<answer> 42 </answer>")],
        # prompt 1, sample 1: plain text then EOS: the trajectory ends there, without an answer.
        [gen(tok, "The answer is 42.", eos=True)],
    ]
    retriever = CountingRetriever()
    trajectories = _run(tiny_policy, tok, PROMPTS, scripts, cfg, retriever)

    assert [(t.prompt.uid, t.sample_index) for t in trajectories] == [
        ("nq/1", 0), ("nq/1", 1), ("hotpotqa/1", 0), ("hotpotqa/1", 1)]
    for t, segments in zip(trajectories, scripts):
        assert t.prompt_ids == _prompt_ids(tok, t.prompt)
        _check_tokens(tok, t, segments)
    # One retriever call per turn with every searching row's query, in row order; none in the final turn.
    assert retriever.calls == [(["capital of France", "Eiffel Tower"], 2), (["the Eiffel tower!"], 2)]

    fields = ("queries", "answer", "num_searches", "duplicate_queries", "forced_termination", "valid_answer",
              "end_reason", "num_turns", "invalid_actions", "retrieval_errors")
    expected = [
        (["capital of France"], "Paris", 1, 0, False, True, "answer", 2, 0, 0),
        (["Eiffel Tower", "the Eiffel tower!"], None, 2, 1, True, False, "turns", 3, 0, 0),
        ([], "42", 0, 0, True, True, "answer", 3, 2, 0),
        ([], None, 0, 0, False, False, "eos", 1, 0, 0),
    ]
    for t, values in zip(trajectories, expected):
        assert tuple(getattr(t, f) for f in fields) == values
    assert trajectories[0].doc_ids == [["capital of France#0", "capital of France#1"]]
    assert trajectories[1].doc_ids == [[f"Eiffel Tower#{k}" for k in range(2)],
                                       [f"the Eiffel tower!#{k}" for k in range(2)]]
    assert trajectories[1].retrieved[1] == fake_hits("the Eiffel tower!", 2)
    for t in trajectories:  # the answer is extract_answer of the response whenever the loop saw one
        assert t.answer == (extract_answer(t.response_text) if t.end_reason == "answer" else None)

    # Batch metrics by hand: searches 1 + 2 + 0 + 0 = 3 over 4 trajectories, 1 duplicate of 3 searches,
    # valid answers in rows 0 and 2, forced terminations in rows 1 and 2.
    metrics = trajectory_metrics(trajectories)
    assert metrics["search/mean"] == 0.75
    assert metrics["search/duplicate_rate"] == pytest.approx(1 / 3)
    assert metrics["answer/valid_rate"] == 0.5
    assert metrics["termination/forced_rate"] == 0.5


def test_observation_truncation_keeps_wrapper_and_whole_characters(tiny_policy, rollout_tokenizer):
    tok = rollout_tokenizer
    budget = 40
    cfg = RolloutConfig(group_size=4, max_turns=1, max_new_tokens_per_turn=16, max_obs_tokens=budget, topk=2,
                        temperature=0.0, max_cache_len=512)

    def long_hits(query, topk):  # multi-byte text, so cuts often fall inside a character's bytes
        body = {"a": "東京 São Paulo — Zürich ", "b": "😀 Ελληνικά ", "c": "plain words here ", "d": "ü"}[query[0]]
        return [Hit(id=f"{query}{k}", title=f"T{k}", text=body * 40, score=1.0)
                for k in range(topk)]

    scripts = [[gen(tok, f"<search>{q} query</search>")] for q in "abc"]
    # Row 3: no action within the budget -> the invalid-action observation, cut to the budget with the marker.
    scripts.append([gen(tok, "words " * 30, budget=16)])
    retriever = CountingRetriever(hits_fn=long_hits)
    trajectories = _run(tiny_policy, tok, (PROMPTS[0],), scripts, cfg, retriever)
    head, tail = protocol.information_block("\0").split("\0")
    assert retriever.calls == [(["a query", "b query", "c query"], 2)]
    for t in trajectories:
        runs = mask_runs(t.loss_mask)
        assert [v for v, _, _ in runs] == [1, 0, 1]  # generated, observation, final turn (EOS)
        _, start, end = runs[1]
        assert end - start <= budget
        text = tok.decode(t.response_ids[start:end])
        assert "\ufffd" not in text and t.truncated_observations == 1
        if t.queries:
            full = protocol.search_observation(long_hits(t.queries[0], 2))
            assert text.startswith(head) and text.endswith(TRUNCATION_MARKER + tail)
            body = text[len(head):-len(TRUNCATION_MARKER + tail)]
            assert len(body) > 20 and full[len(head):].startswith(body)
        else:
            assert text.endswith(TRUNCATION_MARKER)
            assert protocol.INVALID_ACTION_OBSERVATION.startswith(text[:-len(TRUNCATION_MARKER)])
        assert t.end_reason == "eos" and t.forced_termination  # the script runs out: EOS in the final turn


def test_retriever_failure_gets_error_observation_and_loop_continues(tiny_policy, rollout_tokenizer, caplog):
    tok = rollout_tokenizer
    cfg = RolloutConfig(group_size=2, max_turns=3, max_new_tokens_per_turn=24, max_obs_tokens=128, topk=1,
                        temperature=0.0, max_cache_len=1024)
    error = obs(tok, RETRIEVAL_ERROR_OBSERVATION)
    scripts = [
        # Turn 0: the call raises; turn 1: the call returns one list too few (also a failure); turn 2 works.
        [gen(tok, "<search> first </search>"), error, gen(tok, "<search> second </search>"), error,
         gen(tok, "<search> third </search>"), search_obs(tok, "third", 1), gen(tok, "<answer> done </answer>")],
        [gen(tok, "<search> other </search>"), error, gen(tok, "<answer> early </answer>")],
    ]
    retriever = CountingRetriever(fail_calls={0}, short_calls={1})
    with caplog.at_level(logging.WARNING, logger="searchjax.agent.rollout"):
        first, second = _run(tiny_policy, tok, (PROMPTS[0],), scripts, cfg, retriever)
    assert retriever.calls == [(["first", "other"], 1), (["second"], 1), (["third"], 1)]
    _check_tokens(tok, first, scripts[0])
    _check_tokens(tok, second, scripts[1])
    assert (first.queries, first.doc_ids, first.retrieval_errors, first.num_searches, first.answer) == (
        ["first", "second", "third"], [[], [], ["third#0"]], 2, 3, "done")
    assert (second.retrieval_errors, second.num_searches, second.answer) == (1, 1, "early")
    assert sum("retriever failed" in r.getMessage() for r in caplog.records) == 2


def test_single_turn_without_search(tiny_policy, rollout_tokenizer):
    tok = rollout_tokenizer
    cfg = RolloutConfig(group_size=1, max_turns=3, max_new_tokens_per_turn=32, max_obs_tokens=64, topk=1,
                        temperature=0.0, max_cache_len=320, search=False)
    scripts = [[gen(tok, "<search> q </search> so <answer> y </answer>")], [gen(tok, "<search> q </search> no")]]
    retriever = CountingRetriever()
    a, b = _run(tiny_policy, tok, PROMPTS, scripts, cfg, retriever)
    assert retriever.calls == []
    # The turn stops only at </answer> (or EOS: row b runs out of script), one turn each, nothing appended.
    _check_tokens(tok, a, scripts[0])
    assert (a.answer, a.num_turns, a.end_reason, a.forced_termination, a.queries) == ("y", 1, "answer", False, [])
    assert b.response_ids == scripts[1][0].ids + [tok.eos_token_ids[0]] and set(b.loss_mask) == {1}
    assert (b.answer, b.end_reason, b.forced_termination, b.valid_answer) == (None, "eos", False, False)


def test_bad_configurations_raise_clear_errors(tiny_policy, rollout_tokenizer):
    model, params = tiny_policy
    tok = rollout_tokenizer
    ok = RolloutConfig(group_size=1, max_turns=1, max_new_tokens_per_turn=8, max_obs_tokens=32, topk=1,
                       max_cache_len=512)
    with pytest.raises(ValueError, match="share uid 'nq/1'"):
        rollout(model, params, tok, CountingRetriever(), [PROMPTS[0], PROMPTS[0]], ok, seed=0)
    small = dataclasses.replace(ok, max_cache_len=300)
    # 256 (padded prompt) + 2 turns x 8 + one 32-slot append block = 304 slots.
    with pytest.raises(ValueError, match="max_cache_len >= 304"):
        rollout(model, params, tok, CountingRetriever(), [PROMPTS[0]], small, seed=0)
    tiny_obs = dataclasses.replace(ok, max_obs_tokens=5)
    with pytest.raises(ValueError, match="max_obs_tokens=5"):
        rollout(model, params, tok, CountingRetriever(), [PROMPTS[0]], tiny_obs, seed=0)

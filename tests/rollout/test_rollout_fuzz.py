"""Fuzz: 256 random and malformed model outputs forced through the rollout loop (tiny model, scripted logits).

Outputs: unclosed, nested and stray tags, an answer before a search, empty queries, outputs far over the
turn budget, random token ids (special tokens, lone UTF-8 continuation bytes), EOS in the middle. The loop
must not raise, and every trajectory must stay self-consistent.
"""

import numpy as np

from rollout_scripts import CountingRetriever, fake_hits, mask_runs, scripted_logits_fn
from searchjax.agent import protocol
from searchjax.agent.rollout import RETRIEVAL_ERROR_OBSERVATION, TRUNCATION_MARKER, Prompt, RolloutConfig, rollout
from searchjax.eval.metrics import trajectory_metrics
from searchjax.rewards.qa import extract_answer

FRAGMENTS = ["<search>", "</search>", "<answer>", "</answer>", "<think>", "</think>", "<information>",
             "</information>", "<search", "answer>", "</", "<", ">", " ", "\n", "query", "Paris", " 42 ", "é", "😀",
             "東京", "<|im_end|>", "<|im_start|>", "search", "\ufffd"]
TEMPLATES = ["<answer>x</answer><search>y</search>", "<search><search>a</search></search>", "<search></search>",
             "<search> \n </search>", "<answer><search>q</search></answer>", "<answer>a<answer>b</answer></answer>",
             "<search>unclosed query", "<answer>unclosed", "</answer>", "a" * 3000, "<answer> </answer>"]


def _random_response(rng, tok, byte_tokens) -> list[int]:
    """About 400 tokens of one malformed kind (the row's whole response script)."""
    kind = rng.integers(5)
    if kind == 0:  # uniformly random ids: special tokens, byte pieces, anything
        return rng.integers(0, tok.vocab_size, 400).tolist()
    if kind == 1:  # lone bytes >= 0x80: invalid UTF-8 when decoded
        return rng.choice(byte_tokens, 400).tolist()
    if kind == 2:  # a soup of tag fragments
        return tok.encode("".join(rng.choice(FRAGMENTS, 200)))[:400]
    if kind == 3:  # malformed templates, concatenated
        return tok.encode("".join(rng.choice(TEMPLATES, 12)))[:400]
    ids = tok.encode("".join(rng.choice(FRAGMENTS, 160)))[:400]  # fragments with EOS inserted
    ids.insert(int(rng.integers(len(ids) + 1)), tok.eos_token_ids[0])
    return ids


def test_rollout_survives_malformed_outputs(tiny_policy, rollout_tokenizer):
    model, params = tiny_policy
    tok = rollout_tokenizer
    rng = np.random.default_rng(0)
    byte_tokens = [i for i in range(tok.vocab_size) if len(tok.token_bytes(i)) == 1 and tok.token_bytes(i)[0] >= 0x80]
    assert len(byte_tokens) >= 64
    prompts = [Prompt(uid=f"fuzz/{i}", question=f"Question {i}", golden_answers=("x",)) for i in range(64)]
    cfg = RolloutConfig(group_size=4, max_turns=2, max_new_tokens_per_turn=32, max_obs_tokens=64, topk=1,
                        temperature=0.0, max_cache_len=512)
    scripts = []
    for p in prompts:
        prompt_ids = tok.encode(protocol.build_prompt(p.question, tok))
        scripts += [prompt_ids + _random_response(rng, tok, byte_tokens) for _ in range(cfg.group_size)]
    # Long hits, so that observations of long queries get truncated; the second searching turn's call fails.
    retriever = CountingRetriever(hits_fn=lambda q, k: fake_hits(q, k, words=12), fail_calls={1})
    fn = scripted_logits_fn(scripts, tok.eos_token_ids[0], tok.vocab_size)
    trajectories = rollout(model, params, tok, retriever, prompts, cfg, seed=0, logits_fn=fn)

    assert len(trajectories) == 256
    assert len(retriever.calls) <= cfg.max_turns
    assert sum(len(q) for q, _ in retriever.calls) == sum(t.num_searches for t in trajectories)
    head = protocol.information_block("\0").split("\0")[0]
    kinds = set()
    for t in trajectories:
        n = len(t.response_ids)
        assert len(t.loss_mask) == len(t.sampler_logprobs) == n > 0
        assert t.response_text == tok.decode(t.response_ids)
        runs = mask_runs(t.loss_mask)
        generated = [(s, e) for v, s, e in runs if v == 1]
        observations = [tok.decode(t.response_ids[s:e]) for v, s, e in runs if v == 0]
        assert runs[0][0] == 1 and runs[-1][0] == 1  # starts and ends with policy tokens
        assert len(generated) == t.num_turns and len(observations) == t.num_turns - 1
        assert len(observations) == t.num_searches + t.invalid_actions
        assert all(len(range(s, e)) <= cfg.max_new_tokens_per_turn for s, e in generated)
        for text in observations:
            assert (text in (protocol.INVALID_ACTION_OBSERVATION, RETRIEVAL_ERROR_OBSERVATION)
                    or text.startswith(head)
                    or (text.endswith(TRUNCATION_MARKER)
                        and protocol.INVALID_ACTION_OBSERVATION.startswith(text[:-len(TRUNCATION_MARKER)])))
        assert all(q and q == q.strip() for q in t.queries)
        assert t.forced_termination == (t.num_turns == cfg.max_turns + 1)
        assert len(t.doc_ids) == len(t.retrieved) == t.num_searches
        if t.end_reason == "answer":
            last = t.response_ids[generated[-1][0]:generated[-1][1]]
            assert t.answer == extract_answer(tok.decode(last))
        else:
            assert t.answer is None
        kinds.add(t.end_reason)
    assert kinds == {"answer", "eos", "turns"}  # the fuzz reached every way of ending, and every observation kind
    assert all(sum(getattr(t, f) for t in trajectories) for f in ("retrieval_errors", "truncated_observations",
                                                                  "invalid_actions"))
    metrics = trajectory_metrics(trajectories)
    assert 0.0 <= metrics["search/duplicate_rate"] <= 1.0

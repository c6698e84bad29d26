"""The rollout loop with the real SmolLM2-135M-Instruct weights and the real BM25 index on default questions.

Independent reference: teacher-forced log-probs of prompt + recorded response (searchjax.scoring, one full
forward pass without a cache) equal the sampler's log-probs on every generated token. So the recorded ids are
exactly the sequence the model was conditioned on across turns (observations appended to the KV cache, no
re-tokenisation), and every observation token is outside the loss mask.
"""

import numpy as np
import pytest

from rollout_scripts import CountingRetriever, mask_runs
from retrieval import default_index
from retrieval.client import InProcessRetriever
from searchjax.agent import protocol
from searchjax.agent.rollout import TRUNCATION_MARKER, RolloutConfig, rollout
from searchjax.data.qa_datasets import default_prompts
from searchjax.scoring import token_logprobs


@pytest.mark.heavy
def test_smollm2_rollout_matches_teacher_forcing(smollm2):
    model, params, tok = smollm2
    prompts = default_prompts()[:2]
    # 12-token turns: SmolLM2 rarely closes an action that fast, so most turns get the invalid-action
    # observation and the loop appends and resumes with the real model.
    cfg = RolloutConfig(group_size=2, max_turns=2, max_new_tokens_per_turn=12, max_obs_tokens=64, topk=1,
                        temperature=1.0, max_cache_len=448)
    retriever = CountingRetriever(inner=InProcessRetriever(default_index("bm25")))
    trajectories = rollout(model, params, tok, retriever, prompts, cfg, seed=3)
    assert [(t.prompt.uid, t.sample_index) for t in trajectories] == [
        (p.uid, g) for p in prompts for g in range(2)]
    assert sum(len(q) for q, _ in retriever.calls) == sum(t.num_searches for t in trajectories)
    assert len(retriever.calls) <= cfg.max_turns

    head, tail = protocol.information_block("\0").split("\0")
    appended = 0
    for t in trajectories:
        assert t.prompt_ids == tok.encode(protocol.build_prompt(t.prompt.question, tok))
        assert t.response_text == tok.decode(t.response_ids)
        runs = mask_runs(t.loss_mask)
        observations = [tok.decode(t.response_ids[s:e]) for v, s, e in runs if v == 0]
        assert len(observations) == t.num_turns - 1 == t.num_searches + t.invalid_actions
        searches = iter(t.retrieved)
        for text in observations:  # each mask-0 run is exactly one observation the loop wrote
            if text.startswith(head):
                full = protocol.search_observation(next(searches))
                assert text == full or (text.endswith(TRUNCATION_MARKER + tail)
                                        and full.startswith(text[:-len(TRUNCATION_MARKER + tail)]))
            else:
                assert text == protocol.INVALID_ACTION_OBSERVATION
        appended += len(observations)
    assert appended >= 2  # the check below spans appended observations

    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in trajectories]
    ids = np.zeros((len(trajectories), max(lengths)), np.int32)
    mask = np.zeros(ids.shape, bool)
    for b, t in enumerate(trajectories):
        ids[b, :lengths[b]] = t.prompt_ids + t.response_ids
        mask[b, :lengths[b]] = True
    reference = np.asarray(token_logprobs(model, params, ids, mask, temperature=cfg.temperature))
    for b, t in enumerate(trajectories):
        start = len(t.prompt_ids) - 1  # reference[b, j] = log p(ids[j + 1] | ids[:j + 1])
        ref = reference[b, start:start + len(t.response_ids)]
        generated = np.asarray(t.loss_mask, bool)
        np.testing.assert_allclose(np.asarray(t.sampler_logprobs)[generated], ref[generated], atol=2e-3)
        assert np.all(np.asarray(t.sampler_logprobs)[~generated] == 0.0)

"""RolloutConfig.session_rows: a step's rows rolled out in consecutive generation sessions of whole groups give
the trajectories of one session, token for token, sampling noise included (each row keeps its sampling key)."""

import dataclasses

import jax.numpy as jnp
import pytest

from rollout_scripts import CountingRetriever
from searchjax import generation
from searchjax.agent.rollout import Prompt, RolloutConfig, rollout, sessions

PROMPTS = [Prompt(uid=f"q/{i}", question=f"Which city is number {i} on the list?", golden_answers=("x",))
           for i in range(5)]


def _content_logits(vocab_size: int):
    """Next-token logits from the row's own tokens only (no row index, no batch): two rows with the same context
    get the same distribution, so only their sampling keys can tell them apart."""
    def logits_fn(tokens, lengths):
        positions = jnp.arange(tokens.shape[1])
        live = positions[None, :] < lengths[:, None]
        h = jnp.sum(jnp.where(live, tokens * (positions % 7 + 1), 0), axis=1).astype(jnp.float32)
        return 2.0 * jnp.sin(h[:, None] * 1e-3 + jnp.arange(vocab_size)[None, :] * 0.37)
    return logits_fn


def test_sessions_give_the_one_session_trajectories(tiny_policy, rollout_tokenizer, monkeypatch):
    model, params = tiny_policy
    cfg = RolloutConfig(group_size=2, max_turns=2, max_new_tokens_per_turn=8, max_obs_tokens=64, topk=1,
                        temperature=1.0, max_cache_len=512)
    logits_fn = _content_logits(rollout_tokenizer.vocab_size)
    started = []
    real_start = generation.start

    def counting_start(model, params, prompt_ids, **kwargs):
        started.append(len(prompt_ids))
        return real_start(model, params, prompt_ids, **kwargs)
    monkeypatch.setattr(generation, "start", counting_start)

    def run(session_rows):
        started.clear()
        out = rollout(model, params, rollout_tokenizer, CountingRetriever(), PROMPTS,
                      dataclasses.replace(cfg, session_rows=session_rows), seed=7, logits_fn=logits_fn)
        return out, list(started)
    whole, whole_sessions = run(0)
    split, split_sessions = run(4)
    odd, odd_sessions = run(3)  # 3 rows hold one whole group of 2
    assert whole_sessions == [10] and split_sessions == [4, 4, 2] and odd_sessions == [2] * 5
    fields = ("prompt", "sample_index", "response_ids", "loss_mask", "sampler_logprobs", "queries", "answer",
              "invalid_actions", "end_reason")
    for other in (split, odd):
        assert [[getattr(t, f) for f in fields] for t in other] == [[getattr(t, f) for f in fields] for t in whole]
    # the comparison has teeth: a group's two samples share their context, so only their keys separate them
    assert all(whole[2 * i].response_ids != whole[2 * i + 1].response_ids for i in range(len(PROMPTS)))


def test_prompts_per_session():
    cfg = RolloutConfig(group_size=5, session_rows=1024)
    assert sessions(512, cfg) == 204  # whole groups: 1,020 rows
    assert sessions(512, cfg, processes=8) == 25  # 1,024 rows over 8 processes: 128 each, 25 groups
    assert sessions(512, dataclasses.replace(cfg, session_rows=3)) == 1  # at least one group
    assert sessions(512, dataclasses.replace(cfg, session_rows=0)) == 512
    with pytest.raises(ValueError, match="session_rows=-1"):
        rollout(None, None, None, None, PROMPTS, dataclasses.replace(cfg, session_rows=-1), seed=0)

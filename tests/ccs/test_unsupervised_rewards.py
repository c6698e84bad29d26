"""The gold-free baselines of CCS against hand-computed values: RLIF's self-certainty (KL(U || p) by hand on a
3-token vocabulary, the chunked head against the definition, the model's statistic against transformers'
logits, the old-policy pass the loop feeds it from), TTRL's vote (ties, no answer, gold-blindness) and the
Constitutional Judge through a real OpenAI-compatible server on loopback (parsing, range checks, failures)."""

import dataclasses
import json
import math

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import softmax

from baseline_helpers import hit, searched, tiny_policy
from searchjax.agent.rollout import Prompt, Trajectory
from searchjax.eval.metrics import ttrl_vote
from searchjax.judges.openai_compat import OpenAICompatConfig, OpenAICompatJudge
from searchjax.judges.testing_server import ScriptedReply, dead_endpoint_url, serve_scripted
from searchjax.rewards import constitutional_judge as cj
from searchjax.rewards import rlif, ttrl
from searchjax.rewards.judge_failures import JudgeFailureRateExceeded
from searchjax.rl import batching, trainer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_policy(tmp_path_factory.mktemp("tiny-policy"))


def kl_uniform_to(p: np.ndarray) -> np.ndarray:
    """The definition, term by term: KL(U || p) = sum_j (1/V) log((1/V) / p_j)."""
    v = p.shape[-1]
    return np.sum((1.0 / v) * np.log((1.0 / v) / p), axis=-1)


# --- RLIF ------------------------------------------------------------------------------------------------------

def test_self_certainty_by_hand_on_three_tokens():
    p = np.array([0.5, 0.25, 0.25])
    by_hand = (math.log((1 / 3) / 0.5) + 2 * math.log((1 / 3) / 0.25)) / 3  # = log(32/27) / 3
    assert abs(by_hand - math.log(32 / 27) / 3) < 1e-15
    reverse = 0.5 * math.log(0.5 * 3) + 2 * 0.25 * math.log(0.25 * 3)  # KL(p || U): the wrong direction
    assert abs(by_hand - reverse) > 1e-3
    z = np.log(p) + 7.0  # logits are defined up to a shift
    assert abs(rlif.self_certainty_from_logits(z) - by_hand) < 1e-12
    assert abs(rlif.self_certainty_from_logits(np.zeros(3))) < 1e-12  # uniform: 0
    hidden = jnp.asarray(z[None, None], jnp.float32)  # [B=1, T=1, H=3] with lm_head = I: logits = z
    for chunk in (None, 1, 2):  # one pass; 3 chunks; 2 chunks of width 2 (a padded column)
        logp, certainty = rlif.head_statistics(hidden, jnp.eye(3), jnp.asarray([[1]]), vocab_chunk=chunk)
        assert abs(float(certainty[0, 0]) - by_hand) < 1e-6 and abs(float(logp[0, 0]) - math.log(0.25)) < 1e-6
    # Temperature: logits 2 log p at temperature 2 are the same distribution.
    _, certainty = rlif.head_statistics(jnp.asarray(2 * z[None, None], jnp.float32), jnp.eye(3), jnp.asarray([[0]]),
                                        temperature=2.0)
    assert abs(float(certainty[0, 0]) - by_hand) < 1e-6


def test_chunked_head_matches_the_definition():
    rng = np.random.default_rng(0)
    hidden, head = rng.normal(size=(2, 3, 5)) * 2, rng.normal(size=(5, 7))
    targets = rng.integers(0, 7, size=(2, 3))
    p = softmax(hidden @ head / 0.7, axis=-1)
    for chunk in (None, 2, 3, 7):
        logp, certainty = rlif.head_statistics(jnp.asarray(hidden, jnp.float32), jnp.asarray(head, jnp.float32),
                                               jnp.asarray(targets), temperature=0.7, vocab_chunk=chunk)
        np.testing.assert_allclose(np.asarray(certainty), kl_uniform_to(p), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(logp), np.log(np.take_along_axis(p, targets[..., None], -1)[..., 0]),
                                   rtol=1e-5, atol=1e-5)


def test_model_self_certainty_matches_transformers(tiny):
    import torch
    model, params, _, reference = tiny
    rng = np.random.default_rng(1)
    rows = [rng.integers(1, 320, size=12), rng.integers(1, 320, size=9)]
    ids = np.zeros((2, 12), np.int32)
    mask = np.zeros((2, 12), bool)
    for i, row in enumerate(rows):  # left padding, as the trainer's batches
        ids[i, 12 - len(row):], mask[i, 12 - len(row):] = row, True
    logp, certainty = rlif.tail_logprobs_and_self_certainty(model, params, jnp.asarray(ids), jnp.asarray(mask),
                                                            tail=11)
    for i, row in enumerate(rows):
        with torch.no_grad():
            logits = reference(torch.tensor(row[None])).logits[0].double().numpy()  # [len, V], no padding
        p = softmax(logits[:-1], axis=-1)  # positions predicting tokens 1..len-1
        expected = kl_uniform_to(p)
        expected_logp = np.log(p[np.arange(len(row) - 1), row[1:]])
        np.testing.assert_allclose(np.asarray(certainty[i, 11 - (len(row) - 1):]), expected, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.asarray(logp[i, 11 - (len(row) - 1):]), expected_logp, rtol=1e-4, atol=1e-4)
        assert np.all(np.asarray(certainty[i, :11 - (len(row) - 1)]) == 0)  # padding positions
    assert float(np.min(np.asarray(certainty)[np.asarray(certainty) != 0])) > 0.05  # far from uniform


def test_old_policy_pass_feeds_the_rlif_reward(tiny):
    """The pass the loop runs before the reward: the same old log-probs as the trainer's, plus self-certainty
    that, cut per trajectory, is the transformers statistic of each response position; the reward is its
    mean over the final response."""
    import torch
    model, params, tok, reference = tiny
    hits = [hit("0", "Alpha tower", "alpha tower stands in lyon near the river.")]
    trajectories = [searched(tok, "t/a", "Where is the alpha tower?", "alpha tower", hits, "lyon"),
                    searched(tok, "t/a", "Where is the alpha tower?", "tower river", hits, "paris", sample_index=1),
                    searched(tok, "t/b", "Where is the beta bridge?", "beta", hits, None)]
    trajectories = [dataclasses.replace(t, prompt_ids=tok.encode(t.prompt.question)) for t in trajectories]
    batch = batching.make_batch(trajectories, np.zeros(3), pad_id=0, prompt_buckets=(32, 64),
                                response_buckets=(128, 256), row_multiple=2)
    tail = batching.loss_columns(batch)
    fn = rlif.make_logprob_certainty_fn(model, 1.0)
    old, certainty = rlif.batch_logprobs_and_certainty(fn, params, batch, 2, tail=tail)
    expected_old = trainer.batch_logprobs(trainer.make_logprob_fn(model, 1.0), params, batch, 2, tail=tail)
    np.testing.assert_allclose(old, expected_old, rtol=1e-5, atol=1e-6)
    values = rlif.response_values(certainty, batch, trajectories)
    expected_rewards = []
    for t, got in zip(trajectories, values):
        full = list(t.prompt_ids) + list(t.response_ids)
        with torch.no_grad():
            logits = reference(torch.tensor([full])).logits[0].double().numpy()
        p = softmax(logits[len(t.prompt_ids) - 1:len(full) - 1], axis=-1)  # predicting response tokens
        np.testing.assert_allclose(got, kl_uniform_to(p), rtol=1e-4, atol=1e-4)
        scored = rlif.scored_mask(t.loss_mask)
        expected_rewards.append(kl_uniform_to(p)[scored].mean())
    out = rlif.make_rlif_reward()(trajectories, self_certainty=values)
    np.testing.assert_allclose(out.rewards, expected_rewards, rtol=1e-4)
    assert out.metrics["rlif/no_final_response"] == 0


def test_rlif_reward_scores_the_final_response_by_hand():
    def trajectory(mask, uid="t/x"):
        return Trajectory(prompt=Prompt(uid=uid, question="q", golden_answers=("a",)), sample_index=0,
                          prompt_ids=[1], response_ids=list(range(len(mask))), loss_mask=mask,
                          sampler_logprobs=[0.0] * len(mask), response_text="", queries=[], doc_ids=[],
                          retrieved=[], answer=None, num_searches=0, duplicate_queries=0, forced_termination=False,
                          valid_answer=False)
    values = [np.array([9.0, 9.0, 1.0, 1.0, 2.0, 3.0, 4.0]),  # searched: the final response is the last 3 tokens
              np.array([1.0, 2.0, 6.0]),                      # no search: every generated token
              np.array([5.0, 5.0, 7.0])]                      # ended on an observation: no final response
    masks = [[1, 1, 0, 0, 1, 1, 1], [1, 1, 1], [1, 1, 0]]
    trajectories = [trajectory(m) for m in masks]
    out = rlif.rlif_reward(trajectories, values)
    np.testing.assert_allclose(out.rewards, [3.0, 3.0, 0.0])
    assert out.metrics["rlif/no_final_response"] == 1 and out.metrics["rlif/scored_tokens_mean"] == 2.0
    every = rlif.rlif_reward(trajectories, values, rlif.RlifConfig(tokens="generated"))
    np.testing.assert_allclose(every.rewards, [(9 + 9 + 2 + 3 + 4) / 5, 3.0, 5.0])
    with pytest.raises(ValueError, match="old-policy pass"):
        rlif.make_rlif_reward()(trajectories)  # no silent 0 when the loop did not compute it
    with pytest.raises(ValueError, match="t/x.*7 response tokens"):
        rlif.rlif_reward(trajectories, [values[1]] * 3)
    with pytest.raises(ValueError, match="tokens='all'"):
        rlif.RlifConfig(tokens="all")


# --- TTRL ------------------------------------------------------------------------------------------------------

def _answered(uid, answer, sample_index, golds=("Paris",)):
    return Trajectory(prompt=Prompt(uid=uid, question="q", golden_answers=golds), sample_index=sample_index,
                      prompt_ids=[1], response_ids=[1], loss_mask=[1], sampler_logprobs=[0.0], response_text="",
                      queries=[], doc_ids=[], retrieved=[], answer=answer, num_searches=0, duplicate_queries=0,
                      forced_termination=False, valid_answer=answer is not None)


GROUPS = {"g/majority": ["Paris", "paris.", "London", None, "The Paris"],  # vote "paris": 3 of 5
          "g/tie": ["London", "Paris", "Paris", "London"],              # 2 - 2: the first seen, "london", wins
          "g/silent": [None, None, "", " the "]}                         # nobody votes ("" and "the" normalise to "")


def test_ttrl_vote_rewards_by_hand():
    trajectories = [_answered(uid, a, k) for uid, answers in GROUPS.items() for k, a in enumerate(answers)]
    out = ttrl.ttrl_reward(trajectories)
    np.testing.assert_array_equal(out.rewards, [1, 1, 0, 0, 1] + [1, 0, 0, 1] + [0, 0, 0, 0])
    m = out.metrics
    assert (m["ttrl/groups"], m["ttrl/no_vote_groups"], m["ttrl/tie_groups"]) == (3, 1, 1)
    assert abs(m["ttrl/majority_fraction"] - (3 / 5 + 2 / 4) / 2) < 1e-12
    assert abs(m["ttrl/answered"] - 10 / 13) < 1e-12
    assert m["ttrl/label_exact_match"] == 0.5  # diagnostic: vote "paris" right, "london" wrong
    # Gold-blind: other (or no) golds change the diagnostic, never a reward.
    blind = ttrl.ttrl_reward([dataclasses.replace(t, prompt=dataclasses.replace(t.prompt, golden_answers=()))
                              for t in trajectories])
    np.testing.assert_array_equal(blind.rewards, out.rewards)
    # The order of the group decides a tie: with "Paris" seen first, the Paris rollouts win; a rollout without
    # an answer is not a voter, so the first *voter* decides.
    tie = [_answered("g/tie", a, k) for k, a in enumerate(["Paris", "London", "London", "Paris"])]
    assert ttrl_vote([t.answer for t in tie]) == "paris"
    np.testing.assert_array_equal(ttrl.ttrl_reward(tie).rewards, [1, 0, 0, 1])
    late = [_answered("g/late", a, k) for k, a in enumerate([None, "Oslo", "Rome"])]
    np.testing.assert_array_equal(ttrl.ttrl_reward(late).rewards, [0, 1, 0])
    assert ttrl.vote_counts(GROUPS["g/majority"]) == {"paris": 3, "london": 1}
    with pytest.raises(ValueError, match="no trajectories"):
        ttrl.ttrl_reward([])


# --- Constitutional Judge --------------------------------------------------------------------------------------

GOLD = "Quebec"
REPLIES = {  # query keyword -> the scripted judge's reply
    "kiwi": '{"response_quality": 5, "search_progression": 4, "evidence_synthesis": 3}',
    "mango": 'Scores:\n```json\n{"response_quality": 2, "search_progression": 2, "evidence_synthesis": 1}\n```',
    "plum": '{"response_quality": 7, "search_progression": 1, "evidence_synthesis": 1}',  # out of range, then fixed
    "fig": '{"response_quality": 0, "search_progression": 3, "evidence_synthesis": 3}',   # out of range, twice
    "lime": ScriptedReply(status=500),
}
CORRECTED = '{"response_quality": 1, "search_progression": 1, "evidence_synthesis": 1}'


def _responder(body):
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    keyword = next(k for k in REPLIES if f"Search query: {k} tower" in users[0])
    if len(users) > 1 and keyword == "plum":  # the correction round
        return CORRECTED
    return REPLIES[keyword]


def _judge(url, **kw):
    fields = dict(base_url=url, model="scripted-judge", api_key_env="", timeout_s=5.0, max_attempts=2,
                  backoff_initial_s=0.01, backoff_max_s=0.02)
    return OpenAICompatJudge(OpenAICompatConfig(**{**fields, **kw}))


def _cj_batch(tok):
    hits = [hit("0", "Alpha tower", "alpha tower stands in lyon near the river."),
            hit("1", "Beta bridge", "beta bridge crosses a river.")]
    plan = {"cj/a": ["kiwi", "mango"], "cj/b": ["plum", "kiwi"], "cj/c": ["fig", "kiwi"], "cj/d": ["lime", "mango"]}
    return [searched(tok, uid, "Where is the alpha tower?", f"{k} tower", hits, "lyon", sample_index=s, golds=(GOLD,))
            for uid, keys in plan.items() for s, k in enumerate(keys)]


def test_constitutional_judge_scores_failures_and_gold_blindness(tiny, tmp_path):
    _, _, tok, _ = tiny
    trajectories = _cj_batch(tok)
    cfg = cj.CjConfig(max_passages_per_step=1, audit_path=str(tmp_path / "cj.jsonl"))
    with serve_scripted(_responder) as server:
        out = cj.cj_reward(trajectories, _judge(server.base_url), tok, cfg)
        bodies = server.request_bodies()
    # r = (mean score - 1) / 4: kiwi (5+4+3)/3 = 4 -> 0.75; mango 5/3 -> 1/6; plum corrected to 1,1,1 -> 0.
    expected = np.array([0.75, 1 / 6, 0.0, 0.75, 0.0, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(out.rewards, expected, rtol=1e-6)
    assert set(out.advantage_overrides) == {"cj/c", "cj/d"}  # fig (malformed twice) and lime (HTTP 500)
    assert all(np.array_equal(a, np.zeros(2, np.float32)) for a in out.advantage_overrides.values())
    m = out.metrics
    assert (m["cj/failed_groups"], m["cj/requests"], m["cj/failed_requests"], m["cj/deduplicated"]) == (2, 5, 2, 3)
    assert m["cj/failures/malformed"] == 1 and m["cj/failures/http"] == 1
    # Gold-blind: the reference answer is in no request; the trace and the final response are.
    assert not any(GOLD in json.dumps(b) for b in bodies)
    user = next(b for b in bodies if "kiwi" in b["messages"][-1]["content"])["messages"][-1]["content"]
    assert "Step 1\nSearch query: kiwi tower\nResults:\nDoc 1(Title: \"Alpha tower\")" in user
    assert "Doc 2(" not in user and "Final response:\n<answer> lyon </answer>" in user and "<think>" not in user
    assert "from 1 (worst) to 5 (best)" in user
    records = [json.loads(line) for line in (tmp_path / "cj.jsonl").read_text().splitlines()]
    assert len(records) == 5 and sum(not r["ok"] for r in records) == 2
    assert next(r for r in records if r["scores"] == {"response_quality": 1.0, "search_progression": 1.0,
                                                       "evidence_synthesis": 1.0})["replies"][0] == REPLIES["plum"]


def test_constitutional_judge_failure_rate_stops_the_run(tiny):
    _, _, tok, _ = tiny
    trajectories = _cj_batch(tok)
    with serve_scripted(_responder) as server:  # 2 of 5 distinct requests fail: 40%
        assert cj.make_cj_reward(_judge(server.base_url), tok, cj.CjConfig(max_failure_rate=0.5))(trajectories)
        with pytest.raises(JudgeFailureRateExceeded, match="2 of 5 .*config.cj.max_failure_rate=0.3"):
            cj.make_cj_reward(_judge(server.base_url), tok, cj.CjConfig(max_failure_rate=0.3))(trajectories)
    dead = _judge(dead_endpoint_url(), max_attempts=1)
    out = cj.cj_reward(trajectories, dead, tok, cj.CjConfig())  # the function itself never raises
    assert out.metrics["cj/failed_groups"] == 4 and out.metrics["cj/failures/connection"] == 5
    with pytest.raises(JudgeFailureRateExceeded, match="5 of 5"):
        cj.make_cj_reward(dead, tok, cj.CjConfig())(trajectories)


def test_rubric_arithmetic_and_config_errors():
    scores = {"response_quality": 5, "search_progression": 1, "evidence_synthesis": 3}
    assert cj.rubric_reward(scores, cj.CjConfig()) == 0.5  # (3 - 1) / 4
    weighted = cj.CjConfig(weights=(2.0, 1.0, 1.0))  # (2*5 + 1 + 3) / 4 = 3.5 -> 0.625
    assert cj.rubric_reward(scores, weighted) == 0.625
    assert cj.rubric_reward(scores, cj.CjConfig(score_min=0, score_max=10)) == 0.3
    with pytest.raises(ValueError, match="score_min=5 must be < score_max=5"):
        cj.CjConfig(score_min=5, score_max=5)
    with pytest.raises(ValueError, match="weights"):
        cj.CjConfig(weights=(1.0, 1.0))
    with pytest.raises(ValueError, match="max_failure_rate"):
        cj.CjConfig(max_failure_rate=1.5)


# --- configs/ccs.py: the paper's settings and the baselines' variants -----------------------------------------

def test_ccs_config_variants_are_consistent():
    import importlib.util
    import pathlib
    from searchjax.agent.rollout import RolloutConfig, required_cache_len
    from searchjax.experiment import loop
    from searchjax.judges.templates import load_prompt
    from searchjax.rewards import cycle
    path = pathlib.Path(__file__).resolve().parents[2] / "configs" / "ccs.py"
    spec = importlib.util.spec_from_file_location("configs_ccs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for variant in module.VARIANTS:
        config = module.get_config(variant)
        assert config.reward_fn in loop.REWARD_FNS and config.eval_reward_fn == "exact_match", variant
        cycle.CcsConfig(**config.ccs.to_dict())
        rlif.RlifConfig(**config.rlif.to_dict())
        cj.CjConfig(**{**config.cj.to_dict(), "weights": tuple(config.cj.weights)})
        trajectories = config.prompts_per_step * config.rollout.group_size
        assert trajectories % config.batch.mini_batch_size == 0, variant
        assert config.batch.mini_batch_size % config.batch.micro_batch_size == 0, variant
        assert set(load_prompt(config.ccs.prompt).fields) == {"trace"}
        if variant.startswith("quickstart"):
            continue
        rollout_cfg = RolloutConfig(**config.rollout.to_dict())
        paper = (config.total_steps, config.prompts_per_step, config.rollout.group_size, config.batch.mini_batch_size,
                 config.batch.micro_batch_size, rollout_cfg.max_new_tokens_per_turn, rollout_cfg.max_obs_tokens,
                 rollout_cfg.max_turns, rollout_cfg.topk, config.loss.kl_coef, config.loss.clip_low)
        # bamboogle has 125 questions: 64 per step (one mini-batch), else the paper's 512 and 256 x 5
        questions, mini = (64, 64 * 5) if variant == "ttrl_bamboogle" else (512, 256 * 5)
        # Qwen3-32B: micro-batches of 8 rows (memory only: the loss is the mini-batch's sum over its denominator)
        micro = 8 if variant == "qwen3-32b" else 64
        assert paper == (300, questions, 5, mini, micro, 512, 8192, 4, 10, 0.01, 0.2), variant
        assert required_cache_len([[0] * 512], rollout_cfg) == rollout_cfg.max_cache_len == 35840
        assert max(config.batch.response_buckets) >= 5 * 512 + 4 * 8192
        assert config.ccs.prompt == "ccs_reconstructor.v2" and config.optim.warmup_steps < 2 * config.total_steps
        if variant.startswith("ttrl_"):
            assert config.data.train == config.data.eval == module.TTRL_SETS[variant[5:]]
    assert module.get_config("quickstart").ccs.prompt == "ccs_reconstructor.v1"  # v1 stays loadable and used
    with pytest.raises(ValueError, match="unknown variant 'ttrl_nowhere'"):
        module.get_config("ttrl_nowhere")

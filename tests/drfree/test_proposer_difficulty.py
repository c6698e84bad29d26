"""Dr.Zero's difficulty reward as a trainer reward: the proposed questions go to the solver's n = 5 multi-turn
search rollouts (searchjax.agent.rollout.rollout, one call for the batch) with a scripted solver whose answers
are known, so c and the reward 0.5 * format + difficulty are checked against hand-computed values."""

import numpy as np
import pytest
from proposer_fakes import CHAIN_1, CHAIN_2, CHAIN_3, CountingRetriever, FakeTrajectory, reply, scripted_logits_fn

from searchjax.agent import protocol
from searchjax.agent.rollout import RolloutConfig
from searchjax.drfree.proposer import chain_prompt
from searchjax.rewards import difficulty

Q1 = "Where was the director of Crouching Tiger born?"
Q2 = "Who directed Crouching Tiger?"
SOLVER_CFG = RolloutConfig(group_size=5, max_turns=2, max_new_tokens_per_turn=32, max_obs_tokens=256, topk=2,
                           temperature=1.0, max_cache_len=1024, search=True)


def test_proposer_difficulty_reward_with_scripted_solver(drfree_tokenizer, monkeypatch):
    tok = drfree_tokenizer
    eos = tok.eos_token_ids[0]
    proposals = [
        FakeTrajectory(chain_prompt(CHAIN_2), reply(Q1, "Pingtung County"), response_ids=[1, 2]),       # format 1
        FakeTrajectory(chain_prompt(CHAIN_1), f"<question>{Q2}</question><answer>Ang Lee</answer>",
                       response_ids=[3]),                                                               # format 2/3
        FakeTrajectory(chain_prompt(CHAIN_3), "no tags at all", response_ids=[4]),                      # format 0
        FakeTrajectory(chain_prompt(CHAIN_3), reply("Is Taiwan the country?", "Taiwan"), response_ids=[5]),  # 0
    ]
    retriever = CountingRetriever()
    search_hits = retriever.search(["Crouching Tiger director"], SOLVER_CFG.topk)[0]
    retriever.calls.clear()
    observation = tok.encode(protocol.search_observation(search_hits))
    # Solver scripts, prompt-major (question Q1: 5 rows, then Q2: 5 rows). Q1 (gold "Pingtung County"): a row
    # that searches once then answers correctly, a correct answer up to normalisation, two wrong answers and
    # one without an answer: c = 2. Q2 (gold "Ang Lee"): all five correct: c = 5.
    turns = {
        0: ["<think>I need the director.</think><search>Crouching Tiger director</search>",
            "<answer>Pingtung County</answer>"],
        1: ["<answer> pingtung county. </answer>"], 2: ["<answer>Taiwan</answer>"], 3: ["<answer>Ang Lee</answer>"],
        4: ["I do not know."],
    }
    scripts = []
    for r in range(10):
        question = Q1 if r < 5 else Q2
        ids = tok.encode(protocol.build_prompt(question, tok))
        parts = turns[r] if r < 5 else ["<answer>Ang Lee</answer>"]
        ids += tok.encode(parts[0])
        if len(parts) > 1:
            ids += observation + tok.encode(parts[1])
        scripts.append(ids + [eos])
    seen = []

    def recording_rollout(*args, **kwargs):
        seen.append(args[4])  # the solver prompts
        return real_rollout(*args, **kwargs)

    real_rollout = difficulty.rollout
    monkeypatch.setattr(difficulty, "rollout", recording_rollout)
    reward_fn = difficulty.make_difficulty_reward(None, None, tok, retriever, SOLVER_CFG,
                                                  logits_fn=scripted_logits_fn(scripts, eos, tok.vocab_size))
    out = reward_fn(proposals)

    assert len(seen) == 1  # one rollout call for the whole batch
    assert [(p.question, p.golden_answers, p.hops) for p in seen[0]] == [(Q1, ("Pingtung County",), 2),
                                                                          (Q2, ("Ang Lee",), 1)]
    assert retriever.calls == [(["Crouching Tiger director"], 2)]  # the searching row's one search
    # c = 2 -> difficulty (5 - 2) / 4; c = 5 -> 0; no integrity -> 0
    np.testing.assert_allclose(out.rewards, [0.5 * 1 + 0.75, 0.5 * 2 / 3 + 0.0, 0.0, 0.0], rtol=1e-6)
    m = out.metrics
    assert (m["difficulty/questions"], m["difficulty/solver_rollouts"]) == (2, 10)
    assert m["difficulty/solve_rate"] == pytest.approx((2 / 5 + 5 / 5) / 2)
    assert (m["difficulty/all_correct_rate"], m["difficulty/none_correct_rate"]) == (0.5, 0.0)
    assert m["difficulty/score_mean"] == pytest.approx(0.75 / 2)
    assert m["proposer/format_mean"] == pytest.approx((1 + 2 / 3) / 4)


def test_proposer_difficulty_seed_and_config_checks():
    a = [FakeTrajectory(None, "", response_ids=[1, 2, 3])]
    b = [FakeTrajectory(None, "", response_ids=[1, 2, 4])]
    assert difficulty.rollout_seed(a) == difficulty.rollout_seed(a) != difficulty.rollout_seed(b)
    assert difficulty.rollout_seed(a, 1) != difficulty.rollout_seed(a, 0)
    with pytest.raises(ValueError, match="n >= 2"):
        difficulty.make_difficulty_reward(None, None, None, None, RolloutConfig(group_size=1))
    with pytest.raises(ValueError, match="search=True"):
        difficulty.make_difficulty_reward(None, None, None, None, RolloutConfig(group_size=5, search=False))

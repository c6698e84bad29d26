"""The RLIF reward's entry in the trainer's table: what a config without its section, with a wrong field, or a
caller without the old-policy pass's statistics gets (one clear error each), and that the built RewardFn asks
the loop for that pass and scores by hand-computed values."""

import ml_collections
import numpy as np
import pytest

from searchjax.agent.rollout import Prompt, Trajectory
from searchjax.experiment import loop, scoring


def _config(**rlif_fields):
    config = ml_collections.ConfigDict({"reward_fn": "rlif"})
    if rlif_fields:
        config.rlif = ml_collections.ConfigDict(rlif_fields)
    return config


def _trajectory(loss_mask):
    return Trajectory(prompt=Prompt(uid="t/x", question="q", golden_answers=("a",)), sample_index=0, prompt_ids=[1],
                      response_ids=list(range(len(loss_mask))), loss_mask=list(loss_mask),
                      sampler_logprobs=[0.0] * len(loss_mask), response_text="", queries=[], doc_ids=[],
                      retrieved=[], answer=None, num_searches=0, duplicate_queries=0, forced_termination=False,
                      valid_answer=False)


def test_the_builder_names_what_is_missing_or_wrong():
    build = loop.REWARD_FNS["rlif"]
    with pytest.raises(ValueError, match=r"config.reward_fn='rlif' needs a config.rlif section"):
        build(_config(), None, None)
    with pytest.raises(ValueError, match=r"config.rlif: .*'token'"):
        build(_config(token="final_response"), None, None)
    with pytest.raises(ValueError, match=r"RlifConfig.tokens='last' is not one of"):
        build(_config(tokens="last"), None, None)


def test_the_built_reward_asks_for_the_pass_and_scores_the_final_response():
    reward_fn = loop.REWARD_FNS["rlif"](_config(tokens="final_response"), None, None)
    assert scoring.needs_self_certainty(reward_fn) and not scoring.needs_self_certainty(loop.REWARD_FNS["f1"](
        None, None, None))
    trajectory = _trajectory([1, 1, 0, 0, 1, 1])  # generated, observation, then the final response
    with pytest.raises(ValueError, match="rlif: the reward needs the self-certainty of the old-policy pass"):
        reward_fn([trajectory])
    values = np.array([9.0, 9.0, 5.0, 5.0, 0.25, 0.75])
    out, reason = scoring.score(reward_fn, [trajectory], self_certainty=[values])
    assert reason == "" and out.rewards.tolist() == [0.5]  # (0.25 + 0.75) / 2: only the tokens after the observation
    generated = loop.REWARD_FNS["rlif"](_config(tokens="generated"), None, None)([trajectory], self_certainty=[values])
    assert generated.rewards.tolist() == [(9 + 9 + 0.25 + 0.75) / 4]
    with pytest.raises(ValueError, match=r"has 6 response tokens but self-certainty of shape \(5,\)"):
        reward_fn([trajectory], self_certainty=[values[:5]])

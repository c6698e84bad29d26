"""Dr.Free IG transform, format score, proposer reward and grounding against hand-computed values."""

import math

import numpy as np
import pytest

from searchjax.drfree.proposer import (build_proposer_messages, build_proposer_prompt, is_grounded,
                                       parse_proposer_output, question_word_range)
from searchjax.rewards.information_gain import format_score, information_gain, proposer_reward


# --- eqs. 6-7 ---------------------------------------------------------------------------------------------
def test_information_gain_scalar_by_hand():
    g, s = information_gain(-0.5, [-2.0, -1.5, -3.0])           # g = -0.5 - (-1.5) = 1.0
    assert g == pytest.approx(1.0)
    assert s == pytest.approx(3.0 * math.tanh(1.0 / 3.0))       # 0.96539...
    g, s = information_gain(-2.0, [-1.0, -4.0])                  # a shortcut beats the full context
    assert g == pytest.approx(-1.0) and s == 0.0
    g, s = information_gain(0.0, [-100.0])                       # saturates below tau
    assert s == pytest.approx(3.0 * math.tanh(100 / 3)) and s <= 3.0
    g, s = information_gain(-1.0, [-2.0], tau=1.0)
    assert s == pytest.approx(math.tanh(1.0))
    # single-hop form (eq. 4): full = l(A | q, retrieve(q)), shortcuts = [closed-book]
    assert information_gain(-0.7, [-1.9]).gain == pytest.approx(1.2)


def test_information_gain_batched_with_absent_shortcuts():
    full = np.array([-0.5, -2.0, -1.0])
    shortcuts = np.array([[-2.0, -1.5, -np.inf], [-1.0, -4.0, -np.inf], [-3.0, -np.inf, -np.inf]])
    gain, score = information_gain(full, shortcuts)
    np.testing.assert_allclose(gain, [1.0, -1.0, 2.0])
    np.testing.assert_allclose(score, [3 * math.tanh(1 / 3), 0.0, 3 * math.tanh(2 / 3)])


def test_information_gain_bad_input():
    with pytest.raises(ValueError, match="no finite shortcut"):
        information_gain(np.array([-1.0]), np.array([[-np.inf, -np.inf]]))
    with pytest.raises(ValueError, match="NaN"):
        information_gain(-1.0, [float("nan")])
    with pytest.raises(ValueError, match="shape"):
        information_gain(np.zeros(2), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="shape"):
        information_gain(-1.0, [])


# --- eqs. 10-11 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("response, target, expected", [
    ("<think>e0 directed e1</think><question>Who composed the score of the film directed by Ang Lee in 2000?"
     "</question><answer>Tan Dun</answer>", "Tan Dun", 1.0),                            # 1 + think + target
    ("<think>r</think><question>Who scored it?</question><answer>tan dun.</answer>", "Tan Dun", 1.0),
    ("<question>Who scored it?</question><answer>Tan Dun</answer>", "Tan Dun", 2 / 3),   # no think
    ("<think>r</think><question>Who scored it?</question><answer>Yo-Yo Ma</answer>", "Tan Dun", 2 / 3),
    ("<think></think><question>Who scored it?</question><answer>Yo-Yo Ma</answer>", "Tan Dun", 1 / 3),
    ("<question>Who scored it?</question><answer>Yo-Yo Ma</answer>", "Tan Dun", 1 / 3),
    ("<think>r</think><question>Did Tan Dun score it?</question><answer>Tan Dun</answer>", "Tan Dun", 0.0),
    ("<think>r</think><question>Who scored it?</question><answer> </answer>", "Tan Dun", 0.0),
    ("<think>r</think><question></question><answer>Tan Dun</answer>", "Tan Dun", 0.0),
    ("<think>r</think><question>Who scored it?</question>", "Tan Dun", 0.0),
    ("<think>r</think><question>Who scored it?</question><answer>The</answer>", "Tan Dun", 0.0),
    ("<think>r</think><question>Who scored it?<answer>Tan Dun</answer>", "Tan Dun", 0.0),  # unclosed question
    ("", "Tan Dun", 0.0),
])
def test_format_score_by_hand(response, target, expected):
    assert format_score(response, target) == expected


def test_format_score_reads_after_the_reasoning():
    draft_in_think = ("<think><question>Draft?</question><answer>Draft</answer></think>"
                      "<question>Which city hosts the club?</question><answer>Paris</answer>")
    assert parse_proposer_output(draft_in_think).question == "Which city hosts the club?"
    assert format_score(draft_in_think, "Paris") == 1.0


# --- eq. 12 -----------------------------------------------------------------------------------------------
def test_proposer_reward_by_hand():
    assert proposer_reward(1.0, True, 0.9) == pytest.approx(0.2 + 0.9)
    assert proposer_reward(1.0, False, 0.9) == pytest.approx(0.2)
    assert proposer_reward(2 / 3, True, 0.9) == pytest.approx(0.2 * 2 / 3)
    assert proposer_reward(0.0, True, 2.5) == 0.0
    assert proposer_reward(1.0, True, 0.9, lam=0.5) == pytest.approx(1.4)
    out = proposer_reward(np.array([1.0, 1.0, 1 / 3, 0.0]), np.array([True, False, True, True]),
                          np.array([0.5, 0.5, 0.5, 0.5]))
    np.testing.assert_allclose(out, [0.7, 0.2, 0.2 / 3, 0.0])


# --- the proposer prompt and grounding --------------------------------------------------------------------
def test_proposer_prompt_names_the_chain_and_hides_bridges():
    entities = ["Crouching Tiger, Hidden Dragon", "Ang Lee", "Taiwan"]
    prompt = build_proposer_prompt(entities, ["director", "country of citizenship"],
                                   ["Crouching Tiger is a film.", "Ang Lee is a\n director.", "Taiwan is ..."])
    assert '[0] Crouching Tiger, Hidden Dragon --director--> [1] Ang Lee --country of citizenship--> [2] Taiwan' in prompt
    assert 'whose answer is "Taiwan"' in prompt and 'hidden bridge entities ("Ang Lee")' in prompt
    assert "Q6. Use between {} and {} words.".format(*question_word_range(2)) in prompt
    assert "[1] Ang Lee: Ang Lee is a director." in prompt              # passages on one line each
    assert "<think>" in prompt and "<question>" in prompt and "<answer>" in prompt
    single = build_proposer_messages(["Paris", "France"], ["country"], ["Paris is in France.", "France ..."])
    assert single[0]["role"] == "user" and "a 1-hop chain has none" in single[0]["content"]
    with pytest.raises(ValueError, match="need 3 passages"):
        build_proposer_prompt(entities, ["r1", "r2"], ["p0", "p1"])


def test_grounding_on_crafted_chains():
    seed = "Ang Lee directed Crouching Tiger, Hidden Dragon in 2000."
    bridge = "Ang Lee is a filmmaker born in Pingtung County, Taiwan."
    end = "Taiwan is an island country in East Asia."
    # single hop: source or evidence passage is enough
    assert is_grounded("Ang Lee", [seed, "A film page without the name."])
    assert is_grounded("Pingtung County", ["Seed text.", bridge])
    assert not is_grounded("Tan Dun", [seed, bridge])
    # multi-hop: a non-seed chain passage must contain it; the seed alone is not enough
    assert is_grounded("Taiwan", [seed, bridge, end])
    assert not is_grounded("2000", [seed, bridge, end])
    # token boundaries and normalisation: "Taiwan" is not found inside "Taiwanese"; "the U.S." -> "us"
    assert not is_grounded("Taiwan", [seed, "Taiwanese cinema.", "Taiwanese food."])
    assert is_grounded("the U.S.", [seed, "He moved to the U.S. in 1978.", end])
    assert not is_grounded("", [seed, bridge]) and not is_grounded(None, [seed, bridge])
    with pytest.raises(ValueError, match="passages"):
        is_grounded("x", [seed])

"""Proposer side of Dr.Free: chain records -> prompts, reply checks (format score exactly 0, 1/3, 2/3, 1 and
grounding on crafted chains), the hop-balanced held-out split, and the single-turn proposer rollout with a
scripted policy (its output is known token for token)."""

import copy

import numpy as np
import pytest
from proposer_fakes import CHAIN_1, CHAIN_2, CHAIN_3, reply, scripted_logits_fn

from searchjax.agent.rollout import Prompt, RolloutConfig
from searchjax.drfree import proposer
from searchjax.experiment import selfplay
from searchjax.rewards.information_gain import check_proposal


def test_proposer_chain_prompt_fields_and_text():
    prompt = proposer.chain_prompt(CHAIN_3)
    assert isinstance(prompt, Prompt)
    assert (prompt.uid, prompt.hops, prompt.golden_answers, prompt.data_source) == \
        ("chains/h3-000000", 3, ("Taiwan",), "chains")
    assert prompt.metadata["chain"] is CHAIN_3
    text = prompt.question
    assert text.startswith('You write one quiz question from a chain of facts. The chain below starts at '
                           '"Crouching Tiger" and, following 3 relations, ends at "Taiwan".')
    assert ('[0] Crouching Tiger --director--> [1] Ang Lee --place of birth--> [2] Pingtung County '
            '--country--> [3] Taiwan') in text
    assert "[2] Pingtung County: Pingtung County is a county in southern Taiwan." in text
    assert 'hidden bridge entities ("Ang Lee", "Pingtung County")' in text
    assert "Q6. Use between 14 and 40 words." in text
    # one hop: no bridge to hide, the 1-hop word range
    one = proposer.chain_prompt(CHAIN_1).question
    assert "hidden bridge entities (a 1-hop chain has none)" in one and "Q6. Use between 6 and 20 words." in one
    assert "following 1 relation," in one


@pytest.mark.parametrize("edit, message", [
    (lambda r: r.pop("passages"), r"missing field\(s\) \['passages'\]"),
    (lambda r: r.update(hops=0), "'hops' must be an integer >= 1"),
    (lambda r: r["relations"].pop(), "'relations' must be a list of 2 items"),
    (lambda r: r["passages"].append(r["passages"][0]), "'passages' must be a list of 3 items"),
    (lambda r: r["entities"][1].update(label=" "), r"entities\[1\] needs a non-empty 'label'"),
    (lambda r: r["passages"][2].pop("text"), r"passages\[2\] needs 'title' and a str 'text'"),
    (lambda r: r.update(answer="the"), "'answer' must be a non-empty string"),
])
def test_proposer_bad_chain_record_names_the_field(edit, message):
    record = copy.deepcopy(CHAIN_2)
    edit(record)
    with pytest.raises(ValueError, match=message):
        proposer.chain_prompt(record)


def test_proposer_overlong_prompts_are_dropped(drfree_tokenizer):
    long_chain = copy.deepcopy(CHAIN_2)
    long_chain["id"] = "h2-long"
    long_chain["passages"][1]["text"] = "Ang Lee directed many films. " * 200
    hf = drfree_tokenizer.hf  # transformers' own chat template and tokenizer as the reference count
    lengths = {r["id"]: len(hf(hf.apply_chat_template([{"role": "user", "content": proposer.chain_user_message(r)}],
                                                      add_generation_prompt=True, tokenize=False),
                               add_special_tokens=False)["input_ids"])
               for r in (CHAIN_2, long_chain)}
    limit = lengths["h2-000000"]  # the short prompt fits exactly, the long one does not
    assert lengths["h2-long"] > limit
    prompts, dropped = proposer.chain_prompts([CHAIN_2, long_chain], tokenizer=drfree_tokenizer,
                                              max_prompt_tokens=limit)
    assert [p.uid for p in prompts] == ["chains/h2-000000"] and dropped == 1
    with pytest.raises(ValueError, match="needs a tokenizer"):
        proposer.chain_prompts([CHAIN_2], max_prompt_tokens=10)


# Format score (eqs. 10-11) wired to the chain's answer, and grounding in the chain's own passages.
@pytest.mark.parametrize("record, response, fmt, grounded", [
    # 2 hops: the answer (Pingtung County) is stated by the bridge passage (Ang Lee's): grounded
    (CHAIN_2, reply("Where was the director of Crouching Tiger born?", "Pingtung County"), 1.0, True),
    (CHAIN_2, reply("Where was the director of Crouching Tiger born?", "pingtung county."), 1.0, True),
    (CHAIN_2, "<question>Where was the director of Crouching Tiger born?</question><answer>Pingtung County</answer>",
     2 / 3, True),                                                           # no think block
    (CHAIN_2, reply("Where was the director of Crouching Tiger born?", "Taiwan"), 2 / 3, True),  # not the target
    (CHAIN_2, "<think></think><question>Who scored Crouching Tiger?</question><answer>Tan Dun</answer>", 1 / 3,
     False),                                                                 # only in the seed passage: ungrounded
    (CHAIN_2, reply("Is Pingtung County where Ang Lee was born?", "Pingtung County"), 0.0, True),  # answer in q
    (CHAIN_2, reply("Where was he born?", ""), 0.0, False),
    (CHAIN_2, "Pingtung County", 0.0, False),
    # 1 hop: the answer may sit in the source passage or in the evidence passage
    (CHAIN_1, reply("Who directed Crouching Tiger?", "Ang Lee"), 1.0, True),
    (CHAIN_1, reply("Who wrote the music of Crouching Tiger?", "Tan Dun"), 2 / 3, True),
    (CHAIN_1, reply("In which year was Crouching Tiger released?", "2001"), 2 / 3, False),
    # 3 hops: "Taiwan" is in two non-seed passages
    (CHAIN_3, reply("In which country was the director of Crouching Tiger born?", "Taiwan"), 1.0, True),
])
def test_proposer_check_on_crafted_chains(record, response, fmt, grounded):
    check = check_proposal(response, record)
    assert check.format_score == fmt
    assert check.grounded is grounded
    assert check.gated is (fmt == 1.0 and grounded)


def _prompt(uid, hops):
    return Prompt(uid=uid, question=uid, golden_answers=("x",), hops=hops)


def test_proposer_held_out_split_round_robin_over_hops():
    prompts = [_prompt(f"h{h}-{i}", h) for h in (1, 2, 3) for i in range(3)]  # pool order: by hop count
    train, held = selfplay.split_by_hops(prompts, 4)
    assert [p.uid for p in held] == ["h1-0", "h2-0", "h3-0", "h1-1"]
    assert [p.uid for p in train] == ["h2-1", "h3-1", "h1-2", "h2-2", "h3-2"]
    uneven = [_prompt("a", 1), _prompt("b", 1), _prompt("c", 1), _prompt("d", 3)]
    assert [p.uid for p in selfplay.round_robin_by_hops(uneven)] == ["a", "d", "b", "c"]
    with pytest.raises(ValueError, match="eval_chains=9"):
        selfplay.split_by_hops(prompts, 9)


def test_proposer_rollout_scripted(drfree_tokenizer):
    """Single turn, no tool: row r generates its script up to EOS or the budget (a </answer> does not stop it:
    the reply is read from its final tags)."""
    tok = drfree_tokenizer
    prompts = [proposer.chain_prompt(CHAIN_2), proposer.chain_prompt(CHAIN_1)]
    replies = [reply("Where was the director of Crouching Tiger born?", "Pingtung County") + " trailing text",
               reply("Which director made Crouching Tiger?", "Ang Lee"),
               "<think>" + "step " * 60,  # runs into the 48-token budget
               "<question>Who?</question>"]  # ends with EOS before any answer
    prompt_ids = [tok.encode(proposer.proposer_prompt_text(p, tok)) for p in prompts]
    eos = tok.eos_token_ids[0]
    reply_ids = [tok.encode(r) for r in replies]
    reply_ids[3] = reply_ids[3] + [eos]
    scripts = [prompt_ids[r // 2] + reply_ids[r] for r in range(4)]  # prompt-major, group_size 2
    cfg = RolloutConfig(group_size=2, max_turns=0, max_new_tokens_per_turn=48, max_cache_len=1024 + 48, search=False,
                        temperature=1.0)
    logits_fn = scripted_logits_fn(scripts, eos, tok.vocab_size)
    out = selfplay.proposer_rollout(None, None, tok, prompts, cfg, seed=3, logits_fn=logits_fn)
    assert [(t.prompt.uid, t.sample_index) for t in out] == [
        ("chains/h2-000000", 0), ("chains/h2-000000", 1), ("chains/h1-000000", 0), ("chains/h1-000000", 1)]
    assert out[0].response_ids == reply_ids[0] + [eos] and out[0].response_text == tok.decode(reply_ids[0] + [eos])
    assert (out[0].answer, out[0].end_reason, out[0].valid_answer) == ("Pingtung County", "eos", True)
    assert out[1].response_ids == reply_ids[1] + [eos] and out[1].answer == "Ang Lee"
    assert out[2].response_ids == reply_ids[2][:48] and (out[2].answer, out[2].end_reason) == (None, "turns")
    assert out[3].response_ids == reply_ids[3] and (out[3].answer, out[3].end_reason) == (None, "eos")
    for t in out:
        assert t.prompt_ids == prompt_ids[0 if t.prompt.hops == 2 else 1]
        assert t.loss_mask == [1] * len(t.response_ids)
        np.testing.assert_allclose(t.sampler_logprobs, 0.0, atol=1e-3)  # all mass on the scripted token
        assert (t.num_searches, t.queries, t.forced_termination, t.num_turns) == (0, [], False, 1)


def test_proposer_rollout_config_errors(drfree_tokenizer):
    prompts = [proposer.chain_prompt(CHAIN_2)]
    with pytest.raises(ValueError, match="does not search"):
        selfplay.proposer_rollout(None, None, drfree_tokenizer, prompts, RolloutConfig(search=True), seed=0)
    with pytest.raises(ValueError, match="max_cache_len=64 is too small"):
        selfplay.proposer_rollout(None, None, drfree_tokenizer, prompts,
                                  RolloutConfig(search=False, max_cache_len=64, max_new_tokens_per_turn=16), seed=0)
    with pytest.raises(ValueError, match="unique uids"):
        selfplay.proposer_rollout(None, None, drfree_tokenizer, prompts * 2, RolloutConfig(search=False), seed=0)

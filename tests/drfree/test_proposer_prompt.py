"""The proposer prompt (searchjax/judges/prompts/drfree_proposer.v1.txt, after the paper's Table 17) per hop count,
and the reading of the FINAL <question>/<answer> of a reply."""

import pytest
from proposer_fakes import CHAIN_1, CHAIN_2, CHAIN_3, passage, reply, scripted_logits_fn

from searchjax.agent.rollout import RolloutConfig
from searchjax.drfree import proposer
from searchjax.experiment import selfplay
from searchjax.judges import load_prompt
from searchjax.rewards.information_gain import check_proposal, format_score

QUESTION_RULES = [f"Q{i}." for i in range(1, 9)]
CHAIN_RULES = [f"C{i}." for i in range(1, 7)]
# (min, max) words by hop count, written out by hand: min = 2 + 4h, max = 10 + 10h (ours; module docstring).
RANGES = {1: (6, 20), 2: (10, 30), 3: (14, 40), 4: (18, 50)}

ROME = passage("Rome", "Rome is the capital of Italy.")
CHAIN_4 = {**CHAIN_3, "id": "h4-000000", "hops": 4,
           "entities": CHAIN_3["entities"] + [{"id": "Q4", "title": "Rome", "label": "Rome"}],
           "relations": CHAIN_3["relations"] + [{"id": "P4", "label": "twinned city"}],
           "answer": "Rome", "passages": CHAIN_3["passages"] + [ROME]}
CHAINS = {1: CHAIN_1, 2: CHAIN_2, 3: CHAIN_3, 4: CHAIN_4}


@pytest.mark.parametrize("hops", [1, 2, 3, 4])
def test_prompt_per_hop_count_has_the_range_rules_and_self_check(hops):
    record = CHAINS[hops]
    text = proposer.chain_prompt(record).question
    names = [e["label"] for e in record["entities"]]
    relations = [r["label"] for r in record["relations"]]
    low, high = RANGES[hops]
    assert proposer.question_word_range(hops) == (low, high)
    assert f"Q6. Use between {low} and {high} words." in text
    assert f"- Length: the question has between {low} and {high} words." in text
    # every rule exactly once, in order, each at the start of a line
    lines = text.splitlines()
    labels = [line.split(" ", 1)[0] for line in lines if line[:1] in "QC" and line[1:2].isdigit()]
    assert labels == QUESTION_RULES + CHAIN_RULES
    assert f'Q2. Name the start entity "{names[0]}" explicitly.' in text
    bridges = ", ".join(f'"{b}"' for b in names[1:-1]) or "a 1-hop chain has none"
    assert f"hidden bridge entities ({bridges})" in text
    assert f'C1. The answer is "{names[-1]}" written as in the chain' in text
    assert "C6. Do not search and do not call any tool" in text
    # the self-check: one line per hop, bridges must stay unnamed, the last hop gives the answer
    checks = [line for line in lines if line.startswith("- Hop ")]
    assert len(checks) == hops
    for k, line in enumerate(checks, start=1):
        assert line.startswith(f'- Hop {k} ("{names[k - 1]}" --{relations[k - 1]}--> "{names[k]}"): ')
        tail = f'its only answer is "{names[k]}".' if k == hops else f'does not name "{names[k]}".'
        assert line.endswith(tail)
    chain_line = "".join([f"[0] {names[0]}"] + [f" --{relations[k]}--> [{k + 1}] {names[k + 1]}" for k in range(hops)])
    assert chain_line in text and f"Chain ({hops}-hop):" in text
    assert "Only the last <question> and <answer> after your reasoning are read." in text
    assert "{" not in text and "}" not in text  # every placeholder filled


def test_prompt_file_is_one_versioned_user_turn():
    template = load_prompt(proposer.PROMPT_NAME)
    assert template.name == "drfree_proposer.v1" and [role for role, _ in template.messages] == ["user"]
    assert template.fields == {"start", "target", "hops", "relation_count", "chain", "passages", "bridges",
                               "min_words", "max_words", "self_check"}
    with pytest.raises(ValueError, match="hops must be an integer >= 1"):
        proposer.question_word_range(0)


@pytest.mark.parametrize("text, question, answer, think", [
    # drafts inside the reasoning do not count; the last pair after it does
    ("<think>try <question>Draft?</question><answer>D</answer></think><question>Q?</question><answer>A</answer>",
     "Q?", "A", "try <question>Draft?</question><answer>D</answer>"),
    # several attempts after the reasoning: the final ones
    ("<think>r</think><question>First?</question><answer>one</answer><question>Second?</question><answer>two</answer>",
     "Second?", "two", "r"),
    # a second reasoning block: only what follows the last one is read
    ("<think>a</think><question>Old?</question><answer>x</answer><think>b</think><question>New?</question>"
     "<answer>y</answer>", "New?", "y", "a\nb"),
    ("<think>a</think><question>Only before?</question><answer>x</answer><think>b</think>", None, None, "a\nb"),
    # no reasoning block: the whole reply, final tags
    ("<question>A?</question><answer>1</answer><question>B?</question><answer>2</answer>", "B?", "2", None),
    # an unclosed final block falls back to the last closed one
    ("<think>r</think><question>Q1?</question><answer>a1</answer><question>Q2?", "Q1?", "a1", "r"),
    ("<think></think><question>Q?</question><answer>A</answer>", "Q?", "A", ""),
    ("no tags at all", None, None, None),
])
def test_final_tags_are_read(text, question, answer, think):
    out = proposer.parse_proposer_output(text)
    assert (out.question, out.answer, out.think) == (question, answer, think)


def test_format_score_and_gate_use_the_final_tags():
    first_wrong = ("<think>I follow the chain.</think><question>Who scored Crouching Tiger?</question>"
                   "<answer>Tan Dun</answer><question>Where was the director of Crouching Tiger born?</question>"
                   "<answer>Pingtung County</answer>")
    assert format_score(first_wrong, "Pingtung County") == 1.0
    assert check_proposal(first_wrong, CHAIN_2).gated
    last_wrong = reply("Where was the director of Crouching Tiger born?", "Pingtung County") + \
        "<question>Who scored Crouching Tiger?</question><answer>Tan Dun</answer>"
    assert format_score(last_wrong, "Pingtung County") == pytest.approx(2 / 3)  # wrong target at the end


def test_proposer_rollout_does_not_stop_at_a_draft_answer(drfree_tokenizer):
    tok, eos = drfree_tokenizer, drfree_tokenizer.eos_token_ids[0]
    text = ("<think>Draft: <question>Who?</question><answer>Ang Lee</answer> too short.</think>"
            "<question>Where was the director of Crouching Tiger born?</question><answer>Pingtung County</answer>")
    prompt = proposer.chain_prompt(CHAIN_2)
    script = tok.encode(proposer.proposer_prompt_text(prompt, tok)) + tok.encode(text) + [eos]
    cfg = RolloutConfig(group_size=1, max_turns=0, max_new_tokens_per_turn=96, max_cache_len=1024 + 96,
                        search=False)
    (t,) = selfplay.proposer_rollout(None, None, tok, [prompt], cfg, seed=0,
                                     logits_fn=scripted_logits_fn([script], eos, tok.vocab_size))
    assert t.end_reason == "eos" and t.answer == "Pingtung County"
    assert tok.decode(t.response_ids).startswith(text)

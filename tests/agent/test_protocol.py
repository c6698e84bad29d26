"""Search-R1 protocol: prompt text, action parsing, observations; fuzzing of the parsers."""

import random
import re

from hypothesis import given, settings, strategies as st

from retrieval.corpus import Hit
from searchjax.agent.protocol import (INVALID_ACTION_OBSERVATION, STOP_STRINGS, Action, build_prompt,
                                      build_prompt_messages, build_user_prompt, format_question,
                                      information_block, parse_action, search_observation)
from searchjax.rewards.qa import extract_answer

# Search-R1 scripts/data_process/nq_search.py, make_prefix(template_type="base"), re-typed from the source.
REFERENCE_PREFIX = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)
# Search-R1 search_r1/llm_agent/generation.py, execute_predictions, the invalid-action branch.
REFERENCE_INVALID = ("\nMy previous action is invalid. If I want to search, I should put the query between <search> "
                     "and </search>. If I want to give the final answer, I should put the answer between <answer> and "
                     "</answer>. Let me try again.\n")


def test_prompt_matches_search_r1():
    assert build_user_prompt("who wrote hamlet") == REFERENCE_PREFIX.format(question="who wrote hamlet?")
    assert build_user_prompt("  Who wrote Hamlet?  ") == REFERENCE_PREFIX.format(question="Who wrote Hamlet?")
    assert build_prompt_messages("x") == [{"role": "user", "content": REFERENCE_PREFIX.format(question="x?")}]
    assert format_question("a?") == "a?" and format_question("a ?") == "a ?" and format_question("a.") == "a.?"
    assert "<answer> Beijing </answer>" in build_user_prompt("q")


def test_prompt_errors():
    import pytest
    with pytest.raises(ValueError, match="empty"):
        format_question("   ")
    with pytest.raises(TypeError):
        format_question(None)


def test_build_prompt_goes_through_the_chat_template():
    class RecordingTokenizer:
        def apply_chat_template(self, messages, add_generation_prompt=True):
            self.seen = (messages, add_generation_prompt)
            return "<|user|>" + messages[0]["content"] + "<|assistant|>"

    tok = RecordingTokenizer()
    text = build_prompt("who wrote hamlet", tok)
    assert tok.seen == (build_prompt_messages("who wrote hamlet"), True)
    assert text == "<|user|>" + REFERENCE_PREFIX.format(question="who wrote hamlet?") + "<|assistant|>"


def test_observations_match_search_r1():
    assert INVALID_ACTION_OBSERVATION == REFERENCE_INVALID
    assert information_block("  Doc 1(Title: \"A\") x\n") == '\n\n<information>Doc 1(Title: "A") x</information>\n\n'
    hits = [Hit(id="1", title="Paris", text="Paris is the capital.", score=2.0),
            Hit(id="7", title="France", text="France is a country.\nSecond line.", score=1.0)]
    expected = ('\n\n<information>Doc 1(Title: "Paris") Paris is the capital.\n'
                'Doc 2(Title: "France") France is a country.\nSecond line.</information>\n\n')
    assert search_observation(hits) == expected
    assert STOP_STRINGS == ("</search>", "</answer>")


def test_parse_action_cases():
    assert parse_action("<think>x</think>\n<search> capital of France </search>") == Action("search", "capital of France")
    assert parse_action("<answer> Paris </answer>") == Action("answer", "Paris")
    assert parse_action("<answer>A</answer><search>q</search>") == Action("answer", "A")      # first block wins
    assert parse_action("<search>q</search><answer>A</answer>") == Action("search", "q")
    assert parse_action("<search>unclosed <answer>A</answer>") == Action("answer", "A")       # regex semantics
    assert parse_action("<search>q <answer>A</answer></search>") == Action("search", "q <answer>A</answer>")
    assert parse_action("<search>   </search>") == Action("invalid", "")                     # empty query
    assert parse_action("<answer></answer>") == Action("answer", "")
    assert parse_action("I think the answer is Paris.") == Action("invalid", "")
    assert parse_action("<search>q</answer>") == Action("invalid", "")
    assert parse_action("") == Action("invalid", "")


def _search_r1_reference(text):
    m = re.search(r"<(search|answer)>(.*?)</\1>", text, re.DOTALL)
    if not m:
        return Action("invalid", "")
    content = m.group(2).strip()
    if m.group(1) == "search" and not content:
        return Action("invalid", "")
    return Action(m.group(1), content)


_PIECES = ["<search>", "</search>", "<answer>", "</answer>", "<think>", "</think>", "<information>", "<", ">",
           "/", "search", "answer", " ", "\n", "q", "Paris", "é", "\ufffd", "<search", "answer>", "\x00"]


def _random_output(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.8:   # tag soup: unclosed, nested, reordered, empty
        return "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 40)))
    if kind < 0.95:  # arbitrary bytes, including invalid UTF-8, decoded as the tokenizer would
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 200))).decode("utf-8", errors="replace")
    # answer before search, long thinking
    return "<answer>" + "x" * rng.randint(0, 500) + "</answer><search>" + "y" * rng.randint(0, 50) + "</search>"


def test_fuzz_10000_outputs_parse_without_exceptions():
    rng = random.Random(1234)
    for _ in range(10_000):
        text = _random_output(rng)
        action = parse_action(text)
        assert action == _search_r1_reference(text)
        assert action.kind in ("search", "answer", "invalid") and action.content == action.content.strip()
        answer = extract_answer(text)
        assert answer is None or answer == answer.strip()


def test_enormous_outputs_are_linear_time():
    import time
    many_unclosed = "<answer><search>" * 200_000 + "x" * 1_000_000    # 4.2 MB; a regex would go quadratic
    start = time.perf_counter()
    assert parse_action(many_unclosed) == Action("invalid", "")
    assert extract_answer(many_unclosed) is None
    big = "<think>" + "z" * 3_000_000 + "</think><answer> ok </answer>"
    assert parse_action(big) == Action("answer", "ok") and extract_answer(big) == "ok"
    assert time.perf_counter() - start < 5.0


_inner = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40).filter(
    lambda s: "<answer>" not in s and "</answer>" not in s and "<search>" not in s)


@settings(max_examples=400, deadline=None)
@given(prefix=_inner.filter(lambda s: "</search>" not in s), x=_inner, suffix=_inner)
def test_well_formed_single_answer_parses_to_its_content(prefix, x, suffix):
    text = f"{prefix}<answer>{x}</answer>{suffix}"
    assert parse_action(text) == Action("answer", x.strip())
    assert extract_answer(text) == x.strip()


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(data):
    text = data.decode("utf-8", errors="replace")
    assert parse_action(text) == _search_r1_reference(text)
    extract_answer(text)

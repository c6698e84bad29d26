"""The Search-R1 interaction protocol: instruction prompt, action parsing, observations.

The policy reasons inside <think>...</think>, issues a query as <search> query </search>, receives the
retrieved passages as <information>...</information>, and ends with <answer> ... </answer>. Everything
here reproduces Search-R1 (Jin et al. 2025; `scripts/data_process/nq_search.py` for the prompt and
`search_r1/llm_agent/generation.py` for parsing and observations) so that checkpoints trained with it
see exactly the text they were trained on:

* prompt: one user message, `SEARCH_R1_INSTRUCTION + question + "\\n"`, where the question is stripped and
  gets a "?" appended when it does not end with one; the tokenizer's chat template is applied on top
  (Search-R1 does so whenever the tokenizer has one).
* action: the first `<search>...</search>` or `<answer>...</answer>` block of the turn's text wins (regex
  `<(search|answer)>(.*?)</\\1>`, DOTALL, first match), content stripped. One deliberate difference: an
  empty `<search></search>` is an invalid action here (Search-R1 sends the empty query to the retriever);
  docs/architecture.md ("Metric definitions") counts only searches with a non-empty query, and the invalid-action observation tells the
  model how to write one.
* observations: a search result is `"\\n\\n<information>" + passages.strip() + "</information>\\n\\n"`; an
  invalid action gets `INVALID_ACTION_OBSERVATION`; an answer ends the trajectory.

Passages are rendered by `retrieval.corpus.format_passages` (Search-R1's `Doc i(Title: ...) text` lines).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Sequence

from retrieval.corpus import format_passages
from searchjax.rewards.qa import ANSWER_CLOSE, ANSWER_OPEN

SEARCH_OPEN = "<search>"
SEARCH_CLOSE = "</search>"
INFORMATION_OPEN = "<information>"
INFORMATION_CLOSE = "</information>"
# Generation stops at the end of an action; the host then parses it (docs/architecture.md, "The host loop").
STOP_STRINGS = (SEARCH_CLOSE, ANSWER_CLOSE)

# Search-R1's `make_prefix(template_type="base")`, verbatim (including its "as many times as your want"):
# models trained with the protocol were trained on exactly these bytes.
SEARCH_R1_INSTRUCTION = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query "
    "</search> and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> "
    "and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: "
)

# Search-R1's observation for a turn with neither a closed <search> nor a closed <answer> block, verbatim.
INVALID_ACTION_OBSERVATION = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)


@dataclasses.dataclass(frozen=True)
class Action:
    """The parsed action of one turn: kind "search" (content = the query), "answer" or "invalid" (content "")."""

    kind: Literal["search", "answer", "invalid"]
    content: str


INVALID = Action("invalid", "")


def format_question(question: str) -> str:
    """Search-R1's question preprocessing: strip, then append "?" unless the question already ends with one."""
    if not isinstance(question, str):
        raise TypeError(f"format_question: question must be str, got {type(question).__name__}")
    question = question.strip()
    if not question:
        raise ValueError("format_question: the question is empty")
    return question if question.endswith("?") else question + "?"


def build_user_prompt(question: str) -> str:
    """The user-message text: instruction, formatted question, newline (exactly Search-R1's prefix)."""
    return f"{SEARCH_R1_INSTRUCTION}{format_question(question)}\n"


def build_prompt_messages(question: str) -> list[dict]:
    """Chat messages for one question: a single user turn, as in Search-R1's data files (no system turn)."""
    return [{"role": "user", "content": build_user_prompt(question)}]


def build_prompt(question: str, tokenizer) -> str:
    """The full prompt text: `build_prompt_messages` through the tokenizer's chat template, ready to decode from.

    `tokenizer` is a `searchjax.tokenization.Tokenizer` (or anything with
    `apply_chat_template(messages, add_generation_prompt=True) -> str`).
    """
    return tokenizer.apply_chat_template(build_prompt_messages(question), add_generation_prompt=True)


def _first_closed_block(text: str, open_tag: str, close_tag: str) -> tuple[int, str] | None:
    """(start, content) of the earliest `open_tag ... close_tag` block, content up to the first close tag.

    Only the first opening tag can start the earliest block: if it has no closing tag after it, no later
    opening tag has one either. Linear time, unlike a backtracking regex over many unclosed tags.
    """
    start = text.find(open_tag)
    if start < 0:
        return None
    end = text.find(close_tag, start + len(open_tag))
    if end < 0:
        return None
    return start, text[start + len(open_tag):end]


def parse_action(text: str) -> Action:
    """The action of one turn: the first closed <search> or <answer> block wins; content is stripped.

    Same result as Search-R1's `re.search(r"<(search|answer)>(.*?)</\\1>", text, re.DOTALL)`, except that a
    search whose stripped query is empty is "invalid" (see the module docstring). Never raises on any str.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_action: expected the turn's text (str), got {type(text).__name__}")
    search = _first_closed_block(text, SEARCH_OPEN, SEARCH_CLOSE)
    answer = _first_closed_block(text, ANSWER_OPEN, ANSWER_CLOSE)
    if search is None and answer is None:
        return INVALID
    if answer is None or (search is not None and search[0] < answer[0]):
        query = search[1].strip()
        return Action("search", query) if query else INVALID
    return Action("answer", answer[1].strip())


def information_block(passages_text: str) -> str:
    """The observation appended after a search: "\\n\\n<information>{text.strip()}</information>\\n\\n"."""
    return f"\n\n{INFORMATION_OPEN}{passages_text.strip()}{INFORMATION_CLOSE}\n\n"


def search_observation(hits: Sequence) -> str:
    """The observation for one query's retrieved hits (best first): Search-R1's passage lines in an information block."""
    return information_block(format_passages(hits))

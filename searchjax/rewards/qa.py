"""Question-answering rewards: SQuAD answer normalisation, exact match, token F1, sub-EM, answer extraction.

These are the outcome rewards of Search-R1 (Jin et al. 2025) and the metrics every evaluation table reports.

Conventions (docs/architecture.md, "Formula conventions"):

* `normalize_answer` is exactly the SQuAD v1.1 evaluation script's: lowercase, drop ASCII punctuation
  (`string.punctuation`), drop the articles a/an/the, collapse whitespace. Nothing more: accents, unicode
  punctuation and number words are kept as they are. Whitespace collapsing is `" ".join(s.split())`, so
  every character `str.split()` treats as whitespace (tab, newline, U+00A0 no-break space, ...) separates
  tokens.
* `exact_match(pred, golds)` = max over golds of [normalize(pred) == normalize(gold)].
* `f1_score(pred, golds)` = max over golds of the SQuAD v1.1 token F1: with p = normalize(pred).split(),
  g = normalize(gold).split() and c = |p ∩ g| as multisets, F1 = 0 if c = 0 else 2 P R / (P + R),
  P = c / |p|, R = c / |g|. As in v1.1 (unlike v2.0), two empty token lists score 0.
* `sub_exact_match(pred, golds)` = max over golds of [normalize(gold) is a substring of normalize(pred)]
  (Search-R1's `subem_check`; a gold that normalises to "" is a substring of anything, as there).
* `extract_answer(response)`: the content of the last `<answer>...</answer>` in the *response*, stripped,
  or None. Pass the generated text only: Search-R1's instruction itself contains `<answer> Beijing </answer>`,
  which is why its scorer, reading prompt + response, needed two matches.

A prediction of None (no answer extracted) scores 0 on every metric.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Sequence

ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 normalisation: lower -> remove ASCII punctuation -> remove articles -> collapse whitespace."""
    if not isinstance(text, str):
        raise TypeError(f"normalize_answer: expected str, got {type(text).__name__}")
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _as_golds(golds: str | Sequence[str], fn: str) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    golds = list(golds)
    if not golds:
        raise ValueError(f"{fn}: golds is empty; every question needs at least one gold answer")
    for i, gold in enumerate(golds):
        if not isinstance(gold, str):
            raise TypeError(f"{fn}: golds[{i}] is {type(gold).__name__}, expected str (convert numbers with str())")
    return golds


def exact_match(prediction: str | None, golds: str | Sequence[str]) -> float:
    """1.0 if the normalised prediction equals some normalised gold, else 0.0 (0.0 for None)."""
    golds = _as_golds(golds, "exact_match")
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str | None, golds: str | Sequence[str]) -> float:
    """SQuAD v1.1 token F1, max over golds (0.0 for None)."""
    golds = _as_golds(golds, "f1_score")
    if prediction is None:
        return 0.0
    pred_tokens = normalize_answer(prediction).split()
    return max(_token_f1(pred_tokens, normalize_answer(g).split()) for g in golds)


def sub_exact_match(prediction: str | None, golds: str | Sequence[str]) -> float:
    """1.0 if some normalised gold is a substring of the normalised prediction (Search-R1 subem), else 0.0."""
    golds = _as_golds(golds, "sub_exact_match")
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(g) in pred for g in golds))


def extract_answer(response: str) -> str | None:
    """Content of the last `<answer>...</answer>` block of `response`, stripped; None if there is none.

    Blocks are matched left to right, each from an opening tag to the first closing tag after it (the
    non-overlapping matches of the regex `<answer>(.*?)</answer>` with DOTALL); the last one wins. The scan
    uses `str.find`, so it is linear in the length of the text even for outputs full of unclosed tags.
    """
    if not isinstance(response, str):
        raise TypeError(f"extract_answer: expected the response text (str), got {type(response).__name__}")
    last = None
    pos = 0
    while True:
        start = response.find(ANSWER_OPEN, pos)
        if start < 0:
            break
        content_start = start + len(ANSWER_OPEN)
        end = response.find(ANSWER_CLOSE, content_start)
        if end < 0:  # no later opening tag can be closed either
            break
        last = response[content_start:end]
        pos = end + len(ANSWER_CLOSE)
    return None if last is None else last.strip()

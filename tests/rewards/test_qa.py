"""QA rewards against hand-computed values and the SQuAD v1.1 evaluation formulas re-derived here."""

import collections
import re
import string

import pytest
from hypothesis import given, settings, strategies as st

from searchjax.rewards.qa import exact_match, extract_answer, f1_score, normalize_answer, sub_exact_match


# --- the official SQuAD v1.1 evaluate-v1.1.py formulas, written out independently -------------------------
def squad_normalize(s):
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def squad_f1(prediction, ground_truth):
    p = squad_normalize(prediction).split()
    g = squad_normalize(ground_truth).split()
    common = collections.Counter(p) & collections.Counter(g)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(p)
    recall = 1.0 * num_same / len(g)
    return (2 * precision * recall) / (precision + recall)


def squad_em(prediction, ground_truth):
    return squad_normalize(prediction) == squad_normalize(ground_truth)


def squad_max_over(metric, prediction, golds):
    return max(metric(prediction, g) for g in golds)


# --- normalisation corner cases ----------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("The Beatles", "beatles"),
    ("  a  Tale of   Two Cities ", "tale of two cities"),
    ("An apple, the pie.", "apple pie"),
    ("Theatre", "theatre"),                      # article only on word boundaries
    ("U.S.A.", "usa"),
    ("rock-n-roll!", "rocknroll"),               # hyphen is ASCII punctuation: dropped, not split
    ("New\tYork\nCity", "new york city"),
    ("New\xa0York", "new york"),                 # U+00A0 is whitespace for str.split()
    ("Zürich", "zürich"),                        # accents kept
    ("“Quoted”", "“quoted”"),                    # unicode quotes are not string.punctuation
    ("Ⅻ and ½", "ⅻ and ½"),
    ("", ""),
    ("the a an", ""),
    ("THE END", "end"),
])
def test_normalize_answer_cases(text, expected):
    assert normalize_answer(text) == expected
    assert squad_normalize(text) == expected


def test_exact_match_hand_cases():
    assert exact_match("the Beatles!", ["Beatles"]) == 1.0
    assert exact_match("Beatles band", ["Beatles"]) == 0.0
    assert exact_match("Paris", ["London", "paris", "Rome"]) == 1.0   # max over golds
    assert exact_match("Paris", "Paris") == 1.0                       # a single gold as str
    assert exact_match("", ["Paris"]) == 0.0
    assert exact_match("", [""]) == 1.0                               # equal normalised strings
    assert exact_match(None, ["Paris"]) == 0.0
    assert exact_match("Zurich", ["Zürich"]) == 0.0                   # no accent stripping
    assert exact_match("New\xa0York", ["new york"]) == 1.0


def test_f1_hand_cases():
    # pred tokens [barack, obama, jr], gold [barack, obama]: P = 2/3, R = 1, F1 = 2*(2/3)/(5/3) = 0.8
    assert f1_score("Barack Obama Jr.", ["Barack Obama"]) == pytest.approx(0.8)
    # repeated tokens count as a multiset: pred [paris, paris], gold [paris]: c = 1, P = 1/2, R = 1 -> 2/3
    assert f1_score("paris paris", ["Paris"]) == pytest.approx(2 / 3)
    # max over golds: vs "new york" F1 = 1; vs "york" F1 = 2*(1/2*1)/(3/2) = 2/3
    assert f1_score("New York", ["york", "the New York"]) == pytest.approx(1.0)
    assert f1_score("New York", ["york"]) == pytest.approx(2 / 3)
    assert f1_score("", ["Paris"]) == 0.0
    assert f1_score("", [""]) == 0.0                                  # v1.1: no common token -> 0
    assert f1_score("the", ["a"]) == 0.0
    assert f1_score(None, ["Paris"]) == 0.0
    # articles and punctuation vanish before tokenising: pred [cat, sat], gold [cat]: P = 1/2, R = 1 -> 2/3
    assert f1_score("The cat, sat.", ["a cat"]) == pytest.approx(2 / 3)


def test_sub_exact_match_hand_cases():
    assert sub_exact_match("It was the Beatles, of course", ["Beatles"]) == 1.0
    assert sub_exact_match("Beat", ["Beatles"]) == 0.0
    assert sub_exact_match("Paris, France", ["Lyon", "paris"]) == 1.0
    assert sub_exact_match(None, ["Paris"]) == 0.0
    assert sub_exact_match("anything", ["The"]) == 1.0               # empty normalised gold: as Search-R1


def test_golds_validation():
    with pytest.raises(ValueError, match="golds is empty"):
        exact_match("x", [])
    with pytest.raises(TypeError, match=r"golds\[1\]"):
        f1_score("x", ["a", 1990])


_text = st.text(alphabet=st.sampled_from(list("abcAB thea.,!-'\"\xa0\t\nüé½1")), max_size=30)


@settings(max_examples=300, deadline=None)
@given(pred=_text, golds=st.lists(_text, min_size=1, max_size=4))
def test_matches_squad_formulas(pred, golds):
    assert normalize_answer(pred) == squad_normalize(pred)
    assert exact_match(pred, golds) == float(squad_max_over(squad_em, pred, golds))
    assert f1_score(pred, golds) == pytest.approx(squad_max_over(squad_f1, pred, golds))
    assert sub_exact_match(pred, golds) == float(any(squad_normalize(g) in squad_normalize(pred) for g in golds))


# --- answer extraction -------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("<think>x</think><answer> Beijing </answer>", "Beijing"),
    ("<answer>first</answer> then <answer> second </answer>", "second"),   # the last one
    ("<answer>closed</answer><answer>unclosed", "closed"),
    ("<answer>unclosed", None),
    ("no tags", None),
    ("<answer></answer>", ""),
    ("<answer>\n multi\nline \n</answer>", "multi\nline"),
    ("<answer>a<answer>b</answer>", "a<answer>b"),            # regex semantics: first open to first close
    ("</answer><answer>x</answer>", "x"),
])
def test_extract_answer_cases(text, expected):
    assert extract_answer(text) == expected


def _regex_last(text):
    matches = list(re.finditer(r"<answer>(.*?)</answer>", text, re.DOTALL))
    return matches[-1].group(1).strip() if matches else None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<answer>", "</answer>", "x", " y ", "<", ">", "answer", "\n"]), max_size=15))
def test_extract_answer_equals_regex_reference(parts):
    text = "".join(parts)
    assert extract_answer(text) == _regex_last(text)

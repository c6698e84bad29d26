"""LLM-as-judge answer grading (Cycle-Consistent Search, appendix B.2): accuracy beside EM and F1.

The grader sees the question, the gold answers and the system's extracted answer, and replies with one
letter: A = CORRECT, B = INCORRECT, C = NOT_ATTEMPTED (the SimpleQA grading rules of OpenAI's simple-evals,
which the CCS paper adapts; our wording is the versioned prompt file `judges/prompts/answer_grader.v1.txt`,
whose header gives its provenance). The CCS grader samples at temperature 0.1: `GradingConfig.temperature`
states it, and an HTTP judge built with another temperature is refused (the local judge picks the
highest-likelihood letter among the three `choices`, which has no temperature).

    accuracy                 = #CORRECT / #graded
    accuracy_given_attempted = #CORRECT / (#CORRECT + #INCORRECT)

What we chose, and why:

* A missing or blank answer (the agent never wrote <answer>) is NOT_ATTEMPTED by rule, without a judge call:
  it states nothing, which is the grader's own definition of NOT_ATTEMPTED (counted as
  `not_attempted_by_rule`).
* Replies are parsed strictly (`parse_grade`): the whole reply must be a letter, a grade name, or both
  agreeing ("A: CORRECT"). simple-evals takes the first A/B/C anywhere in the reply and defaults to C when
  there is none, which grades prose such as "Based on ..." as B and silently scores failures; here a reply
  that does not parse is asked again once with a correction message (`correction_rounds`), and if it still
  does not parse, or the request failed (timeout, HTTP error, dead endpoint, after the backend's retries),
  the question is *ungraded* (grade None): counted in `ungraded` and `failures/<kind>`, excluded from the
  accuracy's denominator, never scored.
* Identical requests (same prompt text and judge) are asked once: within a call by deduplication, across
  calls through `cache` (a dict the caller may keep) and `GradingConfig.cache_path` (a jsonl of successful
  grades keyed by sha256(judge description + request), so regrading a predictions file costs nothing).
  Failures are never cached.
* Requests go through the judge backends of `searchjax.judges` (`Judge.complete_many`: concurrency limit,
  retries with backoff, token and cost accounting); the summary reports the usage of this call (the
  difference of `judge.usage` snapshots). Every question gets one line in the audit jsonl
  (`GradingConfig.audit_path`): its id, the prompt name and sha256, the request sha256, the judge's
  description (never a key), the replies (and the local judge's letter scores), the grade or the error,
  whether it came from the cache, tokens and latency.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
from typing import Mapping, MutableMapping, Sequence

from searchjax.judges.base import Judge, JudgeError, JudgeReply, JudgeRequest
from searchjax.judges.templates import PromptTemplate, load_prompt, render_prompt

CORRECT, INCORRECT, NOT_ATTEMPTED = "CORRECT", "INCORRECT", "NOT_ATTEMPTED"
GRADES = (CORRECT, INCORRECT, NOT_ATTEMPTED)
LETTERS = ("A", "B", "C")
LETTER_TO_GRADE = dict(zip(LETTERS, GRADES))
GRADE_FIELD = "judge_grade"  # the predictions-record field `attach_grades` writes (a grade or None)
CORRECTION = ('Your previous reply could not be used: {error}. Reply again with only one letter: "A" (CORRECT), '
              '"B" (INCORRECT) or "C" (NOT_ATTEMPTED).')


@dataclasses.dataclass(frozen=True)
class GradingConfig:
    """The grader's knobs."""

    prompt: str = "answer_grader.v1"   # versioned prompt file (name in judges/prompts/ or a path)
    temperature: float = 0.1           # the CCS grader's sampling temperature; an HTTP judge must use it
    max_reply_tokens: int = 8          # the reply is one letter
    correction_rounds: int = 1         # re-asks of a reply that does not parse
    gold_separator: str = " | "        # golds joined into the prompt's {target}
    audit_path: str = ""               # jsonl, one line per question; "" = no audit file
    cache_path: str = ""               # jsonl of successful grades, read and appended; "" = in-memory only

    def __post_init__(self):
        if self.max_reply_tokens < 1 or self.correction_rounds < 0:
            raise ValueError(f"GradingConfig: max_reply_tokens must be >= 1 and correction_rounds >= 0, got {self}")


# --- replies ------------------------------------------------------------------------------------------------

_GRADE_WORDS = {"CORRECT": "A", "INCORRECT": "B", "NOT_ATTEMPTED": "C", "NOT ATTEMPTED": "C"}
_LETTER_AND_GRADE = re.compile(r"^([ABC])\s*[:.)\-]\s*(.+)$", re.IGNORECASE)


def _bare(text: str) -> str:
    return text.strip().strip("\"'`*").rstrip(".!").strip().strip("\"'`*").strip()


def parse_grade(text: str) -> str:
    """The letter A/B/C of a grader reply, or JudgeError("malformed"). Accepted: the letter alone, the grade
    name alone (CORRECT, INCORRECT, NOT_ATTEMPTED / NOT ATTEMPTED), or a letter and a grade that agree
    ("A: CORRECT"); quotes, asterisks and a final full stop around them are ignored; case is ignored."""
    if not isinstance(text, str):
        raise JudgeError("malformed", f"grader reply is {type(text).__name__}, not text")
    bare = _bare(text)
    upper = bare.upper()
    if upper in LETTERS:
        return upper
    if upper in _GRADE_WORDS:
        return _GRADE_WORDS[upper]
    match = _LETTER_AND_GRADE.match(bare)
    if match:
        letter, word = match.group(1).upper(), _bare(match.group(2)).upper()
        if _GRADE_WORDS.get(word) == letter:
            return letter
        raise JudgeError("malformed", f"grader reply names letter {letter} but grade {word!r}: {text[:200]!r}")
    raise JudgeError("malformed", f"grader reply is not one of A/B/C: {text[:200]!r}")


# --- requests -----------------------------------------------------------------------------------------------

def grading_request(question: str, golds: Sequence[str], answer: str, template: PromptTemplate,
                    cfg: GradingConfig) -> JudgeRequest:
    """The grader's request for one answer; `choices` are the three letters (the local judge scores them)."""
    messages = render_prompt(template, question=question, target=cfg.gold_separator.join(golds),
                             predicted_answer=answer)
    return JudgeRequest(messages=messages, max_tokens=cfg.max_reply_tokens, choices=LETTERS)


def cache_key(judge: Judge, request: JudgeRequest) -> str:
    """sha256 over the judge's description and the request: the same question to another model is a miss."""
    describe = json.dumps(judge.describe(), sort_keys=True, default=str).encode("utf-8")
    return hashlib.sha256(describe + b"\n" + request.canonical_bytes()).hexdigest()


def load_cache(path: str | os.PathLike) -> dict[str, dict]:
    """The cache file's entries {key: {"letter", "reply"}} ({} when the file does not exist)."""
    from searchjax.data.jsonl import iter_jsonl
    if not path or not os.path.exists(path):
        return {}
    cache = {}
    for where, row in iter_jsonl(path):
        if not isinstance(row, dict) or not isinstance(row.get("key"), str) or row.get("letter") not in LETTERS:
            raise ValueError(f"{where}: a grading cache line needs 'key' (str) and 'letter' (A/B/C)")
        cache[row["key"]] = {"letter": row["letter"], "reply": row.get("reply", "")}
    return cache


def _append_jsonl(path: str, rows: Sequence[dict]) -> None:
    if not path or not rows:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _check_record(i: int, record: Mapping) -> tuple[str, str, tuple[str, ...], str | None]:
    where = f"predictions[{i}] (id {record.get('id', '?')!r})" if isinstance(record, Mapping) else f"predictions[{i}]"
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}: expected a predictions record (a dict), got {type(record).__name__}")
    for field in ("id", "question", "golds", "answer"):
        if field not in record:
            raise ValueError(f"{where}: missing field {field!r} (predictions records have id, question, golds, answer)")
    golds = record["golds"]
    if not isinstance(golds, (list, tuple)) or not golds or not all(isinstance(g, str) for g in golds):
        raise ValueError(f"{where}: field 'golds' must be a non-empty list of strings, got {golds!r:.200}")
    if not isinstance(record["question"], str) or not record["question"].strip():
        raise ValueError(f"{where}: field 'question' must be a non-empty string")
    answer = record["answer"]
    if answer is not None and not isinstance(answer, str):
        raise ValueError(f"{where}: field 'answer' must be a string or null, got {answer!r:.200}")
    return str(record["id"]), record["question"], tuple(golds), answer


# --- grading ------------------------------------------------------------------------------------------------

def grade_predictions(predictions: Sequence[Mapping], judge: Judge, cfg: GradingConfig = GradingConfig(), *,
                      cache: MutableMapping[str, dict] | None = None,
                      template: PromptTemplate | None = None) -> tuple[list[str | None], dict]:
    """(grades, summary): a grade in GRADES or None (ungraded) per predictions record, in order, and the summary
    (module docstring): n, graded, ungraded, correct, incorrect, not_attempted, not_attempted_by_rule,
    accuracy, accuracy_given_attempted, requests, deduplicated, cache_hits, failures/<kind>, usage/<field>,
    prompt_name, prompt_sha256, judge, temperature. Never raises on judge failures."""
    described = judge.describe()
    if "temperature" in described and float(described["temperature"]) != cfg.temperature:
        raise ValueError(f"answer grading: the judge samples at temperature {described['temperature']} but "
                         f"GradingConfig.temperature is {cfg.temperature} (the CCS grader uses 0.1): build the "
                         "judge with that temperature or change the config")
    template = template or load_prompt(cfg.prompt)
    checked = [_check_record(i, r) for i, r in enumerate(predictions)]
    cache = {} if cache is None else cache
    if cfg.cache_path:
        for key, value in load_cache(cfg.cache_path).items():
            cache.setdefault(key, value)
    usage_before = judge.usage.snapshot()
    grades: list[str | None] = [None] * len(checked)
    audit: list[dict] = []
    base = {"prompt_name": template.name, "prompt_sha256": template.sha256, "judge": described}
    counts = {"not_attempted_by_rule": 0, "cache_hits": 0, "requests": 0, "deduplicated": 0}
    failures: dict[str, int] = {}

    pending: dict[str, tuple[JudgeRequest, list[int]]] = {}  # cache key -> (request, record indices)
    for i, (qid, question, golds, answer) in enumerate(checked):
        if answer is None or not answer.strip():
            grades[i] = NOT_ATTEMPTED
            counts["not_attempted_by_rule"] += 1
            audit.append({"time": time.time(), "id": qid, "rule": "no answer", "ok": True, "grade": NOT_ATTEMPTED,
                          **base})
            continue
        request = grading_request(question, golds, answer, template, cfg)
        key = cache_key(judge, request)
        if key in cache:
            grades[i] = LETTER_TO_GRADE[cache[key]["letter"]]
            counts["cache_hits"] += 1
            audit.append({"time": time.time(), "id": qid, "cached": True, "ok": True,
                          "request_sha256": request.sha256(), "grade": grades[i], "letter": cache[key]["letter"],
                          "replies": [cache[key]["reply"]], **base})
            continue
        if key in pending:
            counts["deduplicated"] += 1
            pending[key][1].append(i)
        else:
            pending[key] = (request, [i])

    keys = list(pending)
    counts["requests"] = len(keys)
    current = {k: pending[k][0] for k in keys}
    replies: dict[str, list[JudgeReply]] = {k: [] for k in keys}
    outcome: dict[str, str | JudgeError] = {}
    todo = keys
    for round_index in range(cfg.correction_rounds + 1):
        if not todo:
            break
        results = judge.complete_many([current[k] for k in todo])
        retry = []
        for key, result in zip(todo, results):
            if isinstance(result, JudgeError):
                outcome[key] = result
                continue
            replies[key].append(result)
            try:
                outcome[key] = parse_grade(result.text)
            except JudgeError as error:
                outcome[key] = error
                if round_index < cfg.correction_rounds:
                    fix = CORRECTION.format(error=str(error))
                    current[key] = dataclasses.replace(current[key], messages=current[key].messages + (
                        {"role": "assistant", "content": result.text}, {"role": "user", "content": fix}))
                    retry.append(key)
        todo = retry

    new_cache_rows = []
    for key in keys:
        request, members = pending[key]
        result = outcome[key]
        ok = not isinstance(result, JudgeError)
        if ok:
            cache[key] = {"letter": result, "reply": replies[key][-1].text}
            new_cache_rows.append({"key": key, **cache[key]})
        else:
            failures[result.kind] = failures.get(result.kind, 0) + len(members)
        for i in members:
            grades[i] = LETTER_TO_GRADE[result] if ok else None
            audit.append({
                "time": time.time(), "id": checked[i][0], "cached": False, "request_sha256": request.sha256(),
                "grade": grades[i], "letter": result if ok else None, "ok": ok,
                "error_kind": None if ok else result.kind, "error": None if ok else str(result),
                "replies": [r.text for r in replies[key]], "attempts": sum(r.attempts for r in replies[key]),
                "choice_scores": [list(r.choice_scores) if r.choice_scores else None for r in replies[key]],
                "prompt_tokens": sum(r.prompt_tokens for r in replies[key]),
                "completion_tokens": sum(r.completion_tokens for r in replies[key]),
                "latency_s": sum(r.latency_s for r in replies[key]), **base})
    _append_jsonl(cfg.cache_path, new_cache_rows)
    _append_jsonl(cfg.audit_path, audit)

    usage_after = judge.usage.snapshot()
    summary = grade_summary(grades)
    summary.update(counts)
    summary.update({f"failures/{kind}": n for kind, n in sorted(failures.items())})
    summary.update({f"usage/{k}": usage_after[k] - usage_before.get(k, 0) for k in usage_after})
    summary.update(prompt_name=template.name, prompt_sha256=template.sha256, judge=described,
                   temperature=cfg.temperature)
    return grades, summary


def grade_summary(grades: Sequence[str | None]) -> dict:
    """Counts and accuracies of a list of grades (None = ungraded): accuracy = correct / graded (None when
    nothing was graded), accuracy_given_attempted = correct / (correct + incorrect)."""
    for g in grades:
        if g is not None and g not in GRADES:
            raise ValueError(f"grade {g!r} is not one of {GRADES} or None")
    correct, incorrect, not_attempted = (sum(g == x for g in grades) for x in GRADES)
    graded = correct + incorrect + not_attempted
    return {"n": len(grades), "graded": graded, "ungraded": len(grades) - graded, "correct": correct,
            "incorrect": incorrect, "not_attempted": not_attempted,
            "accuracy": correct / graded if graded else None,
            "accuracy_given_attempted": correct / (correct + incorrect) if correct + incorrect else None}


def attach_grades(predictions: Sequence[Mapping], grades: Sequence[str | None]) -> list[dict]:
    """Copies of the records with GRADE_FIELD set (a grade or None); what launch/report.py reads."""
    if len(predictions) != len(grades):
        raise ValueError(f"attach_grades: {len(predictions)} records but {len(grades)} grades")
    return [{**r, GRADE_FIELD: g} for r, g in zip(predictions, grades)]


def summary_by_source(records: Sequence[Mapping]) -> list[dict]:
    """Per data source (sorted), then "all" when there are several: n, EM, F1 and the judge's grade counts and
    accuracy, from records carrying em, f1 and GRADE_FIELD (accuracy beside EM and F1)."""
    groups: dict[str, list[Mapping]] = {}
    for r in records:
        groups.setdefault(str(r["data_source"]), []).append(r)
    named = sorted(groups.items())
    if len(named) != 1:
        named.append(("all", list(records)))
    rows = []
    for source, members in named:
        n = len(members)
        row = {"data_source": source, "n": n, "em": sum(float(r["em"]) for r in members) / n,
               "f1": sum(float(r["f1"]) for r in members) / n}
        row.update({k: v for k, v in grade_summary([r.get(GRADE_FIELD) for r in members]).items() if k != "n"})
        rows.append(row)
    return rows

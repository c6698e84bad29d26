r"""Dr.Free's audits of generated questions (the paper's Tables 4, 5 and 14); each writes its table as markdown
and jsonl (`write_table`).

Input: `AuditQuestion`s (`read_questions`: the qa_pairs.jsonl of searchjax.experiment.self_evolution, or any
jsonl with the same fields, e.g. a Dr.Zero-style proposer's output): the question, the proposer's answer and
aliases, the hop label, the searches the proposer made while writing it (the chain proposer: 0; the w/o KG
proposer of searchjax/drfree/search_proposer.py: its executed searches), and its passages (passages[0] the
seed/source passage, passages[k] the k-th chain component, or what the k-th search returned), tagged with
the method that produced it.

Table 4, proposer behaviour, over one method's multi-hop-labelled questions (hops >= 2):
    no_search       share generated without any search (num_searches = 0)
    answer_in_seed  share whose answer occurs in the seed passage (`proposer.mentions`: SQuAD-normalised, on
                    token boundaries), i.e. answerable from the seed alone whatever the label says
each with a Wilson 95 % interval (searchjax.eval.stats.wilson_interval).

Table 5, gold-blind counterfactual audit: for each question, independent judge calls, one per condition
    closed_book   the question alone
    source        the seed passage alone
    retrieval     the top-k passages of one retrieval with the question (when a retriever is given)
    hop_k         the k-th chain component alone, k = 1..h (questions with chain passages)
The judge (temperature 0, JSON {"answer": ...}, prompts drfree_audit_closed_book.v1 and drfree_audit_evidence.v1
under searchjax/judges/prompts/) sees the question and the condition's evidence only, never the gold answer;
under the evidence conditions it must abstain unless the evidence uniquely supports one answer. Afterwards:
    shortcut(q, c) = [the judge answered under c  and  EM(its answer, q's answer and aliases) = 1]
Per method and condition: the shortcut rate with its Wilson 95 % interval; "any" = a shortcut under at least
one condition. Between two methods A and B, the one-sided Fisher exact test of "A's rate > B's" on
[[s_A, n_A - s_A], [s_B, n_B - s_B]] (searchjax.eval.stats.fisher_exact, alternative "greater").

Table 14, train-test overlap: a generated training question t and an evaluation question e overlap when
    J(t, e) = |T & E| / |T | E| >= 0.6   (T, E: the sets of normalize_answer tokens of the two questions)
and they share an answer alias after normalize_answer. Per evaluation set: the evaluation questions that
overlap some training question, their share (Wilson 95 %), and the overlapping pairs.

The paper's own text for these tables (and appendix A.12's judge instructions) was not available to us:
the definitions above follow the descriptions of its tables, the judge wording is ours.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import pathlib
from typing import Mapping, Sequence

from retrieval.corpus import Passage, format_passages
from searchjax.drfree.proposer import mentions
from searchjax.rewards.qa import exact_match, normalize_answer

CLOSED_BOOK_PROMPT = "drfree_audit_closed_book.v1"
EVIDENCE_PROMPT = "drfree_audit_evidence.v1"
ABSTAIN = "abstain"  # normalize_answer of the judge's abstention reply
OVERLAP_THRESHOLD = 0.6
_FIELDS = ("question", "answer", "hops", "passages")


@dataclasses.dataclass(frozen=True)
class AuditQuestion:
    """One generated question. passages: ((title, text), ...), passages[0] the seed; [k] the k-th component."""

    id: str
    question: str
    answer: str
    method: str
    hops: int
    num_searches: int = 0
    aliases: tuple[str, ...] = ()
    passages: tuple[tuple[str, str], ...] = ()

    @property
    def golds(self) -> tuple[str, ...]:
        return (self.answer, *self.aliases)


def read_questions(path: str | os.PathLike, method: str) -> list[AuditQuestion]:
    """AuditQuestions of a jsonl (fields: uid or id, question, answer, hops, passages [{"title","text"}], and
    optionally num_searches, golden_answers / aliases); a bad row raises naming the file, line and field."""
    out = []
    for n, line in enumerate(pathlib.Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not JSON ({error})") from None
        missing = [f for f in _FIELDS if f not in row] + ([] if "uid" in row or "id" in row else ["uid"])
        if missing:
            raise ValueError(f"{where}: missing field(s) {missing}")
        passages = row["passages"]
        if not isinstance(passages, list) or not passages or \
                not all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in passages):
            raise ValueError(f"{where}: field 'passages' must be a non-empty list of {{'title', 'text'}}")
        if isinstance(row["hops"], bool) or not isinstance(row["hops"], int) or row["hops"] < 1:
            raise ValueError(f"{where}: field 'hops' must be an integer >= 1, got {row['hops']!r}")
        aliases = [a for a in row.get("aliases", row.get("golden_answers", [])) if a != row["answer"]]
        out.append(AuditQuestion(id=str(row.get("uid", row.get("id"))), question=str(row["question"]),
                                 answer=str(row["answer"]), method=method, hops=row["hops"],
                                 num_searches=int(row.get("num_searches", 0)), aliases=tuple(aliases),
                                 passages=tuple((str(p.get("title", "")), p["text"]) for p in passages)))
    return out


def rate(count: int, n: int) -> dict:
    """{"count", "n", "rate", "ci_low", "ci_high"}: count / n with its Wilson 95 % interval (None when n = 0)."""
    if n == 0:
        return {"count": count, "n": 0, "rate": None, "ci_low": None, "ci_high": None}
    from searchjax.eval.stats import wilson_interval  # lazily: the audit needs scipy only when it runs
    low, high = wilson_interval(count, n, 0.95)
    return {"count": count, "n": n, "rate": count / n, "ci_low": low, "ci_high": high}


def _by_method(items, key=lambda x: x.method) -> dict:
    groups: dict = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return groups


# ------------------------------------------------------------------------------------------------------
# Table 4: proposer behaviour
# ------------------------------------------------------------------------------------------------------
def proposer_behaviour(questions: Sequence[AuditQuestion]) -> list[dict]:
    """Table 4 rows, one per method and measure (module docstring), over the multi-hop-labelled questions."""
    rows = []
    for method, items in _by_method(questions).items():
        multi = [q for q in items if q.hops >= 2]
        measures = {"no_search": sum(q.num_searches == 0 for q in multi),
                    "answer_in_seed": sum(mentions(q.passages[0][1], q.answer) for q in multi if q.passages)}
        for measure, count in measures.items():
            rows.append({"table": 4, "method": method, "measure": measure, **rate(count, len(multi))})
    return rows


# ------------------------------------------------------------------------------------------------------
# Table 5: gold-blind counterfactual audit
# ------------------------------------------------------------------------------------------------------
def audit_conditions(q: AuditQuestion, with_retrieval: bool) -> list[str]:
    """The conditions of question q: closed_book, source, retrieval (with a retriever), hop_1..hop_h."""
    components = [f"hop_{k}" for k in range(1, min(q.hops, len(q.passages) - 1) + 1)]
    return ["closed_book", "source"] + (["retrieval"] if with_retrieval else []) + components


def audit_request(question: str, evidence: str | None):
    """The judge request of one condition: closed book when evidence is None. Nothing else goes in, in
    particular never the gold answer (the signature has no place for it)."""
    from searchjax.judges import JudgeRequest, load_prompt, render_prompt
    if evidence is None:
        messages = render_prompt(load_prompt(CLOSED_BOOK_PROMPT), question=question)
    else:
        messages = render_prompt(load_prompt(EVIDENCE_PROMPT), question=question, evidence=evidence)
    return JudgeRequest(messages=tuple(messages), max_tokens=64)


def condition_evidence(q: AuditQuestion, condition: str, retrieved: Sequence | None) -> str | None:
    """The evidence text the judge sees under `condition` (None = closed book)."""
    if condition == "closed_book":
        return None
    if condition == "retrieval":
        return format_passages(retrieved)
    k = 0 if condition == "source" else int(condition.split("_")[1])
    title, text = q.passages[k]
    return format_passages([Passage(id=f"{q.id}/{k}", title=title, text=text)])


def counterfactual_audit(questions: Sequence[AuditQuestion], judge, retriever=None, *, topk: int = 3) -> list[dict]:
    """Table 5's judge calls: one record per (question, condition) with the judge's answer, abstention,
    shortcut flag (compared with the gold only here, after the call) and any judge error.

    judge: a searchjax.judges.Judge at temperature 0 (a judge whose describe() reports another temperature
    is refused); retriever: anything with .search(queries, topk), or None to skip the retrieval condition.
    """
    from searchjax.judges import ask_json_many
    temperature = judge.describe().get("temperature", 0.0)
    if temperature:
        raise ValueError(f"counterfactual_audit: the judge must decode at temperature 0 (appendix A.12), "
                         f"got {temperature}")
    questions = list(questions)
    retrieved = retriever.search([q.question for q in questions], topk) if retriever is not None and questions \
        else [None] * len(questions)
    cells = [(q, c, audit_request(q.question, condition_evidence(q, c, hits)))
             for q, hits in zip(questions, retrieved) for c in audit_conditions(q, retriever is not None)]
    outcomes = ask_json_many(judge, [request for _, _, request in cells], {"answer": str})
    records = []
    for (q, condition, _), outcome in zip(cells, outcomes):
        answer = outcome.parsed["answer"].strip() if outcome.ok else None
        abstained = answer is None or normalize_answer(answer) in ("", ABSTAIN)
        records.append({"method": q.method, "id": q.id, "hops": q.hops, "condition": condition,
                        "judge_answer": answer, "abstained": abstained,
                        "shortcut": bool(not abstained and exact_match(answer, q.golds)),
                        "error": None if outcome.ok else str(outcome.error)})
    return records


def shortcut_table(records: Sequence[dict]) -> list[dict]:
    """Table 5 rows: per method and condition (and "any"), the shortcut rate with its Wilson interval."""
    rows = []
    for method, items in _by_method(records, key=lambda r: r["method"]).items():
        per_question = _by_method(items, key=lambda r: r["id"])
        conditions = list(dict.fromkeys(r["condition"] for r in items))
        for condition in conditions:
            cell = [r for r in items if r["condition"] == condition]
            rows.append({"table": 5, "method": method, "condition": condition,
                         **rate(sum(r["shortcut"] for r in cell), len(cell)),
                         "abstain_rate": sum(r["abstained"] for r in cell) / len(cell),
                         "errors": sum(r["error"] is not None for r in cell)})
        hits = sum(any(r["shortcut"] for r in rs) for rs in per_question.values())
        rows.append({"table": 5, "method": method, "condition": "any", **rate(hits, len(per_question)),
                     "abstain_rate": None, "errors": sum(r["error"] is not None for r in items)})
    return rows


def fisher_comparisons(table_rows: Sequence[dict]) -> list[dict]:
    """One-sided Fisher exact p of "A's shortcut rate > B's" for every ordered method pair and condition."""
    from searchjax.eval.stats import fisher_exact
    cells = {(r["method"], r["condition"]): r for r in table_rows if r["n"]}
    methods = list(dict.fromkeys(m for m, _ in cells))
    rows = []
    for a, b in itertools.permutations(methods, 2):
        for condition in dict.fromkeys(c for m, c in cells if m == a):
            if (b, condition) not in cells:
                continue
            ra, rb = cells[a, condition], cells[b, condition]
            table = [[ra["count"], ra["n"] - ra["count"]], [rb["count"], rb["n"] - rb["count"]]]
            rows.append({"table": 5, "condition": condition, "method_a": a, "method_b": b,
                         "rate_a": ra["rate"], "rate_b": rb["rate"], "p_a_greater": fisher_exact(table, "greater")})
    return rows


# ------------------------------------------------------------------------------------------------------
# Table 14: train-test overlap
# ------------------------------------------------------------------------------------------------------
def token_jaccard(a: str, b: str) -> float:
    """|A & B| / |A | B| of the normalize_answer token sets (0 when both are empty)."""
    ta, tb = set(normalize_answer(a).split()), set(normalize_answer(b).split())
    union = ta | tb
    return len(ta & tb) / len(union) if union else 0.0


def train_test_overlap(train: Sequence[AuditQuestion], eval_sets: Mapping[str, Sequence],
                       threshold: float = OVERLAP_THRESHOLD) -> tuple[list[dict], list[dict]]:
    """(Table 14 rows, overlapping pairs). eval_sets: name -> rollout Prompts (question, golden_answers)."""
    by_alias: dict[str, list[AuditQuestion]] = {}
    for t in train:  # candidate pairs share a normalised alias: only those need a Jaccard
        for alias in {normalize_answer(g) for g in t.golds} - {""}:
            by_alias.setdefault(alias, []).append(t)
    rows, pairs = [], []
    for name, prompts in eval_sets.items():
        overlapping = 0
        for e in prompts:
            candidates = {id(t): t for alias in {normalize_answer(g) for g in e.golden_answers} - {""}
                          for t in by_alias.get(alias, [])}
            matches = [(t, token_jaccard(t.question, e.question)) for t in candidates.values()]
            matches = [(t, j) for t, j in matches if j >= threshold]
            overlapping += bool(matches)
            pairs += [{"table": 14, "eval_set": name, "eval_id": e.uid, "eval_question": e.question,
                       "train_id": t.id, "train_question": t.question, "method": t.method, "jaccard": j}
                      for t, j in matches]
        rows.append({"table": 14, "eval_set": name, "train_questions": len(train), **rate(overlapping, len(prompts))})
    return rows, pairs


# ------------------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------------------
def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e-3 and value else f"{value:.3f}"
    return str(value).replace("|", "\\|")


def markdown_table(rows: Sequence[dict]) -> str:
    """A markdown table of dict rows (columns: the keys in first-seen order)."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_table(rows: Sequence[dict], out_dir: str | os.PathLike, name: str) -> tuple[pathlib.Path, pathlib.Path]:
    """<out_dir>/<name>.md and <name>.jsonl of the rows."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, jsonl = out / f"{name}.md", out / f"{name}.jsonl"
    md.write_text(markdown_table(rows) if rows else "(no rows)\n")
    jsonl.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows))
    return md, jsonl


def run_audits(pairs: Mapping[str, str | os.PathLike], out_dir: str | os.PathLike, *,
               eval_sets: Mapping[str, Sequence] | None = None, judge=None, retriever=None) -> dict[str, list[dict]]:
    """Every audit over generated questions, each table written under out_dir (`write_table`).

    pairs: method -> its questions' jsonl (`read_questions`), e.g. {"drfree": <run>/iter_3/generation/qa_pairs.jsonl,
    "drzero": ...}. Table 4 always; Table 14 against eval_sets (name -> rollout Prompts; None = the embedded
    default set, `searchjax.data.qa_datasets.default_prompts`); Table 5 (with its Fisher comparisons and the
    per-call records) only when a judge is given.
    """
    questions = [q for method, path in pairs.items() for q in read_questions(path, method)]
    if eval_sets is None:
        from searchjax.data.qa_datasets import default_prompts
        eval_sets = {"default": default_prompts()}
    tables = {"table4_proposer_behaviour": proposer_behaviour(questions)}
    tables["table14_overlap"], tables["table14_overlap_pairs"] = train_test_overlap(questions, eval_sets)
    if judge is not None:
        tables["table5_calls"] = counterfactual_audit(questions, judge, retriever)
        tables["table5_shortcuts"] = shortcut_table(tables["table5_calls"])
        tables["table5_fisher"] = fisher_comparisons(tables["table5_shortcuts"])
    for name, rows in tables.items():
        write_table(rows, out_dir, name)
    return tables

"""Greedy evaluation of the search agent: predictions file and summary table (dataset readers: searchjax.data.qa_datasets).

`evaluate` rolls every question out once with the given RolloutConfig (group_size must be 1; launch/evaluate.py
makes it greedy), in batches, and writes one jsonl line per question:

    {"id", "data_source", "question", "golds", "answer", "em", "f1", "trajectory" (the response text),
     "searches" (executed queries), "doc_ids", "flags": {valid_answer, forced_termination, end_reason,
     num_searches, duplicate_queries, num_turns, invalid_actions, retrieval_errors, truncated_observations},
     "response_tokens", "generated_tokens"}

The summary has one row per data source (sorted), and an "all" row when there are several: n, EM, F1
(searchjax.rewards.qa: SQuAD normalisation, max over golds; no answer scores 0), valid-answer rate, mean
searches, duplicate-query rate and forced-termination rate (searchjax.eval.metrics; definitions in
docs/architecture.md), plus retrieval errors.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
from typing import Iterable, Optional, Sequence

from searchjax.agent.rollout import Prompt, RolloutConfig, Trajectory, rollout
from searchjax.data.jsonl import iter_jsonl
from searchjax.eval.metrics import trajectory_metrics
from searchjax.rewards.qa import exact_match, f1_score

TABLE_COLUMNS = (("data_source", "data source"), ("n", "n"), ("em", "EM"), ("f1", "F1"),
                 ("valid_answer_rate", "valid answer"), ("mean_searches", "mean searches"),
                 ("duplicate_query_rate", "duplicate queries"), ("forced_termination_rate", "forced termination"))


def prediction_record(t: Trajectory) -> dict:
    """One predictions-file line for a trajectory (module docstring)."""
    golds = list(t.prompt.golden_answers)
    return {
        "id": t.prompt.uid, "data_source": t.prompt.data_source, "question": t.prompt.question, "golds": golds,
        "answer": t.answer, "em": exact_match(t.answer, golds), "f1": f1_score(t.answer, golds),
        "trajectory": t.response_text, "searches": list(t.queries), "doc_ids": [list(d) for d in t.doc_ids],
        "flags": {"valid_answer": t.valid_answer, "forced_termination": t.forced_termination,
                  "end_reason": t.end_reason, "num_searches": t.num_searches,
                  "duplicate_queries": t.duplicate_queries, "num_turns": t.num_turns,
                  "invalid_actions": t.invalid_actions, "retrieval_errors": t.retrieval_errors,
                  "truncated_observations": t.truncated_observations},
        "response_tokens": len(t.response_ids), "generated_tokens": int(sum(t.loss_mask)),
    }


@dataclasses.dataclass(frozen=True)
class _Record:
    """What the metrics read from a predictions line (searchjax.eval.metrics' record fields)."""

    queries: tuple
    answer: Optional[str]
    forced: bool


def summary_rows(records: Sequence[dict]) -> list[dict]:
    """Per-data-source rows (sorted by name) and an "all" row, computed from predictions-file records."""
    groups: dict[str, list[dict]] = collections.defaultdict(list)
    for r in records:
        groups[r["data_source"]].append(r)
    named = sorted(groups.items())
    if len(named) != 1:
        named.append(("all", list(records)))
    rows = []
    for source, members in named:
        metrics = trajectory_metrics([_Record(tuple(r["searches"]), r["answer"], r["flags"]["forced_termination"])
                                      for r in members])
        n = len(members)
        rows.append({"data_source": source, "n": n,
                     "em": sum(exact_match(r["answer"], r["golds"]) for r in members) / n,
                     "f1": sum(f1_score(r["answer"], r["golds"]) for r in members) / n,
                     "valid_answer_rate": metrics["answer/valid_rate"], "mean_searches": metrics["search/mean"],
                     "duplicate_query_rate": metrics["search/duplicate_rate"],
                     "forced_termination_rate": metrics["termination/forced_rate"],
                     "retrieval_errors": sum(r["flags"]["retrieval_errors"] for r in members)})
    return rows


def format_table(rows: Sequence[dict]) -> str:
    """A markdown table of summary rows (rates and means to 3 decimals)."""
    header = "| " + " | ".join(title for _, title in TABLE_COLUMNS) + " |"
    lines = [header, "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|"]
    for row in rows:
        cells = [row[k] if isinstance(row[k], (str, int)) else f"{row[k]:.3f}" for k, _ in TABLE_COLUMNS]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def read_predictions(path) -> list[dict]:
    """The records of a predictions jsonl file."""
    return [record for _, record in iter_jsonl(path)]


def _batches(items: Sequence, size: int) -> Iterable[Sequence]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def evaluate(model, params, tokenizer, retriever, prompts: Sequence[Prompt], cfg: RolloutConfig, *,
             batch_size: int, seed: int, predictions_path, progress: bool = True) -> list[dict]:
    """Roll out each prompt once (cfg.group_size must be 1), `batch_size` questions per rollout call; write the
    predictions jsonl (one line per question, in order, flushed after each batch) and return the summary rows."""
    if cfg.group_size != 1:
        raise ValueError(f"evaluate: RolloutConfig.group_size={cfg.group_size}; evaluation rolls each question "
                         "out once (group_size=1)")
    if batch_size < 1:
        raise ValueError(f"evaluate: batch_size={batch_size} must be >= 1")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("evaluate: no prompts")
    from tqdm import tqdm
    predictions_path = pathlib.Path(predictions_path)
    predictions_path.parent.mkdir(parents=True, exist_ok=True)
    records = []
    with predictions_path.open("w", encoding="utf-8") as f, \
            tqdm(total=len(prompts), desc="evaluate", unit="question", disable=not progress) as bar:
        for number, batch in enumerate(_batches(prompts, batch_size)):
            # Each batch samples with its own seed (rows of different batches would otherwise share keys).
            for t in rollout(model, params, tokenizer, retriever, batch, cfg, seed=seed + number):
                record = prediction_record(t)
                records.append(record)
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
            f.flush()
            bar.update(len(batch))
            ems = [r["em"] for r in records]
            bar.set_postfix(em=f"{sum(ems) / len(ems):.3f}")
    return summary_rows(records)

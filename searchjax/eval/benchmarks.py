"""QA benchmarks for the search agent: dataset readers, greedy evaluation, predictions file, summary table.

Readers (each returns `searchjax.agent.rollout.Prompt`s whose uid is f"{data_source}/{id}", so questions of
different datasets never share a group id even when their ids do; a duplicate uid inside one file raises):

* Search-R1 parquet (`scripts/data_process/*_search.py` output; e.g. nq_hotpotqa_train/test.parquet): rows with
  `prompt` (chat messages; the question is the last user message's text after Search-R1's instruction, i.e.
  after its final "Question: ", stripped), `reward_model.ground_truth.target` (gold answers: a list or one
  string), `data_source`; the id is the row's `id` column if present, else `extra_info.index`, else the row
  number.
* FlashRAG jsonl (`<dataset>/<split>.jsonl`): rows `id`, `question`, `golden_answers` (list or one string);
  data source = the `data_source` argument, else the row's own `data_source`, else the dataset name (the parent
  directory when the file is named train/dev/test/val/validation.jsonl, the file stem otherwise). Optional
  `hops` (int, Dr.Free's hop label for HRPO) and `metadata` (object) are carried into the Prompt.
* The embedded default: the 75 FanOutQA dev sub-questions answerable from the default corpus
  (searchjax.data.default_questions), data source "fanoutqa", the evidence article's title in metadata.

`evaluate` rolls every question out once with the given RolloutConfig (group_size must be 1; launch/evaluate.py
makes it greedy), in batches, and writes one jsonl line per question:

    {"id", "data_source", "question", "golds", "answer", "em", "f1", "trajectory" (the response text),
     "searches" (executed queries), "doc_ids", "flags": {valid_answer, forced_termination, end_reason,
     num_searches, duplicate_queries, num_turns, invalid_actions, retrieval_errors, truncated_observations},
     "response_tokens", "generated_tokens"}

The summary has one row per data source (sorted), and an "all" row when there are several: n, EM, F1
(searchjax.rewards.qa: SQuAD normalisation, max over golds; no answer scores 0), valid-answer rate, mean
searches, duplicate-query rate and forced-termination rate (searchjax.eval.metrics, DESIGN.md's
definitions), plus retrieval errors.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import pathlib
from typing import Iterable, Optional, Sequence

from searchjax.agent.protocol import SEARCH_R1_INSTRUCTION
from searchjax.agent.rollout import Prompt, RolloutConfig, Trajectory, rollout
from searchjax.data.jsonl import iter_jsonl
from searchjax.eval.metrics import trajectory_metrics
from searchjax.rewards.qa import exact_match, f1_score

log = logging.getLogger(__name__)

QUESTION_MARKER = "Question: "  # where Search-R1's instruction hands over to the question
_SPLIT_NAMES = ("train", "dev", "test", "val", "validation")
TABLE_COLUMNS = (("data_source", "data source"), ("n", "n"), ("em", "EM"), ("f1", "F1"),
                 ("valid_answer_rate", "valid answer"), ("mean_searches", "mean searches"),
                 ("duplicate_query_rate", "duplicate queries"), ("forced_termination_rate", "forced termination"))


# ------------------------------------------------------------------------------------------------ readers

def _golds(value, where: str, field: str) -> tuple[str, ...]:
    """Gold answers as a tuple of str: a list/array of str (numbers str()-ed) or one string."""
    if isinstance(value, str):
        value = [value]
    elif hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{where}: field {field!r} must be a non-empty list of answers, got {value!r}")
    for a in value:
        if not isinstance(a, (str, int, float)) or isinstance(a, bool):
            raise ValueError(f"{where}: field {field!r} holds {a!r}; answers must be strings (or numbers)")
    return tuple(str(a) for a in value)


def _dedupe_check(prompts: list[Prompt], path) -> list[Prompt]:
    seen: dict[str, int] = {}
    for i, p in enumerate(prompts):
        if p.uid in seen:
            raise ValueError(f"{path}: rows {seen[p.uid]} and {i} have the same data source and id ({p.uid!r}); "
                             "ids must be unique per data source")
        seen[p.uid] = i
    if not prompts:
        raise ValueError(f"{path}: no questions")
    return prompts


def question_from_search_r1_prompt(messages, where: str) -> str:
    """The question inside a Search-R1 `prompt` field: the last user message's text after its final "Question: "."""
    if hasattr(messages, "tolist"):
        messages = messages.tolist()
    if isinstance(messages, str):
        text = messages
    else:
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ValueError(f"{where}: field 'prompt' must be a list of chat messages, got {messages!r:.200}")
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        if not users or not isinstance(users[-1].get("content"), str):
            raise ValueError(f"{where}: field 'prompt' has no user message with a string 'content'")
        text = users[-1]["content"]
    if text.startswith(SEARCH_R1_INSTRUCTION):
        text = text[len(SEARCH_R1_INSTRUCTION):]
    elif QUESTION_MARKER in text:
        text = text[text.rindex(QUESTION_MARKER) + len(QUESTION_MARKER):]
    question = text.strip()
    if not question:
        raise ValueError(f"{where}: field 'prompt' holds no question text")
    return question


def read_search_r1_parquet(path) -> list[Prompt]:
    """Prompts from a Search-R1 parquet file (module docstring)."""
    import pyarrow.parquet as pq
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such Search-R1 parquet file")
    rows = pq.read_table(path).to_pylist()
    prompts = []
    for i, row in enumerate(rows):
        where = f"{path} row {i}"
        for field in ("prompt", "reward_model", "data_source"):
            if field not in row:
                raise ValueError(f"{where}: missing field {field!r} (Search-R1 rows have prompt, "
                                 "reward_model.ground_truth.target, data_source)")
        try:
            target = row["reward_model"]["ground_truth"]["target"]
        except (KeyError, TypeError):
            raise ValueError(f"{where}: missing field 'reward_model.ground_truth.target'") from None
        if row.get("id") is not None:
            qid = row["id"]
        elif isinstance(row.get("extra_info"), dict) and row["extra_info"].get("index") is not None:
            qid = row["extra_info"]["index"]
        else:
            qid = i
        source = str(row["data_source"])
        prompts.append(Prompt(uid=f"{source}/{qid}", question=question_from_search_r1_prompt(row["prompt"], where),
                              golden_answers=_golds(target, where, "reward_model.ground_truth.target"),
                              data_source=source, metadata={"id": str(qid)}))
    return _dedupe_check(prompts, path)


def read_flashrag_jsonl(path, data_source: str = "") -> list[Prompt]:
    """Prompts from a FlashRAG jsonl file (module docstring)."""
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such FlashRAG jsonl file")
    default_source = path.parent.name if path.stem in _SPLIT_NAMES and path.parent.name else path.stem
    prompts = []
    for where, row in iter_jsonl(path):
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object with id, question, golden_answers")
        for field in ("id", "question", "golden_answers"):
            if field not in row:
                raise ValueError(f"{where}: missing field {field!r} (FlashRAG rows have id, question, "
                                 "golden_answers)")
        if not isinstance(row["question"], str) or not row["question"].strip():
            raise ValueError(f"{where}: field 'question' must be a non-empty string")
        source = data_source or str(row.get("data_source") or default_source)
        extra = row.get("metadata", {})
        if not isinstance(extra, dict):
            raise ValueError(f"{where}: field 'metadata' must be a JSON object, got {extra!r:.100}")
        try:
            hops = int(row.get("hops", 0))
        except (TypeError, ValueError):
            raise ValueError(f"{where}: field 'hops' must be an integer, got {row['hops']!r}") from None
        prompts.append(Prompt(uid=f"{source}/{row['id']}", question=row["question"].strip(),
                              golden_answers=_golds(row["golden_answers"], where, "golden_answers"),
                              data_source=source, hops=hops, metadata={**extra, "id": str(row["id"])}))
    return _dedupe_check(prompts, path)


def default_prompts() -> list[Prompt]:
    """The embedded default: 75 FanOutQA sub-questions answerable from the default corpus."""
    from searchjax.data.default_questions import default_questions
    return [Prompt(uid=f"fanoutqa/{q.id}", question=q.question, golden_answers=tuple(q.golden_answers),
                   data_source="fanoutqa", metadata={"id": q.id, "gold_title": q.gold_title})
            for q in default_questions()]


def load_benchmark(spec: str, *, data_source: str = "") -> list[Prompt]:
    """"default", a Search-R1 `.parquet` file, or a FlashRAG `.jsonl` file ("~" expanded)."""
    if spec == "default":
        return default_prompts()
    spec = str(pathlib.Path(spec).expanduser())
    suffix = pathlib.Path(spec).suffix
    if suffix == ".parquet":
        return read_search_r1_parquet(spec)
    if suffix == ".jsonl":
        return read_flashrag_jsonl(spec, data_source)
    raise ValueError(f"benchmark {spec!r}: expected 'default', a Search-R1 .parquet file or a FlashRAG .jsonl file")


# ---------------------------------------------------------------------------------------------- evaluation

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


def run_from_config(config, workdir) -> list[dict]:
    """launch/evaluate.py's job (configs/evaluate.py names every field): load the model, tokenizer, retriever and
    questions, evaluate greedily, write <workdir>/predictions.jsonl, summary.json, table.md and config.json, print
    the table; returns the summary rows."""
    from searchjax.rl.setup import build_retriever, load_policy
    workdir = pathlib.Path(workdir).expanduser()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(json.dumps(config.to_dict(), indent=2, default=str))
    prompts = load_benchmark(config.data.path, data_source=config.data.data_source)
    if config.data.limit:
        prompts = prompts[:config.data.limit]
    model, params, tokenizer = load_policy(config.model.path, dtype=config.model.dtype,
                                           tokenizer=config.model.tokenizer, step=config.model.checkpoint_step)
    retriever = build_retriever(config.retrieval)
    cfg = RolloutConfig(group_size=1, temperature=0.0, top_p=1.0, top_k=0, **config.rollout.to_dict())
    log.info("evaluating %s on %d questions of %s with %s", config.model.path, len(prompts), config.data.path, cfg)
    rows = evaluate(model, params, tokenizer, retriever, prompts, cfg, batch_size=config.batch_size, seed=config.seed,
                    predictions_path=workdir / "predictions.jsonl", progress=config.progress)
    table = format_table(rows)
    (workdir / "summary.json").write_text(json.dumps({"rows": rows, "rollout": dataclasses.asdict(cfg)}, indent=2))
    (workdir / "table.md").write_text(table + "\n")
    print(table, flush=True)
    return rows


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

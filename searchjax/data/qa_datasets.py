"""QA dataset readers shared by training and evaluation.

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
"""


from __future__ import annotations

import pathlib

from searchjax.agent.protocol import SEARCH_R1_INSTRUCTION
from searchjax.agent.rollout import Prompt
from searchjax.data.jsonl import iter_jsonl

QUESTION_MARKER = "Question: "  # where Search-R1's instruction hands over to the question
_SPLIT_NAMES = ("train", "dev", "test", "val", "validation")


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


def load_benchmark(spec: str, *, data_source: str = "", manual_dir: str = "") -> list[Prompt]:
    """"default" (the 75 FanOutQA questions), "default_qa:<train|dev|test>" (the default QA set built from the
    corpus, searchjax.data.default_qa), "tfds:<name>/<split>" (a TFDS dataset of searchjax.data.tfds_qa, built
    from `manual_dir` on first use), a Search-R1 `.parquet` file, or a FlashRAG `.jsonl` file ("~" expanded)."""
    if spec == "default":
        return default_prompts()
    if spec.startswith("tfds:"):
        from searchjax.data import tfds_qa
        # The readers are handed down (tfds_qa builds from them) so that tfds_qa never imports this module.
        readers = tfds_qa.Readers(read_flashrag_jsonl, read_search_r1_parquet, default_prompts)
        return tfds_qa.load_spec(spec[len("tfds:"):], manual_dir=manual_dir or None, readers=readers)
    if spec.startswith("default_qa:"):
        from searchjax.data import default_qa
        return read_flashrag_jsonl(default_qa.default_qa_path(spec[len("default_qa:"):]), data_source or "default_qa")
    spec = str(pathlib.Path(spec).expanduser())
    suffix = pathlib.Path(spec).suffix
    if suffix == ".parquet":
        return read_search_r1_parquet(spec)
    if suffix == ".jsonl":
        return read_flashrag_jsonl(spec, data_source)
    raise ValueError(f"benchmark {spec!r}: expected 'default', 'default_qa:<split>', 'tfds:<name>/<split>', a "
                     "Search-R1 .parquet file or a FlashRAG .jsonl file")

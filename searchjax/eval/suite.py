"""Systems x datasets: run every system on every dataset, distributed over processes, grade, write the files.

    rows = run_suite(systems, datasets, engine=..., workdir=..., judge=judge)

Layout of `workdir` (what launch/report.py reads: `--eval_dirs=<workdir>` finds every system):

    <system>/predictions_<dataset>.jsonl   one record per question (searchjax.eval.benchmarks' format, "system"
                                           and, when graded, "judge_grade"), in the dataset's order
    <system>/judge_audit_<dataset>.jsonl   the grader's audit (searchjax.eval.grading)
    judge_cache.jsonl                      successful grades, shared by all systems (an answer two systems
                                           give to one question is graded once)
    summary.json, table.md                 one row per (system, dataset, data source): n, EM, F1, judge
                                           accuracy (correct / graded) with graded / ungraded counts,
                                           valid-answer rate, mean searches, forced-termination rate

Distribution. Every process holds the whole question list; the questions are cut into batches of
`batch_size` and each process runs a contiguous run of whole batches (`searchjax.distributed.process_shard`
over the batches). Batch k keeps its rows, its padded shapes and its seed (seed + k) whatever the number of
processes, so each process computes exactly what a one-process run computes for those batches; the records
are gathered in process order (`distributed.allgather` of their JSON bytes), which is the question order.
Process 0 then grades and writes; the other processes return no rows.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import tempfile
from typing import Optional, Sequence

import numpy as np

from searchjax import distributed
from searchjax.eval import grading
from searchjax.eval.benchmarks import summary_rows
from searchjax.eval.pipelines import PipelineConfig, run_pipeline

TABLE = (("system", "system"), ("dataset", "dataset"), ("data_source", "data source"), ("n", "n"), ("em", "EM"),
         ("f1", "F1"), ("judge_accuracy", "judge accuracy"), ("judge_ungraded", "ungraded"),
         ("valid_answer_rate", "valid answer"), ("mean_searches", "mean searches"),
         ("forced_termination_rate", "forced termination"))


@dataclasses.dataclass
class Engine:
    """The policy (model, params, tokenizer), the retriever (None when no system retrieves) and the agent's
    rollout config; logits_fn replaces the model's logits (scripted tests)."""

    model: object
    params: object
    tokenizer: object
    retriever: object = None
    rollout_cfg: object = None
    logits_fn: object = None


def dataset_label(spec: str) -> str:
    """A file-name label for a dataset spec: "tfds:nq/test" -> "nq-test", ".../nq/test.jsonl" -> "nq-test",
    ".../popqa.jsonl" -> "popqa", "default" -> "default", "default_qa:dev" -> "default_qa-dev"."""
    if spec.startswith("tfds:"):
        return spec[len("tfds:"):].replace("/", "-")
    if ":" in spec and not spec.startswith(("/", "~", ".")):
        return spec.replace(":", "-")
    path = pathlib.Path(spec)
    if path.suffix in (".jsonl", ".parquet"):
        if path.stem in ("train", "dev", "test", "val", "validation") and path.parent.name:
            return f"{path.parent.name}-{path.stem}"
        return path.stem
    return spec.replace("/", "-")


def batch_shard(n: int, batch_size: int, index: Optional[int] = None,
                count: Optional[int] = None) -> tuple[int, int, int]:
    """(first question, end, first batch number) of this process's whole batches (module docstring)."""
    batches = list(range(-(-n // batch_size)))
    mine = distributed.process_shard(batches, index, count)
    if not mine:
        return n, n, len(batches)
    return mine[0] * batch_size, min(n, (mine[-1] + 1) * batch_size), mine[0]


def gather_records(records: Sequence[dict]) -> list[dict]:
    """Every process's records, in process order (a one-process identity)."""
    blob = np.frombuffer(json.dumps(list(records), ensure_ascii=False).encode("utf-8"), np.uint8)
    lengths = distributed.allgather({"n": np.asarray([blob.size], np.int64)})["n"]
    data = distributed.allgather({"b": blob})["b"]
    out, start = [], 0
    for size in lengths.tolist():
        out += json.loads(data[start:start + size].tobytes().decode("utf-8"))
        start += size
    return out


def _write(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def rows_of(system: str, dataset: str, records: Sequence[dict]) -> list[dict]:
    """Summary rows of one predictions list: `benchmarks.summary_rows` with the judge's counts and accuracy."""
    judged = {r["data_source"]: r for r in grading.summary_by_source(records)} if any(
        grading.GRADE_FIELD in r for r in records) else {}
    rows = []
    for row in summary_rows(records):
        judge = judged.get(row["data_source"], {})
        rows.append({"system": system, "dataset": dataset, **row, "judge_accuracy": judge.get("accuracy"),
                     "judge_graded": judge.get("graded", 0), "judge_ungraded": judge.get("ungraded", 0)})
    return rows


def format_table(rows: Sequence[dict]) -> str:
    """Markdown table of suite rows (rates to 3 decimals; "-" where nothing was graded)."""
    lines = ["| " + " | ".join(title for _, title in TABLE) + " |", "|" + "|".join("---" for _ in TABLE) + "|"]
    for row in rows:
        cells = []
        for key, _ in TABLE:
            value = row.get(key)
            cells.append("-" if value is None else str(value) if isinstance(value, (str, int)) else f"{value:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_suite(systems: dict[str, PipelineConfig], datasets: Sequence[tuple[str, Sequence]], *, engine: Engine,
              workdir, batch_size: int, seed: int = 0, judge=None,
              grading_cfg: grading.GradingConfig = grading.GradingConfig(), progress: bool = False,
              process: Optional[tuple[int, int]] = None) -> list[dict]:
    """Run each system on each (label, prompts) dataset (module docstring); returns the summary rows on process
    0 ([] elsewhere). judge: a searchjax.judges.Judge, or None for no judge grades. process: (index, count) to
    override jax's process index and count (tests)."""
    import jax
    index, count = process if process is not None else (jax.process_index(), jax.process_count())
    workdir = pathlib.Path(workdir).expanduser()
    labels = [label for label, _ in datasets]
    if len(set(labels)) != len(labels):
        raise ValueError(f"datasets {labels}: two datasets have the same label; their files would collide")
    rows, summaries = [], {}
    cache: dict = {}
    for label, prompts in datasets:
        prompts = list(prompts)
        start, end, first_batch = batch_shard(len(prompts), batch_size, index, count)
        for name, cfg in systems.items():
            local = run_pipeline(cfg, engine.model, engine.params, engine.tokenizer, engine.retriever,
                                 prompts[start:end], system=name, batch_size=batch_size, seed=seed,
                                 first_batch=first_batch, rollout_cfg=engine.rollout_cfg,
                                 logits_fn=engine.logits_fn, progress=progress) if end > start else []
            records = gather_records(local) if count > 1 else local
            if index != 0:
                continue
            if judge is not None:
                cfg_here = dataclasses.replace(grading_cfg, cache_path=str(workdir / "judge_cache.jsonl"),
                                               audit_path=str(workdir / name / f"judge_audit_{label}.jsonl"))
                grades, summary = grading.grade_predictions(records, judge, cfg_here, cache=cache)
                records = grading.attach_grades(records, grades)
                summaries.setdefault(name, {})[label] = summary
            _write(workdir / name / f"predictions_{label}.jsonl",
                   "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
            rows += rows_of(name, label, records)
    if index != 0:
        return []
    summary = {"rows": rows, "grading": summaries, "systems": {k: dataclasses.asdict(v) for k, v in systems.items()},
               "rollout": dataclasses.asdict(engine.rollout_cfg) if engine.rollout_cfg is not None else None,
               "datasets": {label: len(prompts) for label, prompts in datasets}, "processes": count}
    _write(workdir / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
    _write(workdir / "table.md", format_table(rows) + "\n")
    return rows

"""Evaluation run of launch/evaluate.py: load the policy, retriever and questions from the config, evaluate, write
the run directory (the evaluation itself: searchjax.eval.benchmarks)."""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib

from searchjax.agent.rollout import RolloutConfig
from searchjax.data.qa_datasets import load_benchmark
from searchjax.eval.benchmarks import evaluate, format_table
from searchjax.experiment.setup import build_retriever, load_policy

log = logging.getLogger(__name__)


def check_inputs(config) -> tuple[list, RolloutConfig]:
    """(questions, rollout config) after the checks that need no model: the rollout section, the questions
    file (every row, through the training readers), the model and tokenizer paths, the retrieval index or
    server (`retrieval.client.probe`)."""
    from searchjax.experiment.validate import check_model_path
    try:
        cfg = RolloutConfig(group_size=1, temperature=0.0, top_p=1.0, top_k=0, **config.rollout.to_dict())
    except TypeError as e:  # an unknown field
        raise ValueError(f"config.rollout: {e}") from None
    prompts = load_benchmark(config.data.path, data_source=config.data.data_source)
    if config.data.limit:
        prompts = prompts[:config.data.limit]
    check_model_path(config.model.path, "model.path")
    if config.model.tokenizer:
        check_model_path(config.model.tokenizer, "model.tokenizer")
    if config.retrieval.url:
        from retrieval.client import probe
        probe(config.retrieval.url)
    elif config.retrieval.index not in ("bm25", "dense") and not pathlib.Path(config.retrieval.index).expanduser().is_dir():
        raise FileNotFoundError(f"config.retrieval.index={config.retrieval.index!r}: no such index directory "
                                "(bm25 | dense | a directory built by launch/build_index.py)")
    return prompts, cfg


def run_from_config(config, workdir) -> list[dict]:
    """launch/evaluate.py's job (configs/evaluate.py names every field): check the inputs (`check_inputs`), load
    the model, tokenizer, retriever and questions, evaluate greedily, write <workdir>/predictions.jsonl,
    summary.json, table.md and config.json, print the table; returns the summary rows."""
    from searchjax.experiment.run_dir import atomic_write_text
    workdir = pathlib.Path(workdir).expanduser()
    prompts, cfg = check_inputs(config)  # before anything loads or is written
    atomic_write_text(workdir / "config.json", json.dumps(config.to_dict(), indent=2, default=str))
    model, params, tokenizer = load_policy(config.model.path, dtype=config.model.dtype,
                                           tokenizer=config.model.tokenizer, step=config.model.checkpoint_step,
                                           progress=config.progress)
    retriever = build_retriever(config.retrieval, progress=config.progress)
    log.info("evaluating %s on %d questions of %s with %s", config.model.path, len(prompts), config.data.path, cfg)
    rows = evaluate(model, params, tokenizer, retriever, prompts, cfg, batch_size=config.batch_size, seed=config.seed,
                    predictions_path=workdir / "predictions.jsonl", progress=config.progress)
    table = format_table(rows)
    atomic_write_text(workdir / "summary.json", json.dumps({"rows": rows, "rollout": dataclasses.asdict(cfg)}, indent=2))
    atomic_write_text(workdir / "table.md", table + "\n")
    print(table, flush=True)
    return rows

"""Evaluation run of launch/evaluate.py: load the policy, retriever, judge and datasets from the config, run every
system on every dataset, write the run directory (the runs, grading and files: searchjax.eval.suite; the
systems: searchjax.eval.pipelines; the datasets: searchjax.data.qa_datasets and searchjax.data.tfds_qa)."""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib

from searchjax.agent.rollout import RolloutConfig
from searchjax.data.qa_datasets import load_benchmark
from searchjax.experiment.setup import build_retriever, load_policy

log = logging.getLogger(__name__)


def systems_from_config(config) -> dict:
    """{name: PipelineConfig} of config.systems (comma-separated), each with its config.baselines fields."""
    from searchjax.eval import pipelines
    names = [n.strip() for n in str(config.systems).split(",") if n.strip()]
    if not names:
        raise ValueError("config.systems is empty; name at least one of " + ", ".join(pipelines.SYSTEMS))
    systems = {}
    for name in names:
        if name not in pipelines.SYSTEMS:
            raise ValueError(f"config.systems: unknown system {name!r}; known: {', '.join(pipelines.SYSTEMS)}")
        fields = config.baselines[name].to_dict() if name in config.baselines else {}
        try:
            systems[name] = dataclasses.replace(pipelines.SYSTEMS[name], **fields)
        except TypeError as e:  # an unknown field
            raise ValueError(f"config.baselines.{name}: {e}") from None
    return systems


def load_datasets(config) -> list[tuple[str, list]]:
    """[(label, questions)] of config.data.path (comma-separated specs), each reduced to config.data.subset
    (searchjax.data.tfds_qa's hash-of-id rule) and then its first config.data.limit questions."""
    from searchjax.data.tfds_qa import subset_positions
    from searchjax.eval.suite import dataset_label
    datasets = []
    for spec in [s.strip() for s in str(config.data.path).split(",") if s.strip()]:
        prompts = load_benchmark(spec, data_source=config.data.data_source, manual_dir=config.data.manual_dir)
        if config.data.subset:
            prompts = [prompts[i] for i in subset_positions([p.uid for p in prompts], config.data.subset)]
        if config.data.limit:
            prompts = prompts[:config.data.limit]
        datasets.append((dataset_label(spec), prompts))
    if not datasets:
        raise ValueError("config.data.path is empty; name at least one dataset")
    return datasets


def check_inputs(config) -> tuple[list, RolloutConfig, dict]:
    """(datasets, rollout config, systems) after the checks that need no model: the systems and their fields,
    the rollout section, every dataset (every row, through the training readers), the model and tokenizer
    paths, the retrieval index or server (`retrieval.client.probe`) when a system retrieves, the judge
    endpoint when grading goes to one."""
    from searchjax.eval.pipelines import needs_retriever
    from searchjax.experiment.validate import check_model_path
    systems = systems_from_config(config)
    try:
        cfg = RolloutConfig(group_size=1, temperature=0.0, top_p=1.0, top_k=0, **config.rollout.to_dict())
    except TypeError as e:  # an unknown field
        raise ValueError(f"config.rollout: {e}") from None
    datasets = load_datasets(config)
    check_model_path(config.model.path, "model.path")
    if config.model.tokenizer:
        check_model_path(config.model.tokenizer, "model.tokenizer")
    if config.judge.backend not in ("none", "local", "openai_compat"):
        raise ValueError(f"config.judge.backend={config.judge.backend!r}: expected none, local or openai_compat")
    if config.judge.backend != "none":
        from searchjax.experiment.validate import probe_judge
        probe_judge(config.judge, "judge")
    retrieves = any(needs_retriever(s) for s in systems.values())  # direct, cot, closed_book need no index
    if retrieves and config.retrieval.url:
        from retrieval.client import probe
        probe(config.retrieval.url)
    elif (retrieves and config.retrieval.index not in ("bm25", "dense")
          and not pathlib.Path(config.retrieval.index).expanduser().is_dir()):
        raise FileNotFoundError(f"config.retrieval.index={config.retrieval.index!r}: no such index directory "
                                "(bm25 | dense | a directory built by launch/build_index.py)")
    return datasets, cfg, systems


def build_grading(config, policy):
    """(judge or None, GradingConfig) from config.judge; policy = (model, params, tokenizer) for
    local_checkpoint "policy"."""
    from searchjax.eval.grading import GradingConfig
    if config.judge.backend == "none":
        return None, GradingConfig()
    from searchjax.judges import build_judge
    local = policy if config.judge.backend == "local" and config.judge.local_checkpoint == "policy" else None
    return (build_judge(config.judge, local_model=local),
            GradingConfig(prompt=config.judge.prompt, temperature=float(config.judge.temperature)))


def run_from_config(config, workdir) -> list[dict]:
    """launch/evaluate.py's job (configs/evaluate.py names every field): check the inputs (`check_inputs`), load
    the model, tokenizer, retriever and judge, run every system on every dataset (each process its share of
    the batches, searchjax.eval.suite), write <workdir>/<system>/predictions_<dataset>.jsonl, summary.json,
    table.md and config.json, print the table; returns the summary rows (on process 0; [] elsewhere)."""
    import jax
    from searchjax import distributed
    from searchjax.eval import suite
    from searchjax.eval.pipelines import needs_retriever
    from searchjax.experiment.run_dir import atomic_write_text
    distributed.initialize(config.distributed)  # a no-op unless enabled (and before any JAX backend call)
    workdir = pathlib.Path(workdir).expanduser()
    datasets, cfg, systems = check_inputs(config)  # before anything loads or is written
    lead = jax.process_index() == 0
    if lead:
        atomic_write_text(workdir / "config.json", json.dumps(config.to_dict(), indent=2, default=str))
    model, params, tokenizer = load_policy(config.model.path, dtype=config.model.dtype,
                                           tokenizer=config.model.tokenizer, step=config.model.checkpoint_step,
                                           progress=config.progress and lead)
    retriever = (build_retriever(config.retrieval, progress=config.progress and lead)
                 if any(needs_retriever(s) for s in systems.values()) else None)
    judge, grading_cfg = build_grading(config, (model, params, tokenizer)) if lead else (None, None)
    log.info("evaluating %s (%s) on %s with %s", config.model.path, ", ".join(systems),
             ", ".join(f"{label} ({len(p)})" for label, p in datasets), cfg)
    engine = suite.Engine(model, params, tokenizer, retriever=retriever, rollout_cfg=cfg)
    rows = suite.run_suite(systems, datasets, engine=engine, workdir=workdir, batch_size=config.batch_size,
                           seed=config.seed, judge=judge, grading_cfg=grading_cfg or suite.grading.GradingConfig(),
                           progress=config.progress and lead)
    if lead:
        print(suite.format_table(rows), flush=True)
    return rows

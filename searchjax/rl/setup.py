"""Build a training run's parts from its config: mesh, model, tokenizer, retriever, prompts.

Kept apart from loop.py so the loop reads as the algorithm; tests and notebooks that bring their own
model, retriever or prompts construct `loop.Components` directly and skip this module.

Config fields read here (see configs/quickstart.py for their comments): mesh.{data,fsdp,tensor};
model.{path,tokenizer,dtype,param_dtype,remat_policy}; retrieval.{index,url}; data.{train,eval}.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Callable

import jax

# Names usable as model.path besides a filesystem path: the embedded-default assets.
MODEL_ALIASES: dict[str, Callable[[], pathlib.Path]] = {}


def _smollm2() -> pathlib.Path:
    from searchjax.data import assets
    return assets.smollm2_gguf()


MODEL_ALIASES["smollm2"] = _smollm2


def resolve_model_path(path: str) -> pathlib.Path:
    """A model.path value as a filesystem path (aliases: MODEL_ALIASES)."""
    if path in MODEL_ALIASES:
        return MODEL_ALIASES[path]()
    resolved = pathlib.Path(path).expanduser()
    if not resolved.exists():
        raise FileNotFoundError(f"config.model.path={path!r}: no such file or directory (aliases: "
                                f"{sorted(MODEL_ALIASES)})")
    return resolved


def make_mesh_from_config(cfg):
    """Mesh (data, fsdp, tensor) from config.mesh; with no -1 axis, the first data*fsdp*tensor devices."""
    from searchjax.sharding import make_mesh
    sizes = (cfg.data, cfg.fsdp, cfg.tensor)
    devices = None if -1 in sizes else jax.devices()[:math.prod(sizes)]
    return make_mesh(cfg.data, cfg.fsdp, cfg.tensor, devices=devices)


def param_shardings_for(model, mesh):
    from searchjax.sharding import param_shardings
    return param_shardings(model.config, mesh)


# ------------------------------------------------------------------------------------------------------
# Prompts
# ------------------------------------------------------------------------------------------------------
def default_prompts() -> list:
    """The embedded-default question set (75 FanOutQA sub-questions answerable from the default corpus)."""
    from searchjax.agent.rollout import Prompt
    from searchjax.data.default_questions import default_questions
    return [Prompt(uid=f"fanoutqa/{q.id}", question=q.question, golden_answers=tuple(q.golden_answers),
                   data_source="fanoutqa") for q in default_questions()]


def jsonl_prompts(path: str) -> list:
    """Prompts from jsonl rows {"id", "question", "golden_answers", optional "data_source", "hops", "metadata"}."""
    from searchjax.agent.rollout import Prompt
    path = pathlib.Path(path)
    out = []
    with path.open() as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            missing = [k for k in ("id", "question", "golden_answers") if k not in row]
            if missing:
                raise ValueError(f"{path}:{line_no}: missing field(s) {missing}")
            source = row.get("data_source", "default")
            out.append(Prompt(uid=f"{source}/{row['id']}", question=row["question"],
                              golden_answers=tuple(str(a) for a in row["golden_answers"]), data_source=source,
                              hops=int(row.get("hops", 0)), metadata=dict(row.get("metadata", {}))))
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


def load_prompts(spec: str) -> list:
    """config.data.train / data.eval: "default" (the embedded default) or "jsonl:<path>"."""
    if spec == "default":
        return default_prompts()
    if spec.startswith("jsonl:"):
        return jsonl_prompts(spec[len("jsonl:"):])
    raise ValueError(f"config.data prompts {spec!r}: expected 'default' or 'jsonl:<path>'")


# ------------------------------------------------------------------------------------------------------
# Retriever
# ------------------------------------------------------------------------------------------------------
def build_retriever(cfg):
    """config.retrieval: url (a running /retrieve server) wins; else index "bm25" | "dense" (the embedded
    default corpus) or a directory holding a built index (retrieval.open_index)."""
    from retrieval.client import HttpRetriever, InProcessRetriever
    if cfg.url:
        return HttpRetriever(cfg.url)
    if cfg.index in ("bm25", "dense"):
        from retrieval import default_index
        return InProcessRetriever(default_index(kind=cfg.index))
    if not cfg.index:
        raise ValueError("config.retrieval: set url (a retrieval server) or index (bm25 | dense | a directory)")
    from retrieval import open_index
    return InProcessRetriever(open_index(pathlib.Path(cfg.index).expanduser()))


def build_components(config):
    """loop.Components from the config: model and params on the mesh, tokenizer, retriever, prompts."""
    from searchjax.models import Transformer, load_pretrained
    from searchjax.rl.loop import Components
    from searchjax.rl.sft import load_demonstrations
    from searchjax.tokenization import load_tokenizer
    mesh = make_mesh_from_config(config.mesh)
    path = resolve_model_path(config.model.path)
    model, params = load_pretrained(path, dtype=config.model.dtype, param_dtype=config.model.param_dtype, mesh=mesh)
    model = Transformer(model.config.replace(remat_policy=config.model.remat_policy))
    tokenizer = load_tokenizer(resolve_model_path(config.model.tokenizer) if config.model.tokenizer else path)
    demonstrations = load_demonstrations(config.sft.demonstrations) if config.sft.demonstrations else []
    from searchjax.distributed import process_shard  # multi-host: each process rolls out its own prompts
    return Components(model=model, params=params, tokenizer=tokenizer, retriever=build_retriever(config.retrieval),
                      train_prompts=process_shard(load_prompts(config.data.train)),
                      eval_prompts=process_shard(load_prompts(config.data.eval)), demonstrations=demonstrations,
                      mesh=mesh)

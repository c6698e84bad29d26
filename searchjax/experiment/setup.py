"""Build a training run's parts from its config: mesh, model, tokenizer, retriever, prompts.

Kept apart from loop.py so the loop reads as the algorithm; tests and notebooks that bring their own
model, retriever or prompts construct `loop.Components` directly and skip this module.

Config fields read here (see configs/quickstart.py for their comments): mesh.{data,fsdp,tensor};
model.{path,tokenizer,dtype,param_dtype,remat_policy} (path may also be a training workdir: `load_policy`);
retrieval.{index,url}; data.{train,eval} (readers shared with evaluation: searchjax.data.qa_datasets).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any

import jax

from searchjax.data.assets import MODEL_ALIASES, resolve_model_path
from searchjax.data.qa_datasets import default_prompts  # noqa: F401  (re-exported: the embedded-default prompts)

# What a run is made of; `build_components(config)` assembles it from the config, tests pass their own.
@dataclasses.dataclass
class Components:
    model: Any  # searchjax.models.Transformer
    params: Any  # initial policy parameters (placed on the mesh)
    tokenizer: Any  # searchjax.tokenization.Tokenizer
    retriever: Any  # anything with .search(queries, topk) -> list[list[Hit]]
    train_prompts: list  # list[searchjax.agent.rollout.Prompt]
    eval_prompts: list
    demonstrations: list = dataclasses.field(default_factory=list)  # SFT warm-start trajectories
    mesh: Any = None


def is_train_workdir(path: str) -> bool:
    """True when `path` is a launch/train.py --workdir (its config.json and checkpoints/ exist)."""
    if path in MODEL_ALIASES:
        return False
    p = pathlib.Path(path).expanduser()
    return (p / "config.json").is_file() and (p / "checkpoints").is_dir()


def load_policy(path: str, *, dtype: str = "float32", param_dtype: str | None = None, tokenizer: str = "",
                step: int = -1, mesh=None, progress: bool = False):
    """(model, params, tokenizer) from a model.path value: an HF dir, a .gguf file, an alias, or a training
    workdir of launch/train.py.

    A training workdir holds the base model's location in config.json (model.path, model.tokenizer) and
    orbax checkpoints: the model and tokenizer come from the base, the params from checkpoint `step`
    (-1 = the latest), cast to the model's param dtype. tokenizer: overrides the tokenizer location.
    progress: a tqdm bar over the bytes of weights read.
    """
    import json
    from searchjax.models import load_pretrained
    from searchjax.tokenization import load_tokenizer
    if is_train_workdir(path):
        workdir = pathlib.Path(path).expanduser()
        base = json.loads((workdir / "config.json").read_text()).get("model", {})
        if "path" not in base:
            raise ValueError(f"{workdir / 'config.json'}: no model.path (is {workdir} a launch/train.py workdir?)")
        model, params = load_pretrained(resolve_model_path(base["path"]), dtype=dtype,
                                        param_dtype=param_dtype or base.get("param_dtype") or None, mesh=mesh,
                                        progress=progress)
        from searchjax.rl import checkpoint
        from searchjax.rl.trainer import cast_tree
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params)
        del params  # the checkpoint's params replace the base's
        master, _ = checkpoint.restore_params(workdir / "checkpoints", abstract, None if step < 0 else step)
        params = cast_tree(master, model.config.weight_dtype)
        tokenizer = tokenizer or base.get("tokenizer") or base["path"]
        return model, params, load_tokenizer(resolve_model_path(tokenizer))
    resolved = resolve_model_path(path)
    model, params = load_pretrained(resolved, dtype=dtype, param_dtype=param_dtype, mesh=mesh, progress=progress)
    return model, params, load_tokenizer(resolve_model_path(tokenizer) if tokenizer else resolved)


def make_mesh_from_config(cfg):
    """Mesh (data, fsdp, tensor) from config.mesh; with no -1 axis, the first data*fsdp*tensor devices."""
    from searchjax.sharding import make_mesh
    sizes = (cfg.data, cfg.fsdp, cfg.tensor)
    devices = None if -1 in sizes else jax.devices()[:math.prod(sizes)]
    return make_mesh(cfg.data, cfg.fsdp, cfg.tensor, devices=devices)


def param_shardings_for(model, mesh):
    from searchjax.models import param_shardings
    return param_shardings(model.config, mesh)


# ------------------------------------------------------------------------------------------------------
# Prompts
# ------------------------------------------------------------------------------------------------------
def load_prompts(spec: str) -> list:
    """config.data.train / data.eval: "default" (the embedded default), a Search-R1 .parquet or FlashRAG .jsonl
    file (`searchjax.data.qa_datasets.load_benchmark`: the readers evaluation uses), or "jsonl:<path>" for a
    jsonl file of that format under another name."""
    from searchjax.data import qa_datasets
    if spec.startswith("jsonl:"):
        return qa_datasets.read_flashrag_jsonl(pathlib.Path(spec[len("jsonl:"):]).expanduser())
    return qa_datasets.load_benchmark(spec)


# ------------------------------------------------------------------------------------------------------
# Retriever
# ------------------------------------------------------------------------------------------------------
def build_retriever(cfg, *, progress: bool = False):
    """config.retrieval: url (a running /retrieve server) wins; else index "bm25" | "dense" (the embedded
    default corpus) or a directory holding a built index (retrieval.open_index). progress: a tqdm bar while
    the default dense index's passages are encoded (minutes on a CPU, once: the index is cached)."""
    from retrieval.client import HttpRetriever, InProcessRetriever
    if cfg.url:
        return HttpRetriever(cfg.url)
    if cfg.index in ("bm25", "dense"):
        from retrieval import default_index
        return InProcessRetriever(default_index(kind=cfg.index, progress=progress))
    if not cfg.index:
        raise ValueError("config.retrieval: set url (a retrieval server) or index (bm25 | dense | a directory)")
    from retrieval import open_index
    return InProcessRetriever(open_index(pathlib.Path(cfg.index).expanduser()))


def build_components(config):
    """loop.Components from the config: model and params on the mesh, tokenizer, retriever, prompts.

    The cheap parts (prompts, demonstrations) load first, so a bad data row fails before the model loads."""
    from searchjax.models import Transformer
    from searchjax.rl.sft import load_demonstrations
    from searchjax.distributed import process_shard  # multi-host: each process rolls out its own prompts
    train_prompts, eval_prompts = load_prompts(config.data.train), load_prompts(config.data.eval)
    demonstrations = load_demonstrations(config.sft.demonstrations) if config.sft.demonstrations else []
    progress = bool(config.logging.progress_bar) and jax.process_index() == 0
    mesh = make_mesh_from_config(config.mesh)
    model, params, tokenizer = load_policy(config.model.path, dtype=config.model.dtype,
                                           param_dtype=config.model.param_dtype, tokenizer=config.model.tokenizer,
                                           mesh=mesh, progress=progress)
    if config.sft.demonstrations:  # token ids written with another tokenizer would train on garbage
        from searchjax.data.demonstrations import check_demonstrations
        check_demonstrations(config.sft.demonstrations, tokenizer)
    model = Transformer(model.config.replace(remat_policy=config.model.remat_policy))
    return Components(model=model, params=params, tokenizer=tokenizer,
                      retriever=build_retriever(config.retrieval, progress=progress),
                      train_prompts=process_shard(train_prompts), eval_prompts=process_shard(eval_prompts),
                      demonstrations=demonstrations, mesh=mesh)

"""Pre-flight checks of a training run: everything checkable before the model, tokenizer and index load.

A typo in a batch size, a reward name or a data path should cost seconds, not the minutes a 7B model
takes to load. `preflight(config, workdir, ...)` runs, cheapest first:

1. `check_config`: batch arithmetic (mini-batches divide the step's trajectories, micro-batches divide
   mini-batches and are a multiple of the mesh's batch shards), mesh size against the devices, length
   buckets (sorted positive ints; the largest response bucket holds the longest response the rollout
   limits allow), KV-cache room, the rollout / loss / optimizer sections (their dataclasses' own
   checks), and every registry name (rollout_fn, reward_fn, eval_reward_fn, advantage.estimator: the
   tables of searchjax/experiment/loop.py; a composed reward's spec parsed and checked against the same
   table, `reward_names`);
2. the workdir (`run_dir.accept`: a fresh run never overwrites results, --resume needs a checkpoint and an
   unchanged config and data);
3. `check_inputs`: model and tokenizer paths (an HF directory's config.json parsed), data files read
   through the readers training uses (`setup.load_prompts`: every row checked), SFT demonstrations,
   chain pools and frozen-model paths of the Dr.Free sections;
4. `probe_services`: the retrieval server (`retrieval.client.probe`) and the judges the reward uses
   (`probe_judge`).

Launchers turn the errors these raise (`user_error_types`) into one line (`exit_on_user_error`); `run_launcher`
is a launcher's whole start-up (arguments, offline hubs, multi-host JAX, compilation cache, that one line) and
`start_launcher` its `__main__` block.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pathlib
import sys
from typing import Callable, Sequence

log = logging.getLogger(__name__)

# reward name -> the config section naming the judge that reward calls (searchjax.judges.build_judge fields).
JUDGE_SECTIONS = {"eviback": "teacher", "eviback_teacher": "teacher", "ccs": "reconstructor",
                  "constitutional_judge": "cj_judge"}


def _positive_ints(values, field: str) -> list[int]:
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    if not values or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in values):
        raise ValueError(f"config.{field}={values!r}: expected positive integers")
    if values != sorted(set(values)):
        raise ValueError(f"config.{field}={values!r}: expected strictly increasing lengths")
    return values


def batch_shards(mesh_cfg, device_count: int) -> int:
    """Batch shards (data x fsdp) of config.mesh on `device_count` devices (-1 = the remaining devices)."""
    sizes = {"data": mesh_cfg.data, "fsdp": mesh_cfg.fsdp, "tensor": mesh_cfg.tensor}
    for name, size in sizes.items():
        if size != -1 and (not isinstance(size, int) or size < 1):
            raise ValueError(f"config.mesh.{name}={size!r}: expected a positive integer or -1")
    if list(sizes.values()).count(-1) > 1:
        raise ValueError(f"config.mesh={sizes}: at most one axis may be -1")
    fixed = math.prod(s for s in sizes.values() if s != -1)
    if fixed > device_count or (-1 in sizes.values() and device_count % fixed):
        raise ValueError(f"config.mesh={sizes} does not fit the {device_count} devices of this job")
    resolved = {k: (device_count // fixed if v == -1 else v) for k, v in sizes.items()}
    return resolved["data"] * resolved["fsdp"]


def longest_response(rollout) -> int:
    """Most response tokens a rollout can produce: every searching turn, the forced final turn and every
    observation block at its cap (`max_obs_tokens`, wrapper included)."""
    turns = rollout.max_turns if rollout.search else 0
    return (turns + 1) * rollout.max_new_tokens_per_turn + turns * rollout.max_obs_tokens


def check_lengths(config) -> None:
    """Length buckets and the KV cache against the rollout's limits."""
    from searchjax import generation
    r = config.rollout
    _positive_ints(list(config.batch.prompt_buckets), "batch.prompt_buckets")
    response_buckets = _positive_ints(list(config.batch.response_buckets), "batch.response_buckets")
    longest = longest_response(r)
    if longest > response_buckets[-1]:
        turns = r.max_turns if r.search else 0
        raise ValueError(f"config.batch.response_buckets={tuple(response_buckets)}: the largest, {response_buckets[-1]}, "
                         f"is shorter than the longest response the rollout allows, {longest} = ({turns} + 1) x "
                         f"max_new_tokens_per_turn {r.max_new_tokens_per_turn} + {turns} x max_obs_tokens "
                         f"{r.max_obs_tokens}; add a bucket >= {longest}")
    turns = r.max_turns if r.search else 0
    reserved = (turns + 1) * r.max_new_tokens_per_turn + turns * generation.append_bucket(r.max_obs_tokens)
    if r.max_cache_len <= reserved:
        raise ValueError(f"config.rollout.max_cache_len={r.max_cache_len} leaves no room for the prompt: the turns "
                         f"and observation blocks alone take {reserved} slots")


def check_config(config, *, device_count: int | None = None) -> None:
    """Step 1 of the module docstring; device_count None = jax.device_count()."""
    from searchjax.agent.rollout import RolloutConfig
    from searchjax.experiment import loop
    from searchjax.rl import trainer
    for field in ("total_steps", "prompts_per_step"):
        value = config[field]
        if not isinstance(value, int) or value < (0 if field == "total_steps" else 1):
            raise ValueError(f"config.{field}={value!r}: expected an integer >= {0 if field == 'total_steps' else 1}")
    builders = {"rollout": lambda: RolloutConfig(**config.rollout.to_dict()), "loss": lambda: loop.loss_config(config),
                "optim": lambda: trainer.OptimConfig(**config.optim.to_dict())}
    built = {}
    for name, build in builders.items():
        try:
            built[name] = build()  # the dataclasses check their own values
        except TypeError as e:  # an unknown or missing field
            raise ValueError(f"config.{name}: {e}") from None
    rollout = built["rollout"]
    for field in ("group_size", "max_new_tokens_per_turn", "max_obs_tokens", "topk", "max_cache_len"):
        if getattr(rollout, field) < 1:
            raise ValueError(f"config.rollout.{field}={getattr(rollout, field)!r} must be >= 1")
    if rollout.max_turns < 0:
        raise ValueError(f"config.rollout.max_turns={rollout.max_turns} must be >= 0")
    if device_count is None:
        import jax
        device_count = jax.device_count()
    loop.check_batch_arithmetic(config, batch_shards(config.mesh, device_count))
    check_lengths(config)
    if config.checkpoint.max_to_keep < 1:
        raise ValueError(f"config.checkpoint.max_to_keep={config.checkpoint.max_to_keep} must be >= 1")
    if config.sft.steps > 0:
        if not config.sft.demonstrations:
            raise ValueError(f"config.sft.steps={config.sft.steps} but config.sft.demonstrations is empty")
        if config.sft.micro_batch_size < 1 or config.sft.batch_size % config.sft.micro_batch_size:
            raise ValueError(f"config.sft.micro_batch_size={config.sft.micro_batch_size} must divide "
                             f"sft.batch_size={config.sft.batch_size}")
    skipped = config.max_consecutive_skipped_steps
    if not isinstance(skipped, int) or skipped < 0:
        raise ValueError(f"config.max_consecutive_skipped_steps={skipped!r}: expected an integer >= 0 (0 = never stop)")
    loop.check_names(config)
    reward_names(config)


def reward_names(config) -> list[str]:
    """The rewards the run builds: reward_fn and eval_reward_fn, and for "compose" every reward its spec
    (config.compose.spec) names, the spec checked as its builder checks it (searchjax/rewards/compose.py)."""
    from searchjax.experiment import loop
    names = list(dict.fromkeys((config.reward_fn, config.eval_reward_fn)))
    if "compose" in names:
        from searchjax.rewards import compose
        if "compose" not in config:
            raise ValueError("config.reward_fn='compose' needs a config.compose section (configs/compose.py)")
        section = config.compose
        cfg = compose.ComposeConfig(spec=section.spec, success=section.success.to_dict(), lam=section.lam,
                                    epsilon=section.epsilon, max_failure_rate=section.max_failure_rate)
        tree = compose.check_tree(compose.parse_spec(cfg.spec), list(loop.REWARD_FNS), cfg.success)
        names += [n for n in tree.leaves() if n not in names]
    return names


# ------------------------------------------------------------------------------------------------------
# Inputs on disk
# ------------------------------------------------------------------------------------------------------
def check_model_path(path: str, field: str) -> None:
    """An alias, a .gguf file or an HF directory whose config.json our loader accepts (or a training workdir)."""
    from searchjax.data.assets import MODEL_ALIASES, resolve_model_path
    from searchjax.experiment.setup import is_train_workdir
    if not path:
        return
    if path in MODEL_ALIASES:
        resolve_model_path(path)  # the asset package is installed
        return
    if is_train_workdir(path):
        base = json.loads((pathlib.Path(path).expanduser() / "config.json").read_text()).get("model", {})
        if "path" not in base:
            raise ValueError(f"config.{field}={path!r}: its config.json has no model.path")
        return check_model_path(base["path"], f"{field} (its config.json model.path)")
    try:
        resolved = resolve_model_path(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"config.{field}={path!r}: no such file or directory "
                                f"(aliases: {sorted(MODEL_ALIASES)})") from None
    if resolved.is_dir():
        from searchjax.models.checkpoint_io import config_from_hf
        config_file = resolved / "config.json"
        if not config_file.is_file():
            if not (resolved / "tokenizer.json").is_file():
                raise FileNotFoundError(f"config.{field}={path!r}: {config_file} not found (not an HF model directory)")
            return  # a tokenizer-only directory (model.tokenizer)
        config_from_hf(json.loads(config_file.read_text()), source=str(config_file))
    elif resolved.suffix != ".gguf":
        raise ValueError(f"config.{field}={path!r}: expected an HF model directory or a .gguf file")


def check_inputs(config) -> dict[str, int]:
    """Step 3 of the module docstring; returns {field: rows read} for the data fields."""
    from searchjax.experiment.setup import load_prompts
    counts = {}
    check_model_path(config.model.path, "model.path")
    if config.model.tokenizer:
        check_model_path(config.model.tokenizer, "model.tokenizer")
    if "data" in config:
        for field in ("train", "eval"):
            spec = config.data[field]
            counts[f"data.{field}"] = len(load_prompts(spec))
    if config.sft.demonstrations:
        from searchjax.rl.sft import load_demonstrations
        path = pathlib.Path(config.sft.demonstrations).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"config.sft.demonstrations={config.sft.demonstrations!r}: no such file")
        counts["sft.demonstrations"] = len(load_demonstrations(path))
    if "chains" in config and config.chains.pool != "synthetic":
        from searchjax.drfree.chains import read_chain_pool
        path = pathlib.Path(config.chains.pool).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"config.chains.pool={config.chains.pool!r}: no such file (build one with "
                                    "launch/build_chains.py, or use 'synthetic')")
        counts["chains.pool"] = len(read_chain_pool(path))
    for section in ("anchor", "difficulty.solver"):
        node = config
        for part in section.split("."):
            node = node[part] if part in node else None
            if node is None:
                break
        if node is not None and node.path:
            check_model_path(node.path, f"{section}.path")
    index = config.retrieval.index
    if not config.retrieval.url and index not in ("bm25", "dense"):
        if not index:
            raise ValueError("config.retrieval: set url (a retrieval server) or index (bm25 | dense | a directory)")
        if not pathlib.Path(index).expanduser().is_dir():
            raise FileNotFoundError(f"config.retrieval.index={index!r}: no such index directory "
                                    "(build one with launch/build_index.py)")
    return counts


# ------------------------------------------------------------------------------------------------------
# Services
# ------------------------------------------------------------------------------------------------------
def probe_judge(section, field: str) -> None:
    """Start-up check of a judge section (searchjax.judges.build_judge fields): an openai_compat judge is built
    (its URL, model name and API key variable are checked) and asked one one-token question, so a dead URL, a
    wrong model name or a 401 stops the run here, before the model loads; a local judge's checkpoint must exist
    (loading it is the expensive part the run does anyway)."""
    if section.backend == "openai_compat":
        from searchjax.judges import build_judge
        from searchjax.judges.base import JudgeError, JudgeRequest
        try:
            judge = build_judge(section)
            reply = judge.complete_many([JudgeRequest(messages=({"role": "user", "content": "Reply with OK."},),
                                                      max_tokens=1)])[0]
        except (JudgeError, ValueError) as e:
            raise ValueError(f"config.{field}: {e}") from None
        if isinstance(reply, JudgeError):
            raise ValueError(f"config.{field}: the judge at {section.base_url} did not answer a probe request: "
                             f"{reply}")
    elif section.backend == "local":
        if section.local_checkpoint not in ("policy", "smollm2"):
            check_model_path(section.local_checkpoint, f"{field}.local_checkpoint")
    else:
        raise ValueError(f"config.{field}.backend={section.backend!r}: expected openai_compat or local")


def probe_services(config) -> None:
    """Step 4 of the module docstring: the retrieval server and every judge the rewards call."""
    if config.retrieval.url:
        from retrieval.client import probe
        result = probe(config.retrieval.url)
        log.info("retrieval server %s answered in %.2fs (passages: %s)", result.endpoint, result.latency_s,
                 result.passages)
    for field in dict.fromkeys(JUDGE_SECTIONS[r] for r in reward_names(config) if r in JUDGE_SECTIONS):
        if field in config:
            probe_judge(config[field], field)


def preflight(config, workdir, *, resume: bool, allow_changes: Sequence[str] = (),
              device_count: int | None = None, services: bool = True) -> dict[str, dict]:
    """Steps 1-4 (module docstring); returns the data fingerprints to record with `run_dir.record`."""
    from searchjax.experiment import run_dir
    check_config(config, device_count=device_count)
    fingerprints = run_dir.accept(workdir, config, resume=resume, allow_changes=allow_changes)
    counts = check_inputs(config)
    if counts:
        log.info("inputs read: %s", ", ".join(f"{k} {v} rows" for k, v in counts.items()))
    if services:
        probe_services(config)
    return fingerprints


# ------------------------------------------------------------------------------------------------------
# Errors a user sees
# ------------------------------------------------------------------------------------------------------
def user_error_types() -> tuple[type, ...]:
    """Exceptions that mean bad input, not a bug: a bad config or data row (ValueError), a missing file, a
    refused workdir, an unreachable or refusing endpoint, a run stopped by its guard."""
    types: list[type] = [ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, ConnectionError,
                         TimeoutError, PermissionError]
    for module, name in (("retrieval.client", "RetrieverProbeError"), ("searchjax.judges.base", "JudgeError"),
                         ("searchjax.experiment.loop", "SkippedStepsError"),
                         ("searchjax.experiment.loop", "FailureRateError")):
        found = getattr(sys.modules.get(module), name, None)  # only modules already imported can have raised
        if found is not None:
            types.append(found)
    return tuple(types)


def one_line(error: BaseException) -> str:
    """The error as one line: its message with whitespace collapsed (type name when the message is empty)."""
    text = " ".join(str(error).split())
    if isinstance(error, KeyError) or not text:
        text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text


def exit_on_user_error(body: Callable[[], object], *, verbose: bool, program: str) -> object:
    """Run `body`; a user error (`user_error_types`) ends the process with one line on stderr and status 1
    (the traceback too when `verbose`); anything else propagates with its traceback."""
    try:
        return body()
    except user_error_types() as e:
        if verbose:
            raise
        print(f"{program}: error: {one_line(e)}  (--verbose shows the traceback)", file=sys.stderr, flush=True)
        sys.exit(1)


def run_launcher(argv, body: Callable[[], object], *, distributed_cfg, verbose: bool, program: str) -> object:
    """A launcher's `main`: refuse stray arguments, keep the model hubs offline, start multi-host JAX from the
    config's distributed section `distributed_cfg` (a no-op unless enabled; before anything touches a JAX
    backend) and the persistent compilation cache, then run `body` under `exit_on_user_error`. `body`
    imports what it needs."""
    if len(argv) > 1:
        from absl import app
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # hubs are never contacted at run time

    def start():
        from searchjax import distributed, runtime
        distributed.initialize(distributed_cfg)
        runtime.enable_compilation_cache()
        return body()
    return exit_on_user_error(start, verbose=verbose, program=program)


def start_launcher(main: Callable, required: Sequence[str] = ("config", "workdir")) -> None:
    """A launcher's `if __name__ == "__main__":` block: glibc's malloc tunables (re-executes the process once with
    GLIBC_TUNABLES set: XLA:CPU's buffers on huge pages and kept between calls), the required flags, then absl's
    `app.run(main)`."""
    from absl import app, flags
    from searchjax.runtime import use_transparent_huge_pages
    use_transparent_huge_pages()
    flags.mark_flags_as_required(list(required))
    app.run(main)

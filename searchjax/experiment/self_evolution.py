r"""Dr.Free's self-evolution loop: proposer -> generation -> solver -> anchor, for a few iterations.

Each iteration k = 1..K (K = config.self_evolution.iterations; the paper: three) runs three stages:

  proposer    config.total_steps HRPO updates of the proposer (`selfplay`: chain prompts, one proposal each,
              reward eq. 12 with the anchor A_k), through `searchjax.experiment.loop.train`;
  generation  the updated proposer writes one proposal for each of freshly shuffled training chains (the
              "w/o KG" ablation, config.proposer.kind = "search": one searching proposal per chain's seed
              passage), at temperature config.generation.temperature, until the solver's budget
              B = solver.total_steps x solver.prompts_per_step pairs is met; a proposal becomes a pair only
              when it passes the gate of eq. 12 (s_fmt = 1: think, question, answer = the chain's target,
              answer not in the question; and grounded in the chain's passages) and its question is new;
              the others are counted by reason (integrity, format, ungrounded, duplicate, surplus) and
              written to rejected.jsonl, never used (no pair at all: the solver stage is skipped, and the
              previous solver stays the anchor);
  solver      solver.total_steps GRPO updates of the solver on those pairs, through the same trainer and the
              Search-R1 search-agent rollout: each pair is a solver prompt (question) whose gold answer is
              the proposer's answer; reward = exact match.

and then the anchor of the next iteration's IG reward is this solver: A_1 = config.anchor (the base model),
A_(k+1) = solver_k (self_evolution.anchor = "solver"), or A_k = A_1 throughout ("frozen": Figure 4's
frozen-anchor curve). Both agents continue across iterations: proposer_k starts from proposer_(k-1), solver_k
from solver_(k-1), each stage with a fresh optimizer (its own warmup), as Dr.Zero's public scripts restart
each stage from the previous checkpoint. Dr.Zero's difficulty reward (ablation) uses the same frozen model
as its solver. Without proposer training (ablation) the proposer stage is skipped and the base proposer
generates every iteration's pairs.

Outputs under workdir, one directory per stage (iter_<k>/<stage>/): the loop's own outputs for proposer and
solver (checkpoints/, metrics.jsonl, trajectories/, hf/, and config.json, so the directory loads with
`setup.load_policy` like a launch/train.py workdir); qa_pairs.jsonl, rejected.jsonl for generation. A
finished stage writes done.json with its metrics; summary.jsonl lists them all (IG distribution,
format and grounding rates, hop mix, solver reward, dev EM when solver.eval_data is set).

Resume: every stage takes its starting parameters from the checkpoint files of the stage before it (in an
uninterrupted run too), its seeds from (config.seed, iteration), and skips when done.json exists, so
restarting with resume=True after a stop at any stage boundary (or inside a training stage: the loop's own
resume) gives the same parameters, pairs and metrics as an uninterrupted run.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from searchjax.agent.rollout import Prompt
from searchjax.experiment.selfplay import SelfPlayComponents
from searchjax.experiment.setup import Components

log = logging.getLogger(__name__)

STAGES = ("proposer", "generation", "solver")
REJECTION_REASONS = ("integrity", "format", "ungrounded", "duplicate", "surplus")
PAIRS_FILE, REJECTED_FILE, DONE_FILE, SUMMARY_FILE = "qa_pairs.jsonl", "rejected.jsonl", "done.json", "summary.jsonl"
_GENERATION_STREAM = 7  # separates the generation's chain order and seeds from the stages' own seed streams


# ------------------------------------------------------------------------------------------------------
# The plan and the stage configs
# ------------------------------------------------------------------------------------------------------
def stage_plan(config) -> list[tuple[int, str]]:
    """(iteration, stage) pairs in run order; the proposer stage is left out without proposer training."""
    iterations = int(config.self_evolution.iterations)
    if iterations < 1:
        raise ValueError(f"config.self_evolution.iterations={iterations} must be >= 1")
    stages = [s for s in STAGES if s != "proposer" or config.self_evolution.proposer_training]
    return [(k, s) for k in range(1, iterations + 1) for s in stages]


def anchor_iteration(config, iteration: int) -> int:
    """Whose parameters anchor iteration `iteration`'s IG reward: 0 = config.anchor, k = the solver of iteration k."""
    mode = config.self_evolution.anchor
    if mode not in ("solver", "frozen"):
        raise ValueError(f"config.self_evolution.anchor={mode!r}; valid: 'solver', 'frozen'")
    return 0 if mode == "frozen" or iteration == 1 else iteration - 1


def stage_dir(workdir: str | os.PathLike, iteration: int, stage: str) -> pathlib.Path:
    return pathlib.Path(workdir) / f"iter_{iteration}" / stage


def proposer_config(config, iteration: int) -> ml_collections.ConfigDict:
    """The proposer stage's config: config itself with a seed per iteration (a new chain order each time)."""
    c = ml_collections.ConfigDict(config.to_dict())
    c.seed = int(config.seed) + iteration - 1
    c.sft.steps = 0
    return c


def solver_config(config, iteration: int) -> ml_collections.ConfigDict:
    """The solver stage's config: config with config.solver's steps, batch, rollout, reward and optimizer."""
    s = config.solver
    c = ml_collections.ConfigDict(config.to_dict())
    c.seed = int(config.seed) + iteration - 1
    c.sft.steps = 0
    c.total_steps, c.prompts_per_step = int(s.total_steps), int(s.prompts_per_step)
    c.rollout_fn = "search_agent"
    c.reward_fn = c.eval_reward_fn = s.reward_fn
    c.advantage.estimator = s.advantage_estimator
    for section in ("rollout", "optim", "batch", "eval"):
        c[section] = ml_collections.ConfigDict(s[section].to_dict())
    return c


# ------------------------------------------------------------------------------------------------------
# Parameters between stages
# ------------------------------------------------------------------------------------------------------
def restore_stage_params(directory: pathlib.Path, like, master_dtype: str = "") -> tuple:
    """(params, step) of the latest checkpoint of a training stage, laid out like `like` (master dtype kept)."""
    from searchjax.rl import checkpoint
    dtype = jnp.dtype(master_dtype) if master_dtype else None
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, dtype if dtype is not None and jnp.issubdtype(x.dtype, jnp.floating) else x.dtype,
        sharding=getattr(x, "sharding", None)), like)
    return checkpoint.restore_params(directory / "checkpoints", abstract)


def trained(workdir: str | os.PathLike, iteration: int, stage: str) -> bool:
    """Whether that training stage wrote a checkpoint (a skipped solver stage did not)."""
    directory = stage_dir(workdir, iteration, stage) / "checkpoints"
    return directory.is_dir() and any(directory.iterdir())


def latest_trained(workdir: str | os.PathLike, stage: str, up_to: int) -> int:
    """The last iteration <= up_to whose `stage` trained (0 = none: the base model)."""
    return next((k for k in range(up_to, 0, -1) if trained(workdir, k, stage)), 0)


def _policy(params, model):
    from searchjax.rl.trainer import cast_tree
    return cast_tree(params, model.config.weight_dtype)


# ------------------------------------------------------------------------------------------------------
# Generation: proposals -> solver training pairs
# ------------------------------------------------------------------------------------------------------
def rejection_reason(check, seen_questions: set) -> str | None:
    """Why a checked proposal (information_gain.ProposalCheck) cannot be a pair, or None when it can."""
    from searchjax.rewards.qa import normalize_answer
    if check.format_score == 0.0:
        return "integrity"  # no question or answer, or the answer inside the question
    if not check.gated:
        return "format" if abs(check.format_score - 1.0) > 1e-9 else "ungrounded"
    return "duplicate" if normalize_answer(check.question) in seen_questions else None


def pair_prompt(row: dict) -> Prompt:
    """A solver prompt from a qa_pairs.jsonl row: the proposer's question, its answer as the gold answer."""
    return Prompt(uid=row["uid"], question=row["question"], golden_answers=tuple(row["golden_answers"]),
                  data_source=row["data_source"], hops=int(row["hops"]), metadata={"chain_id": row["chain_id"]})


def read_pairs(path: str | os.PathLike) -> list[Prompt]:
    """Solver prompts of a qa_pairs.jsonl; a bad row raises naming the file and line."""
    prompts = []
    for n, line in enumerate(pathlib.Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            prompts.append(pair_prompt(json.loads(line)))
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}:{n}: not a qa pair row ({error})") from None
    return prompts


def generate_pairs(config, components, params, iteration: int, out_dir: pathlib.Path) -> tuple[list[Prompt], dict]:
    """The generation stage (module docstring): (solver prompts, metrics); writes qa_pairs / rejected jsonl.

    params: the proposer's (master) parameters. Chains: components.train_prompts, shuffled with
    (config.seed, iteration); at most config.generation.max_chains of them (0 = all) are tried, in rollout
    calls of config.generation.chains_per_call, until the budget is met. Runs config.rollout_fn (the
    proposer rollout) with group size 1 and the generation temperature.
    """
    from searchjax.drfree.proposer import chain_of
    from searchjax.experiment import loop
    from searchjax.rewards.information_gain import check_proposal
    from searchjax.rewards.qa import normalize_answer
    gen = config.generation
    budget = int(config.solver.total_steps) * int(config.solver.prompts_per_step)
    chains = list(components.train_prompts)
    order = np.random.default_rng([int(config.seed), iteration, _GENERATION_STREAM]).permutation(len(chains))
    limit = len(chains) if gen.max_chains <= 0 else min(int(gen.max_chains), len(chains))
    per_call = int(gen.chains_per_call)
    if per_call < 1:
        raise ValueError(f"config.generation.chains_per_call={per_call} must be >= 1")
    rollout_fn = loop.ROLLOUT_FNS[config.rollout_fn]
    rollout_cfg = dict(config.rollout.to_dict(), group_size=1, temperature=float(gen.temperature))
    policy = _policy(params, components.model)
    source = f"drfree_iter{iteration}"
    pairs, rejected, counts, seen = [], [], collections.Counter(), set()
    tried, format_full, grounded = 0, 0, 0
    for call, start in enumerate(range(0, limit, per_call)):
        if len(pairs) >= budget:
            break
        batch = [chains[int(i)] for i in order[start:min(start + per_call, limit)]]
        seed = int(np.random.default_rng([int(config.seed), iteration, _GENERATION_STREAM, call]).integers(2**31 - 1))
        for t in rollout_fn(components, policy, batch, rollout_cfg, seed):
            tried += 1
            record = chain_of(t)
            check = check_proposal(t.response_text, record)
            format_full += abs(check.format_score - 1.0) <= 1e-9
            grounded += bool(check.grounded)
            reason = rejection_reason(check, seen)
            if reason is None and len(pairs) >= budget:
                reason = "surplus"  # only the pairs the solver's budget needs
            if reason is not None:
                counts[reason] += 1
                rejected.append({"chain_id": record["id"], "hops": int(t.prompt.hops), "reason": reason,
                                 "question": check.question, "answer": check.answer,
                                 "format_score": check.format_score, "grounded": check.grounded,
                                 "num_searches": int(t.num_searches), "response_text": t.response_text})
                continue
            seen.add(normalize_answer(check.question))
            # hops: the prompt's label (the chain's h; for the w/o KG proposer the requested h, which its
            # searches need not match: the Table 4 audit compares the two); passages: the evidence read, the
            # seed first (a w/o KG proposal without search has only the seed: its empty hop passage is left out)
            pairs.append({"uid": f"{source}/{len(pairs):06d}", "question": check.question, "answer": check.answer,
                          "golden_answers": [check.answer], "hops": int(t.prompt.hops), "data_source": source,
                          "chain_id": record["id"], "iteration": iteration, "num_searches": int(t.num_searches),
                          "passages": [{"title": p["title"], "text": p["text"]} for k, p in
                                       enumerate(record["passages"]) if k == 0 or p["text"]]})
    if not pairs:  # a weak proposer (e.g. a 135M model on CPU): the driver skips this iteration's solver
        log.warning("iteration %d generation: none of %d proposals became a pair (rejected: %s); the solver "
                    "stage is skipped", iteration, tried, dict(counts))
    _write_jsonl(out_dir / PAIRS_FILE, pairs)
    _write_jsonl(out_dir / REJECTED_FILE, rejected)
    hops = collections.Counter(p["hops"] for p in pairs)
    per = max(tried, 1)
    metrics = {"generation/tried": float(tried), "generation/pairs": float(len(pairs)),
               "generation/budget": float(budget), "generation/accept_rate": len(pairs) / per,
               "generation/format_full_rate": format_full / per, "generation/grounded_rate": grounded / per,
               **{f"generation/rejected_{r}": float(counts[r]) for r in REJECTION_REASONS},
               **{f"generation/hops_{h}": hops[h] / len(pairs) for h in sorted(hops)}}
    return [pair_prompt(p) for p in pairs], metrics


def _write_jsonl(path: pathlib.Path, rows: Sequence[dict]) -> None:
    """Write rows as jsonl through a temporary file, so a stopped run never leaves half a file."""
    if jax.process_index() != 0:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    tmp.replace(path)


# ------------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------------
def _train_stage(stage_cfg, directory: pathlib.Path, components, resume: bool) -> tuple[dict, object, bool]:
    """loop.train for one stage; (last metrics, final params, finished = all stage steps done)."""
    from searchjax.experiment import loop
    directory.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
        (directory / "config.json").write_text(json.dumps(stage_cfg.to_dict(), indent=2, default=str))
    started = (directory / "checkpoints").is_dir() and any((directory / "checkpoints").iterdir())
    like = components.params
    metrics = loop.train(stage_cfg, directory, resume=resume and started, components=components)
    params, step = restore_stage_params(directory, like, stage_cfg.model.master_dtype)
    return metrics, params, step == stage_cfg.total_steps


def _mark_done(directory: pathlib.Path, iteration: int, stage: str, metrics: dict) -> None:
    if jax.process_index() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / DONE_FILE).write_text(json.dumps({"iteration": iteration, "stage": stage,
                                                       "metrics": metrics}, sort_keys=True))


def _done(directory: pathlib.Path) -> dict | None:
    path = directory / DONE_FILE
    return json.loads(path.read_text())["metrics"] if path.exists() else None


def run_self_evolution(config, workdir: str | os.PathLike, *, resume: bool = False,
                       components: Components | None = None, solver_eval_prompts: Sequence | None = None) -> dict:
    """Run (or continue) the whole loop; returns {"iter<k>/<stage>/<metric>": value} of every finished stage.

    components: the proposer's run (`selfplay.build_components`: base model, tokenizer, chain prompts,
    retriever); built from the config when None. solver_eval_prompts: the solver's dev set for EM
    (default: config.solver.eval_data through setup.load_prompts, or none).
    """
    from searchjax.experiment import selfplay, setup
    workdir = pathlib.Path(workdir)
    plan = stage_plan(config)
    if not resume and any(stage_dir(workdir, k, s).exists() for k, s in plan):
        raise FileExistsError(f"{workdir} already holds a self-evolution run: pass resume=True (--resume) to "
                              "continue it, or use a new workdir")
    components = components or selfplay.build_components(config, workdir)
    if not isinstance(components, SelfPlayComponents):
        components = SelfPlayComponents(**{f.name: getattr(components, f.name) for f in dataclasses.fields(Components)})
    components = dataclasses.replace(components, proposer=selfplay.proposer_kind(config))  # config.proposer.kind
    if solver_eval_prompts is None:
        from searchjax.distributed import process_shard
        solver_eval_prompts = process_shard(setup.load_prompts(config.solver.eval_data)) \
            if config.solver.eval_data else []
    model, base = components.model, components.params
    master = config.model.master_dtype

    def frozen_model(iteration: int):
        """SelfPlayComponents.frozen of the proposer stage: None = the config's sections (in iteration 1
        path "" there is the base model, which is then the proposer's starting point)."""
        a = latest_trained(workdir, "solver", anchor_iteration(config, iteration))
        if iteration == 1 or (a == 0 and config.anchor.path):
            return None
        params = base if a == 0 else restore_stage_params(stage_dir(workdir, a, "solver"), base, master)[0]
        return model, jax.tree.map(jnp.copy, _policy(params, model)), components.tokenizer

    summary: dict[str, float] = {}
    for iteration, stage in plan:
        directory = stage_dir(workdir, iteration, stage)
        done = _done(directory)
        if done is None:
            if stage == "proposer":
                previous = latest_trained(workdir, "proposer", iteration - 1)
                start = base if previous == 0 else restore_stage_params(
                    stage_dir(workdir, previous, "proposer"), base, master)[0]
                stage_components = dataclasses.replace(components, params=start, frozen=frozen_model(iteration))
                metrics, _, finished = _train_stage(proposer_config(config, iteration), directory, stage_components,
                                                    resume)
            elif stage == "generation":
                current = latest_trained(workdir, "proposer", iteration)
                proposer = base if current == 0 else restore_stage_params(
                    stage_dir(workdir, current, "proposer"), base, master)[0]
                _, metrics = generate_pairs(config, components, proposer, iteration, directory)
                finished = True
            else:
                pairs = read_pairs(stage_dir(workdir, iteration, "generation") / PAIRS_FILE)
                if not pairs:  # nothing to train on: the previous solver carries over (and stays the anchor)
                    metrics, finished = {"solver/skipped": 1.0}, True
                else:
                    previous = latest_trained(workdir, "solver", iteration - 1)
                    start = base if previous == 0 else restore_stage_params(
                        stage_dir(workdir, previous, "solver"), base, master)[0]
                    stage_components = SelfPlayComponents(
                        model=model, params=start, tokenizer=components.tokenizer, retriever=components.retriever,
                        train_prompts=pairs, eval_prompts=list(solver_eval_prompts), mesh=components.mesh)
                    metrics, _, finished = _train_stage(solver_config(config, iteration), directory,
                                                        stage_components, resume)
            if not finished:  # SIGTERM inside a training stage: its checkpoint is saved; resume continues it
                break
            done = {k: float(v) for k, v in metrics.items()}
            _mark_done(directory, iteration, stage, done)
        summary.update({f"iter{iteration}/{stage}/{k}": v for k, v in done.items()})
    _write_jsonl(workdir / SUMMARY_FILE, [{"iteration": k, "stage": s, **(_done(stage_dir(workdir, k, s)) or {})}
                                          for k, s in plan if _done(stage_dir(workdir, k, s)) is not None])
    return summary

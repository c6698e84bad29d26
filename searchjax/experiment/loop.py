"""The host training loop: prompts -> rollout -> rewards -> advantages -> update, with logging and checkpoints.

One RL step (Search-R1's GRPO recipe, as verl runs it):

  1. take `prompts_per_step` prompts from the data stream (its position is checkpointed);
  2. roll out `rollout.group_size` trajectories per prompt with the current policy (`ROLLOUT_FNS`);
  3. score them (`REWARD_FNS`): per-trajectory rewards, optional per-group advantage overrides, metrics;
  4. advantages (`ADVANTAGE_FNS`; GRPO groups by `prompt.uid`, HRPO by `prompt.hops`), then overrides;
  5. pad into a batch, recompute the old policy's log-probs (and the reference's when kl_coef > 0) with
     the pre-update parameters, and log their mismatch with the sampler's log-probs (a reward that reads
     the policy's self-certainty, RLIF, gets the old-policy pass before step 3, from the same forward:
     searchjax/experiment/scoring.py);
  6. `batch.epochs` passes over mini-batches of `batch.mini_batch_size` trajectories, one optimizer step
     each, every step accumulating gradients over micro-batches of `batch.micro_batch_size`.

The rollout function, the reward (and the evaluation reward) and the advantage estimator are named in
the config and looked up in the three small dicts below: adding a method means adding a function and
a dict entry. Per-sample
metadata (group uid, hop count, data source) rides on each trajectory's `prompt`, so the same loop
trains the Search-R1 solver (multi-turn search, GRPO) and Dr.Free's proposer (single turn without
search, `rollout.search = False`, HRPO over hop labels).

Outputs under `workdir` (the step's logs: searchjax/experiment/step_log.py): checkpoints/ (orbax,
`checkpoint.py`), metrics.jsonl (one JSON object per step),
tb/ (TensorBoard), trajectories/step_XXXXXX.jsonl (sampled trajectories, with token ids, reusable as SFT
demonstrations), hf/step_XXXXXX/ (optional HF export: weights, tokenizer, generation config). SIGTERM finishes the current
step, saves a checkpoint and returns (multi-host: at a step every process agrees on, even when only one host got
the signal, `searchjax.distributed.watch_preemption`); `resume=True` continues from the latest checkpoint exactly (same
parameters, optimizer state, PRNG key and data position, so the same trajectories and metrics as an
uninterrupted run). Which workdirs a run may start or resume in, and how the logs survive a kill:
searchjax/experiment/run_dir.py.

Faults inside a run: an update whose loss or gradient is not finite is skipped by the trainer's guard
(searchjax/rl/trainer.py); a step whose rewards are not all finite skips its update too (counted the same
way: `update/skipped_total` grows by the step's updates). A step is "skipped" when no update of it was
applied; `config.max_consecutive_skipped_steps` of them in a row (0 = never) stop the run with
SkippedStepsError (no checkpoint of the skipped steps is written; resume from the last one after the fix).
A step in which more than `config.max_failure_rate` of the searches failed (after the retrieval client's
retries), or of the EviBack Teacher's requests (`JUDGE_FAILURE_METRICS`), stops the run with FailureRateError
before its update: a dead service would otherwise turn every observation into an error message and train on it.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pathlib
import time
from typing import Callable, Sequence

import jax
import numpy as np

from searchjax.agent.rollout import failure_metrics
from searchjax.experiment import run_dir, scoring, setup
from searchjax.experiment.setup import Components  # noqa: F401  (re-exported: loop.Components)
# (step_log's peak_rss_gib and step_line are also imported from here: main_job.py, the benches, the tests.)
from searchjax.experiment.step_log import (MetricWriter, dump_trajectories, logprob_mismatch, mean_metrics,
                                           peak_rss_gib, progress_bar, rollout_metrics, sampled_entropy, step_line)
from searchjax.rewards.base import RewardOutput, exact_match_reward, f1_reward
from searchjax.rl import advantages as adv_lib
from searchjax.rl import batching, checkpoint, trainer
from searchjax.tokenization import Tokenizer


# ------------------------------------------------------------------------------------------------------
# What a run is made of (searchjax.experiment.setup.Components); `build_components(config)` assembles it from the
# config, tests pass their own.
# ------------------------------------------------------------------------------------------------------
def search_agent_rollout(components: Components, params, prompts: list, rollout_cfg: dict, seed: int) -> list:
    """Search-R1 rollouts through `searchjax.agent.rollout.rollout` (multi-turn, or single turn with search=False).

    rollout_cfg: config.rollout as a dict, field for field `searchjax.agent.rollout.RolloutConfig`.
    """
    from searchjax.agent.rollout import RolloutConfig, rollout
    return rollout(components.model, params, components.tokenizer, components.retriever, prompts,
                   RolloutConfig(**rollout_cfg), seed=seed)


def _imported(module: str, name: str) -> Callable:
    """A table entry that imports `module.name` on first call: the method modules (judges, encoders, NER)
    are heavy to import and import this loop themselves."""
    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)
    call.__qualname__ = f"{module}.{name}"
    return call


# (components, policy params, prompts, config.rollout as a dict, seed) -> trajectories, prompt-major.
ROLLOUT_FNS: dict[str, Callable] = {
    "search_agent": search_agent_rollout,
    "drfree_proposer": _imported("searchjax.experiment.selfplay", "proposer_rollout_fn"),  # single turn, no search
}


def fixed_reward(fn: Callable[[Sequence], RewardOutput]) -> Callable:
    """A reward builder for a reward that needs no configuration."""
    return lambda config, components, workdir: fn


# name -> builder(config, components, workdir) -> RewardFn (trajectories -> RewardOutput). A builder lets a
# reward that needs a judge, an embedder or the policy itself (EviBack, information gain, CCS) set them up
# once from the config; the RewardFn it returns is called every step.
REWARD_FNS: dict[str, Callable] = {
    "exact_match": fixed_reward(exact_match_reward),
    "f1": fixed_reward(f1_reward),
    "eviback": _imported("searchjax.rewards.eviback", "build_eviback_reward"),
    "ccs": _imported("searchjax.rewards.cycle", "build_ccs_reward"),
    "drfree_information_gain": _imported("searchjax.experiment.selfplay", "build_information_gain_reward"),
    "drzero_difficulty": _imported("searchjax.experiment.selfplay", "build_difficulty_reward"),
    "drfree_ig_difficulty": _imported("searchjax.experiment.selfplay", "build_ig_difficulty_reward"),  # ablation
    # CCS's gold-free baselines. rlif reads the old-policy pass's logits (RewardFn.needs_self_certainty).
    "rlif": _imported("searchjax.rewards.rlif", "build_rlif_reward"),
    "ttrl": _imported("searchjax.rewards.ttrl", "build_ttrl_reward"),
    "constitutional_judge": _imported("searchjax.rewards.constitutional_judge", "build_cj_reward"),
    # A reward built from the ones above by config.compose.spec (searchjax.rewards.compose), e.g. "eviback(ccs)".
    "compose": lambda config, components, workdir: _imported("searchjax.rewards.compose", "build_composed_reward")(
        config, components, workdir, table=REWARD_FNS),
}


def grpo_estimator(rewards: np.ndarray, trajectories: Sequence, cfg) -> np.ndarray:
    """GRPO over each prompt's group (group id = prompt.uid)."""
    return adv_lib.grpo_advantages(rewards, [t.prompt.uid for t in trajectories], epsilon=cfg.epsilon,
                                   scale_by_std=cfg.scale_by_std)


def hrpo_estimator(rewards: np.ndarray, trajectories: Sequence, cfg) -> np.ndarray:
    """HRPO (Dr.Free eq. 9): z-scores within each hop count of the batch (gathered across processes)."""
    from searchjax import distributed
    hops = np.asarray([t.prompt.hops for t in trajectories], np.int64)
    all_rewards, all_hops = distributed.allgather((np.asarray(rewards, np.float32), hops))
    full = adv_lib.hrpo_advantages(all_rewards, all_hops, epsilon=cfg.epsilon, scale_by_std=cfg.scale_by_std)
    start = _process_offset(len(trajectories))
    return full[start:start + len(trajectories)]


def _process_offset(n_local: int) -> int:
    from searchjax import distributed
    sizes = distributed.allgather(np.asarray([n_local], np.int64))
    return int(np.sum(sizes[:jax.process_index()]))


# (rewards [N], trajectories, config.advantage) -> advantages [N] float32.
ADVANTAGE_FNS: dict[str, Callable] = {"grpo": grpo_estimator, "hrpo": hrpo_estimator}


def _lookup(table: dict, name: str, field: str):
    if name not in table:
        raise ValueError(f"config.{field}={name!r}; valid: {sorted(table)}")
    return table[name]


# ------------------------------------------------------------------------------------------------------
# Data stream: a seeded permutation per epoch; the position is one integer (checkpointed).
# ------------------------------------------------------------------------------------------------------
def _epoch_orders(n: int, batch_size: int, seed: int, last_epoch: int) -> list[np.ndarray]:
    """The prompt order of epochs 0..last_epoch: perm(seed, e), except that the batch straddling the boundary into
    epoch e never repeats a prompt it already took from the end of epoch e - 1.

    Such a batch takes its last k prompts from epoch e - 1 and its first batch_size - k from epoch e; a prompt of
    those first ones that is among the k is swapped with the earliest later prompt of epoch e that is not (one
    exists when batch_size <= n). Each epoch stays a permutation, so every prompt is still seen once per epoch.
    """
    orders = []
    for epoch in range(last_epoch + 1):
        order = np.random.default_rng([seed, epoch]).permutation(n)
        boundary = epoch * n
        k = boundary % batch_size  # prompts the straddling batch took from epoch - 1
        if epoch > 0 and k:
            taken = set(orders[-1][n - k:].tolist())
            head = batch_size - k
            spare = [j for j in range(head, n) if int(order[j]) not in taken]
            for i in range(head):
                if int(order[i]) in taken:
                    j = spare.pop(0)
                    order[i], order[j] = order[j], order[i]
        orders.append(order)
    return orders


def prompt_batch(prompts: Sequence, position: int, batch_size: int, seed: int) -> tuple[list, int]:
    """(the batch_size prompts starting at global `position`, next position); epoch e uses perm(seed, e), adjusted
    so that a batch spanning two epochs holds no prompt twice (`_epoch_orders`): a repeated question in one step
    would put two GRPO groups under one id."""
    n = len(prompts)
    if n == 0:
        raise ValueError("prompt_batch: no training prompts")
    if batch_size > n:
        raise ValueError(f"prompt_batch: {batch_size} prompts per step need at least {batch_size} distinct training "
                         f"prompts, got {n}")
    orders = _epoch_orders(n, batch_size, seed, (position + batch_size - 1) // n)
    out = []
    for p in range(position, position + batch_size):
        epoch, offset = divmod(p, n)
        out.append(prompts[int(orders[epoch][offset])])
    return out, position + batch_size


# ------------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------------
def loss_config(config) -> trainer.LossConfig:
    return trainer.LossConfig(temperature=config.rollout.temperature if config.rollout.temperature > 0 else 1.0,
                              **config.loss)


def check_batch_arithmetic(config, shards: int) -> None:
    """Trajectories per step, mini- and micro-batches, and the mesh's `shards` batch shards fit together."""
    n = config.prompts_per_step * config.rollout.group_size
    u = config.batch
    if u.mini_batch_size < 1 or n % u.mini_batch_size:
        raise ValueError(f"config.batch.mini_batch_size={u.mini_batch_size} must divide the "
                         f"{n} trajectories per step (prompts_per_step x rollout.group_size)")
    if u.micro_batch_size < 1 or u.mini_batch_size % u.micro_batch_size:
        raise ValueError(f"config.batch.micro_batch_size={u.micro_batch_size} must divide "
                         f"batch.mini_batch_size={u.mini_batch_size}")
    if u.micro_batch_size % shards:
        raise ValueError(f"config.batch.micro_batch_size={u.micro_batch_size} must be a multiple of the mesh's "
                         f"{shards} batch shards (data x fsdp)")


def validate(config, mesh) -> None:
    """Batch-size arithmetic on the run's mesh (the launchers check the whole config earlier, before any
    load: searchjax/experiment/validate.py)."""
    from searchjax.sharding import batch_shard_count
    check_batch_arithmetic(config, batch_shard_count(mesh))


def check_names(config) -> None:
    """Every registry name the config uses is an entry of the tables above."""
    names = (("rollout_fn", config.rollout_fn, ROLLOUT_FNS), ("reward_fn", config.reward_fn, REWARD_FNS),
             ("eval_reward_fn", config.eval_reward_fn, REWARD_FNS),
             ("advantage.estimator", config.advantage.estimator, ADVANTAGE_FNS))
    for field, name, table in names:
        if name not in table:
            raise ValueError(f"config.{field}={name!r} is not registered; valid: {sorted(table)}")


class SkippedStepsError(RuntimeError):
    """config.max_consecutive_skipped_steps steps in a row applied no update (non-finite rewards or losses)."""


class FailureRateError(RuntimeError):
    """More than config.max_failure_rate of one step's searches or Teacher requests failed: the run stops."""


# Judge failures a reward reports in its metrics: failed-request key -> the keys of the requests asked (summed).
# (CCS and the Constitutional Judge check their own rate inside their reward: searchjax/rewards/judge_failures.py.)
JUDGE_FAILURE_METRICS = {"eviback/teacher_failures": ("eviback/stage_a_requests", "eviback/stage_b_requests")}


def check_failure_rate(step: int, what: str, failed: float, asked: float, max_rate: float, hint: str) -> None:
    """Raise FailureRateError when failed / asked, summed over every process, exceeds max_rate (a collective:
    every process calls it and every process raises, so none is left waiting in the next step's collectives)."""
    from searchjax import distributed
    failed, asked = np.sum(distributed.allgather(np.asarray([[failed, asked]], np.float64)), axis=0)
    if asked and failed / asked > max_rate:
        raise FailureRateError(f"stopped at step {step}: {int(failed)} of {int(asked)} {what} failed "
                               f"({failed / asked:.1%}), above config.max_failure_rate={max_rate}; {hint}. Nothing "
                               "of this step was trained on or saved: fix the cause, then --resume")


def _all_processes(flag: bool) -> bool:
    """True when `flag` holds on every process (each process scores only its own trajectories)."""
    from searchjax import distributed
    return bool(np.all(distributed.allgather(np.asarray([flag], bool))))


def train(config, workdir: str | os.PathLike, *, resume: bool = False,
          components: Components | None = None) -> dict[str, float]:
    """Run `config.total_steps` RL steps (or continue them); returns the last step's metrics."""
    from searchjax.rl import sft
    workdir = pathlib.Path(workdir)
    if components is None:
        check_names(config)  # before the expensive build (tests pass their own components and tables)
    fingerprints = run_dir.accept(workdir, config, resume=resume)  # before anything loads or is written
    if jax.process_index() == 0:
        run_dir.record(workdir, config, fingerprints)
    components = components or setup.build_components(config)
    mesh = components.mesh if components.mesh is not None else setup.make_mesh_from_config(config.mesh)
    validate(config, mesh)
    model, tokenizer = components.model, components.tokenizer
    lcfg = loss_config(config)
    ocfg = trainer.OptimConfig(**config.optim)
    optimizer = trainer.make_optimizer(ocfg)
    keep_reference = lcfg.kl_coef > 0
    master_dtype = config.model.master_dtype or None
    pshard = setup.param_shardings_for(model, mesh)
    params = jax.device_put(components.params, pshard)
    shardings = trainer.state_shardings(optimizer, params, pshard, mesh, master_dtype=master_dtype,
                                        keep_reference=keep_reference)
    manager = checkpoint.make_manager(workdir / "checkpoints", max_to_keep=config.checkpoint.max_to_keep)
    is_main = jax.process_index() == 0
    if resume:  # run_dir.accept made sure there is a checkpoint
        abstract = jax.eval_shape(lambda p: trainer.init_train_state(p, optimizer, master_dtype=master_dtype,
                                                                     keep_reference=keep_reference), params)
        state, loop_state, start = checkpoint.restore(manager, checkpoint.abstract_like(abstract, shardings))
        rng = np.asarray(loop_state["rng"], np.uint32)
        position = int(loop_state["data_position"])
        skipped_in_row = int(loop_state.get("skipped_in_row", 0))
    else:
        if config.sft.steps > 0 and not components.demonstrations:
            raise ValueError(f"config.sft.steps={config.sft.steps} but there are no demonstrations "
                             "(set config.sft.demonstrations to a jsonl of trajectories)")
        if config.sft.steps > 0:  # warm start; the KL reference is then the warm-started policy
            params, history = sft.warm_start(config, model, params, pshard, mesh, components.demonstrations,
                                             pad_id=tokenizer.pad_token_id)
            if is_main:
                run_dir.write_jsonl(workdir / "sft.jsonl", ({"step": i + 1, **h} for i, h in enumerate(history)))
        state = trainer.init_train_state(params, optimizer, master_dtype=master_dtype,
                                         keep_reference=keep_reference, shardings=shardings)
        start, rng, position = 0, np.asarray(jax.random.key_data(jax.random.key(config.seed)), np.uint32), 0
        skipped_in_row = 0
    del params

    max_skipped = config.max_consecutive_skipped_steps
    rollout_fn = _lookup(ROLLOUT_FNS, config.rollout_fn, "rollout_fn")
    reward_fn = _lookup(REWARD_FNS, config.reward_fn, "reward_fn")(config, components, workdir)
    eval_reward_fn = (reward_fn if config.eval_reward_fn == config.reward_fn else
                      _lookup(REWARD_FNS, config.eval_reward_fn, "eval_reward_fn")(config, components, workdir))
    advantage_fn = _lookup(ADVANTAGE_FNS, config.advantage.estimator, "advantage.estimator")
    if config.eval.every > 0 and scoring.needs_self_certainty(eval_reward_fn):
        raise ValueError(f"config.eval_reward_fn={config.eval_reward_fn!r} needs the old-policy pass's self-certainty, "
                         "which evaluation rollouts do not run: evaluate with a reward of the answers (exact_match, "
                         "as configs/ccs.py does) or set config.eval.every=0")
    # The initial params now live on as the state's reference (or were copied into its master weights);
    # drop this run's handle on them so a run without a KL term does not hold a second model.
    components = dataclasses.replace(components, params=None)
    rollout_cfg = config.rollout.to_dict()
    step_fn = trainer.make_train_step(model, lcfg, ocfg, mesh=mesh, shardings=shardings)
    logprob_fn = trainer.make_logprob_fn(model, lcfg.temperature, mesh=mesh, param_shardings=pshard)
    # RLIF: the old-policy pass also returns self-certainty and runs before the reward (scoring.py's docstring).
    certainty_fn = scoring.make_certainty_fn(reward_fn, model, lcfg.temperature, mesh=mesh, param_shardings=pshard)
    u = config.batch
    writer = MetricWriter(workdir, start, enabled=is_main)
    updates_per_step = u.epochs * -(-config.prompts_per_step * config.rollout.group_size // u.mini_batch_size)
    # SIGTERM -> save and stop, at a step every process agrees on (JAX's preemption sync point when multi-host).
    from searchjax import distributed
    preempted, restore_handler = distributed.watch_preemption()
    progress = progress_bar(config, start)
    metrics: dict[str, float] = {}
    try:
        for step in range(start + 1, config.total_steps + 1):
            t_step = time.perf_counter()
            key, sub = jax.random.split(jax.random.wrap_key_data(rng))
            rng = np.asarray(jax.random.key_data(key), np.uint32)
            seed = int(jax.random.randint(sub, (), 0, np.iinfo(np.int32).max))
            prompts, position = prompt_batch(components.train_prompts, position, config.prompts_per_step, config.seed)
            policy = trainer.cast_tree(state.params, model.config.weight_dtype)

            t0 = time.perf_counter()
            trajectories = rollout_fn(components, policy, prompts, rollout_cfg, seed)
            t_rollout = time.perf_counter() - t0
            step_failures = failure_metrics(trajectories)
            check_failure_rate(step, "searches", step_failures["rollout/retrieval_errors"],
                               step_failures["rollout/searches_sent"], config.max_failure_rate,
                               "is the retrieval server up (config.retrieval)? the log has each error")
            batch, extras, t_logprob = None, {}, 0.0
            if certainty_fn is not None:  # the pass first: the reward reads its statistics
                t0 = time.perf_counter()
                batch, tail = scoring.step_batch(trajectories, np.zeros(len(trajectories)), config,
                                                 tokenizer.pad_token_id)
                batch["old_logprobs"], extras = scoring.certainty_pass(certainty_fn, state.params, batch, trajectories,
                                                                       u.micro_batch_size, mesh, tail=tail)
                t_logprob = time.perf_counter() - t0
            t0 = time.perf_counter()
            reward, nonfinite = scoring.score(reward_fn, trajectories, **extras)
            t_reward = time.perf_counter() - t0
            check_failure_rate(step, "Teacher requests", sum(reward.metrics.get(k, 0.0) for k in JUDGE_FAILURE_METRICS),
                               sum(reward.metrics.get(k, 0.0) for keys in JUDGE_FAILURE_METRICS.values() for k in keys),
                               config.max_failure_rate, "is the judge endpoint up (config.teacher)? the audit file "
                               "has each error")
            rewards = np.asarray(reward.rewards)
            finite_rewards = _all_processes(not nonfinite and bool(np.isfinite(rewards).all()))
            t_update = 0.0
            if finite_rewards:
                advantages = scoring.step_advantages(advantage_fn, reward, trajectories, config.advantage)
                if batch is None:
                    batch, tail = scoring.step_batch(trajectories, advantages, config, tokenizer.pad_token_id)
                else:  # padded before the reward (RLIF): its rows beyond the trajectories keep advantage 0
                    batch["advantages"][:len(trajectories)] = advantages
                t0 = time.perf_counter()
                if "old_logprobs" not in batch:
                    batch["old_logprobs"] = trainer.batch_logprobs(logprob_fn, state.params, batch, u.micro_batch_size,
                                                                   mesh, tail=tail)
                if keep_reference:
                    batch["ref_logprobs"] = trainer.batch_logprobs(logprob_fn, state.ref_params, batch,
                                                                   u.micro_batch_size, mesh, tail=tail)
                t_logprob += time.perf_counter() - t0
                mismatch = logprob_mismatch(batch.pop("sampler_logprobs"), batch["old_logprobs"], batch["loss_mask"])
                mismatch["rollout/entropy_mc"] = sampled_entropy(batch["old_logprobs"], batch["loss_mask"])

                t0 = time.perf_counter()
                update_rows = []
                for _ in range(u.epochs):
                    for mini in batching.split_rows(batch, u.mini_batch_size):
                        stacked = batching.stack_micro_batches(mini, u.micro_batch_size)
                        state, m = step_fn(state, trainer.place_batch(stacked, mesh, stacked=True), tail)
                        update_rows.append(m)
                update_rows = [{k: float(v) for k, v in jax.device_get(m).items()} for m in update_rows]
                t_update = time.perf_counter() - t0
                skipped = all(r["update_skipped"] >= 1.0 for r in update_rows)
                reason = "non-finite loss or gradient in every update"
                update_metrics = {f"update/{k}": v for k, v in mean_metrics(update_rows).items()}
            else:  # no advantage of a NaN reward is meaningful: skip the update, counted as the guard counts
                advantages, mismatch = np.zeros(rewards.shape, np.float32), {}
                state = state.replace(step=jax.device_put(state.step + updates_per_step, shardings.step),
                                      skipped=jax.device_put(state.skipped + updates_per_step, shardings.skipped))
                skipped = True
                reason = nonfinite or f"non-finite reward ({int(np.sum(~np.isfinite(rewards)))} of {rewards.size})"
                update_metrics = {"update/update_skipped": 1.0, "update/skipped_total": float(jax.device_get(state.skipped))}
            skipped_in_row = skipped_in_row + 1 if skipped else 0

            metrics = {f"reward/{k}": float(v) for k, v in reward.metrics.items()}
            good = rewards[np.isfinite(rewards)]
            metrics.update({"reward/mean": float(good.mean()) if good.size else 0.0,
                            "reward/std": float(good.std()) if good.size else 0.0,
                            "reward/nonfinite": float(rewards.size - good.size),
                            "advantage/abs_mean": float(np.abs(advantages).mean()),
                            "step/skipped": float(skipped), "step/skipped_in_row": float(skipped_in_row),
                            **rollout_metrics(trajectories), **mismatch, **update_metrics})
            metrics.update({"time/rollout": t_rollout, "time/reward": t_reward, "time/old_logprob": t_logprob,
                            "time/update": t_update})
            if config.eval.every > 0 and step % config.eval.every == 0:
                metrics.update(evaluate(config, components, state.params, rollout_fn, eval_reward_fn, rollout_cfg))
            metrics["time/step"] = time.perf_counter() - t_step
            metrics["time/tokens_per_s"] = sum(len(t.prompt_ids) + len(t.response_ids)
                                               for t in trajectories) / metrics["time/step"]
            metrics["host/peak_rss_gib"] = peak_rss_gib()
            writer.write(step, metrics)
            if is_main and config.logging.trajectories_per_step != 0:
                dump_trajectories(workdir / "trajectories" / f"step_{step:06d}.jsonl", step, trajectories,
                                  reward.rewards, advantages, config.logging.trajectories_per_step)
            progress.update(1)
            progress.set_postfix(reward=f"{metrics['reward/mean']:.3f}", refresh=False)
            if is_main:
                progress.write(step_line(step, config.total_steps, metrics, reason if skipped else ""))
            if max_skipped and skipped_in_row >= max_skipped:
                raise SkippedStepsError(
                    f"stopped at step {step}: {skipped_in_row} consecutive steps applied no update (the last: "
                    f"{reason}; config.max_consecutive_skipped_steps={max_skipped}); the newest checkpoint is "
                    f"step {checkpoint.latest_step(manager)}: fix the cause, then --resume")
            stop = preempted(step)  # every process, every step: no process may enter a save alone
            if stop or step == config.total_steps or (config.checkpoint.every > 0 and step % config.checkpoint.every == 0):
                checkpoint.save(manager, step, state, {"rng": rng.tolist(), "data_position": position, "step": step,
                                                       "skipped_in_row": skipped_in_row})
                if config.checkpoint.export_hf:  # every process takes part (the weights are gathered)
                    checkpoint.export_hf(model, state.params, workdir / "hf" / f"step_{step:06d}",
                                         tokenizer=tokenizer if isinstance(tokenizer, Tokenizer) else None)
            if stop:
                break
    finally:
        progress.close()
        writer.close()
        restore_handler()
        manager.close()
    return metrics


def evaluate(config, components: Components, params, rollout_fn, reward_fn, rollout_cfg) -> dict[str, float]:
    """Greedy single-sample rollouts on the first `eval.num_prompts` eval prompts: "eval/" reward and rollout metrics."""
    prompts = components.eval_prompts[:config.eval.num_prompts] if config.eval.num_prompts > 0 else components.eval_prompts
    if not prompts:
        return {}
    cfg = dict(rollout_cfg, group_size=1, temperature=0.0)
    policy = trainer.cast_tree(params, components.model.config.weight_dtype)
    trajectories = rollout_fn(components, policy, prompts, cfg, config.eval.seed)
    reward = reward_fn(trajectories)
    out = {"eval/reward": float(reward.rewards.mean())}
    out.update({f"eval/{k.split('/', 1)[1]}": v for k, v in rollout_metrics(trajectories).items()})
    return out

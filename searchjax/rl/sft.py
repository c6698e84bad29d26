"""Supervised warm start on demonstration trajectories (before RL, or on its own).

The loss is masked next-token cross-entropy, `searchjax.rl.losses.sft_loss` on
`token_logprobs(model, params, ids, mask)`, over the tokens a demonstration's loss mask selects:

    L = - sum_{b,t} m_{b,t} log p(x_{b,t} | x_{b,<t}) / sum_{b,t} m_{b,t}       ("token-mean")

For search-agent demonstrations the mask is 1 on the policy's own turns (think / search / answer text)
and 0 on the prompt and on the retrieved <information> blocks, exactly as the RL loss masks them: the
policy imitates the actions, never the retriever's text.

A demonstration is anything with `prompt_ids`, `response_ids` and `loss_mask` (a rollout `Trajectory`,
a `Demonstration`, or a row of the loop's trajectories/step_*.jsonl dumps read by `load_demonstrations`).
The update is the same jitted, sharded, donated `trainer.train_step` as RL's, with `LossConfig(kind="sft")`.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any, Callable, Sequence

import numpy as np

from searchjax.data.jsonl import iter_jsonl
from searchjax.rl import batching, trainer


@dataclasses.dataclass(frozen=True)
class Demonstration:
    """Token ids of one demonstration; loss_mask has one entry per response token (1 = imitate)."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]

    def __post_init__(self):
        if len(self.loss_mask) != len(self.response_ids):
            raise ValueError(f"Demonstration: {len(self.response_ids)} response_ids but {len(self.loss_mask)} "
                             f"loss_mask entries")

    @property
    def sampler_logprobs(self) -> tuple[float, ...]:  # batching's layout expects the field; unused by SFT
        return (0.0,) * len(self.response_ids)


def load_demonstrations(path: str | os.PathLike) -> list[Demonstration]:
    """Demonstrations from a jsonl file of {"prompt_ids", "response_ids", "loss_mask"} rows (the loop's dumps)."""
    path = pathlib.Path(path)
    out = []
    for where, row in iter_jsonl(path):
        missing = [k for k in ("prompt_ids", "response_ids", "loss_mask") if k not in row]
        if missing:
            raise ValueError(f"{where}: missing field(s) {missing}")
        out.append(Demonstration(tuple(row["prompt_ids"]), tuple(row["response_ids"]), tuple(row["loss_mask"])))
    if not out:
        raise ValueError(f"{path}: no demonstrations")
    return out


def as_demonstration(trajectory: Any) -> Demonstration:
    return Demonstration(tuple(trajectory.prompt_ids), tuple(trajectory.response_ids), tuple(trajectory.loss_mask))


def sft_batch(demonstrations: Sequence[Any], step: int, batch_size: int, seed: int) -> list:
    """The demonstrations of SFT step `step` (0-based): consecutive slices of a seeded permutation per epoch."""
    n = len(demonstrations)
    out = []
    for p in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(p, n)
        out.append(demonstrations[int(np.random.default_rng([seed, epoch]).permutation(n)[offset])])
    return out


def warm_start(config, model, params: Any, param_shardings: Any, mesh, demonstrations: Sequence[Any], *,
               pad_id: int, on_step: Callable[[int, dict], None] | None = None) -> tuple[Any, list[dict[str, float]]]:
    """`config.sft.steps` SFT steps from `params`; returns (params in the model's param dtype, per-step metrics).

    Uses a fresh AdamW (config.sft.learning_rate / warmup_steps; betas, eps, weight decay and clipping
    from config.optim); the optimizer state is discarded afterwards, as RL starts its own. on_step(step, metrics)
    is called after each step (1-based), e.g. to print progress: a CPU warm start takes minutes.
    """
    import jax
    s = config.sft
    if s.batch_size % s.micro_batch_size:
        raise ValueError(f"config.sft.batch_size={s.batch_size} must be a multiple of "
                         f"sft.micro_batch_size={s.micro_batch_size}")
    optim = trainer.OptimConfig(**dict(config.optim, learning_rate=s.learning_rate, warmup_steps=s.warmup_steps))
    loss = trainer.LossConfig(kind="sft", aggregation="token-mean")
    optimizer = trainer.make_optimizer(optim)
    master_dtype = config.model.master_dtype or None
    shardings = trainer.state_shardings(optimizer, params, param_shardings, mesh, master_dtype=master_dtype,
                                        keep_reference=False)
    state = trainer.init_train_state(params, optimizer, master_dtype=master_dtype, shardings=shardings)
    step_fn = trainer.make_train_step(model, loss, optim, mesh=mesh, shardings=shardings)
    history = []
    for step in range(s.steps):
        demos = sft_batch(demonstrations, step, s.batch_size, s.seed)
        batch = batching.make_batch(demos, np.zeros(len(demos), np.float32), pad_id=pad_id,
                                    prompt_buckets=config.batch.prompt_buckets,
                                    response_buckets=config.batch.response_buckets,
                                    row_multiple=s.micro_batch_size)
        batch.pop("sampler_logprobs")
        stacked = batching.stack_micro_batches(batch, s.micro_batch_size)
        tail = batching.loss_columns(batch)
        state, metrics = step_fn(state, trainer.place_batch(stacked, mesh, stacked=True), tail)
        history.append({k: float(v) for k, v in jax.device_get(metrics).items()})
        if on_step is not None:
            on_step(step + 1, history[-1])
    return trainer.cast_tree(state.params, model.config.weight_dtype), history

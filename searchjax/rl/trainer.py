"""The jitted, sharded policy update: train state, AdamW, micro-batch gradient accumulation, NaN guard.

One optimizer step consumes one mini-batch (counted in trajectories) laid out as [M, b, ...]: M
micro-batches of b rows (`batching.stack_micro_batches`). The step scans over the micro-batches,
summing each one's unreduced loss and its gradient, and divides once by the summed denominator:

    loss = sum_k S_k / sum_k D_k,      grad = sum_k grad(S_k) / sum_k D_k

where (S_k, D_k) is `searchjax.rl.losses.aggregate_loss`'s (sum, denominator) of micro-batch k. The
denominators do not depend on the parameters, so this is the full mini-batch's gradient exactly (up
to float summation order), whatever M is.

The policy loss (`losses.policy_loss`) needs, per token, the sampled token's log-prob under

* the current parameters: `searchjax.scoring.token_logprobs(model, params, ids, mask, temperature=tau)`,
  i.e. log softmax(logits / tau) (its jittable core `tail_logprobs`), differentiated here;
* the old policy: the same function of the pre-update parameters, recomputed after the rollout with
  `batch_logprobs` (as verl does), stored in the batch as "old_logprobs". The sampler's own log-probs
  are not used in the ratio; the loop only logs their mismatch;
* the frozen reference (KL term, when kl_coef > 0): `batch_logprobs` of `state.ref_params`, stored as
  "ref_logprobs".

Precision: `state.params` are the master weights. With `master_dtype="float32"` and a model whose
`param_dtype` is bfloat16 (the papers' BF16 mixed precision), the forward runs on a bfloat16 cast of
float32 masters, and gradients, Adam moments and updates stay float32. Without master weights the
parameters are stored and updated in the model's param dtype (updates below bf16's resolution vanish).

Scored columns: `tail` (static; `batching.loss_columns`) limits the LM head to the last `tail` of the
T - 1 log-prob columns, those that hold every loss-masked token (the response bucket, since responses
start at column P). The body still sees the whole sequence; the head, about a sixth of the update on
SmolLM2 at 128 + 384 tokens, skips the prompt. The loss is the same function of the same tokens.

Non-finite guard: if the loss or the gradient norm is NaN/Inf, the step leaves params and optimizer
state untouched (the schedule does not advance), still increments `step`, and increments `skipped`.

Sharding: with a mesh, the state is laid out by `searchjax.models.param_shardings` (optimizer moments
follow their parameters, scalars are replicated), batches by the "batch" rule (data x fsdp), and the
step's input state is donated.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from searchjax.rl import losses
from searchjax.sharding import with_activation_sharding

LOSS_KINDS = ("policy", "sft")
OPTIMIZERS = ("adamw", "sgd")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Optimizer hyperparameters (the config's `optim` section, field for field)."""

    kind: str = "adamw"  # "adamw" | "sgd" (plain SGD: the tests' exact-gradient checks)
    learning_rate: float = 1e-6
    warmup_steps: int = 0  # linear warmup over this many applied updates, then constant
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01  # decoupled (AdamW), on every parameter, as verl's actor
    max_grad_norm: float = 1.0  # global-norm clipping; 0 disables

    def __post_init__(self):
        if self.kind not in OPTIMIZERS:
            raise ValueError(f"optim.kind={self.kind!r}; valid: {OPTIMIZERS}")
        if self.learning_rate <= 0 or self.warmup_steps < 0 or self.max_grad_norm < 0:
            raise ValueError(f"optim: need learning_rate > 0, warmup_steps >= 0, max_grad_norm >= 0; got {self}")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """What the update minimises (the config's `loss` section, field for field); static under jit."""

    kind: str = "policy"  # "policy" (clipped surrogate + KL) | "sft" (masked next-token cross-entropy)
    temperature: float = 1.0  # log-probs are of softmax(logits / temperature), the sampler's distribution
    clip_low: float = 0.2  # ratio clipped below at 1 - clip_low
    clip_high: float = 0.2  # ratio clipped above at 1 + clip_high (DAPO's clip-higher when > clip_low)
    clip_ratio_c: float = 0.0  # dual-clip bound c (> 1) for negative advantages; 0 = off
    kl_coef: float = 0.0  # coefficient of the KL(policy || reference) penalty; 0 = no reference needed
    kl_kind: str = "k3"  # "k1" | "k2" | "k3" (losses.kl_penalty)
    aggregation: str = "token-mean"  # losses.AGGREGATION_MODES

    def __post_init__(self):
        if self.kind not in LOSS_KINDS:
            raise ValueError(f"loss.kind={self.kind!r}; valid: {LOSS_KINDS}")
        if not self.temperature > 0:
            raise ValueError(f"loss.temperature must be > 0, got {self.temperature}")
        if self.aggregation not in losses.AGGREGATION_MODES:
            raise ValueError(f"loss.aggregation={self.aggregation!r}; valid: {losses.AGGREGATION_MODES}")
        if self.kl_kind not in losses.KL_KINDS:
            raise ValueError(f"loss.kl_kind={self.kl_kind!r}; valid: {losses.KL_KINDS}")


@flax.struct.dataclass
class TrainState:
    """Everything the update changes. step: int32 updates attempted; skipped: int32 updates the guard dropped."""

    step: jax.Array
    params: Any  # master weights
    opt_state: Any
    ref_params: Any  # frozen reference policy (model param dtype), or None without a KL term
    skipped: jax.Array


def warmup_constant_schedule(learning_rate: float, warmup_steps: int) -> optax.Schedule:
    """lr_n = learning_rate * min(1, (n + 1) / warmup_steps) for the n-th applied update (n from 0).

    (n + 1) rather than verl/HF's n: their first update runs at lr 0 and wastes a rollout.
    """
    if warmup_steps == 0:
        return optax.constant_schedule(learning_rate)
    return lambda count: learning_rate * jnp.minimum(1.0, (count + 1) / warmup_steps)


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """clip_by_global_norm(max_grad_norm) then AdamW (float32 first moment) or SGD, on the warmup schedule."""
    schedule = warmup_constant_schedule(cfg.learning_rate, cfg.warmup_steps)
    if cfg.kind == "adamw":
        inner = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
                            mu_dtype=jnp.float32)
    else:
        inner = optax.sgd(schedule)
    clip = optax.clip_by_global_norm(cfg.max_grad_norm) if cfg.max_grad_norm > 0 else optax.identity()
    return optax.chain(clip, inner)


def cast_tree(tree: Any, dtype) -> Any:
    """Every floating leaf cast to dtype (identity when it already has it)."""
    dtype = jnp.dtype(dtype)
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


# ------------------------------------------------------------------------------------------------------
# State creation and shardings
# ------------------------------------------------------------------------------------------------------
def _master_dtype(params: Any, master_dtype: str | None):
    return jnp.dtype(master_dtype) if master_dtype else jax.tree.leaves(params)[0].dtype


def state_shardings(optimizer: optax.GradientTransformation, params: Any, param_shardings: Any, mesh: Mesh,
                    *, master_dtype: str | None, keep_reference: bool) -> TrainState:
    """TrainState of NamedShardings: params/ref like `param_shardings`, optimizer moments like their params."""
    abstract = jax.eval_shape(lambda p: optimizer.init(cast_tree(p, _master_dtype(p, master_dtype))), params)
    scalar = NamedSharding(mesh, PartitionSpec())
    opt = optax.tree_map_params(optimizer, lambda _, s: s, abstract, param_shardings,
                                transform_non_params=lambda _: scalar)
    return TrainState(step=scalar, params=param_shardings, opt_state=opt,
                      ref_params=param_shardings if keep_reference else None, skipped=scalar)


def init_train_state(params: Any, optimizer: optax.GradientTransformation, *, master_dtype: str | None = None,
                     keep_reference: bool = False, shardings: TrainState | None = None) -> TrainState:
    """A fresh TrainState from initial (e.g. pretrained) params, created directly in `shardings`.

    master_dtype: dtype of the master weights ("float32" for BF16 mixed precision; None = params' dtype).
    keep_reference: also keep the initial params, frozen, as the KL reference policy.
    """
    def init(p):
        master = cast_tree(p, _master_dtype(p, master_dtype))
        return TrainState(step=jnp.zeros((), jnp.int32), params=master, opt_state=optimizer.init(master),
                          ref_params=None, skipped=jnp.zeros((), jnp.int32))
    state = jax.jit(init, out_shardings=None if shardings is None else shardings.replace(ref_params=None))(params)
    if not keep_reference:
        return state
    # The reference is the caller's params themselves, not a copy (a model's worth of memory saved): the
    # update never donates or changes it (`make_train_step` keeps it out of the jitted step).
    ref = params if shardings is None else jax.device_put(params, shardings.ref_params)
    return state.replace(ref_params=ref)


def batch_rows_sharding(mesh: Mesh, rules=None, *, stacked: bool) -> NamedSharding:
    """Sharding of every batch leaf: rows over the "batch" rule (data x fsdp), other dims replicated.

    stacked=True for [M, b, ...] micro-batch stacks (M replicated). A PartitionSpec shorter than a
    leaf's rank replicates the remaining dimensions, so one sharding fits [b], [b, T] and [b, T - 1].
    """
    from searchjax.sharding import batch_sharding
    rows = batch_sharding(mesh, rules, ndim=1).spec
    return NamedSharding(mesh, PartitionSpec(None, *rows) if stacked else rows)


def place_batch(batch: dict, mesh: Mesh | None, rules=None, *, stacked: bool) -> dict:
    """Host numpy batch -> global jax arrays laid out by `batch_rows_sharding` (identity without a mesh).

    Each process passes its own rows; `searchjax.distributed.global_batch` assembles the global batch
    without moving rows between processes (single process: a plain device_put).
    """
    if mesh is None:
        return batch
    from searchjax.distributed import global_batch
    return global_batch(batch, batch_rows_sharding(mesh, rules, stacked=stacked))


# ------------------------------------------------------------------------------------------------------
# Log-probs and losses
# ------------------------------------------------------------------------------------------------------
def _token_logprobs(model, params, input_ids, attention_mask, temperature: float, tail: int | None = None):
    """[B, tail] log-probs of the last `tail` (default all T - 1) next tokens under softmax(logits / temperature),
    params cast to the model's dtype.

    `searchjax.scoring.tail_logprobs` is the jittable core of `token_logprobs` (which adds host-side
    bucketing around it); batches here are already bucketed by `batching`.
    """
    from searchjax.scoring import tail_logprobs
    compute = cast_tree(params, model.config.weight_dtype)
    return tail_logprobs(model, compute, input_ids, attention_mask, temperature,
                         tail=input_ids.shape[1] - 1 if tail is None else tail)


PER_TOKEN_KEYS = ("loss_mask", "old_logprobs", "ref_logprobs", "sampler_logprobs")  # [B, T - 1] batch arrays


def _last_columns(x: jax.Array, tail: int | None) -> jax.Array:
    return x if tail is None else x[:, x.shape[1] - tail:]


def make_logprob_fn(model, temperature: float, *, mesh: Mesh | None = None, rules=None,
                    param_shardings: Any = None) -> Callable:
    """Jitted (params, input_ids [B, T], attention_mask [B, T], tail=None) -> [B, tail or T - 1] float32 token
    log-probs (`tail` is static: the last columns only, see the module docstring).

    The params are cast to the model's param dtype first, exactly as in the update, so that the old
    policy's log-probs and the update's agree on a ratio of 1 before the first step.
    """
    fn = lambda params, ids, mask, tail=None: _token_logprobs(model, params, ids, mask, temperature, tail)
    if mesh is None:
        return jax.jit(fn, static_argnums=3)
    rows = batch_rows_sharding(mesh, rules, stacked=False)
    fn = with_activation_sharding(fn, mesh, rules)
    return jax.jit(fn, in_shardings=(param_shardings, rows, rows), out_shardings=rows, static_argnums=3)


def batch_logprobs(logprob_fn: Callable, params: Any, batch: dict, micro_batch_size: int,
                   mesh: Mesh | None = None, rules=None, *, tail: int | None = None) -> np.ndarray:
    """logprob_fn over `batch` in chunks of micro_batch_size rows (one compiled shape), back on the host:
    [B, T - 1], with zeros left of the last `tail` columns when tail is given (see the module docstring).

    Multi-host: each process passes its own rows and gets its own rows' log-probs back.
    """
    rows = len(batch["input_ids"])
    if rows % micro_batch_size:
        raise ValueError(f"batch_logprobs: {rows} rows are not a multiple of micro_batch_size {micro_batch_size}")
    from searchjax.distributed import to_host
    out = []
    for i in range(0, rows, micro_batch_size):
        chunk = place_batch({k: batch[k][i:i + micro_batch_size] for k in ("input_ids", "attention_mask")}, mesh,
                            rules, stacked=False)
        logp = to_host(logprob_fn(params, chunk["input_ids"], chunk["attention_mask"], tail))  # all processes' rows
        start = jax.process_index() * micro_batch_size  # global_batch stacks the processes' rows in order
        out.append(logp[start:start + micro_batch_size])
    logp = np.concatenate(out, axis=0).astype(np.float32)
    columns = batch["input_ids"].shape[1] - 1
    return np.pad(logp, ((0, 0), (columns - logp.shape[1], 0)))


def micro_batch_loss(model, cfg: LossConfig, params: Any, micro: dict,
                     tail: int | None = None) -> tuple[jax.Array, tuple]:
    """(loss sum, (denominator, metrics)) of one micro-batch [b, ...] under `cfg` (see module docstring),
    over the last `tail` log-prob columns (all by default; every loss-masked column must be among them)."""
    logp = _token_logprobs(model, params, micro["input_ids"], micro["attention_mask"], cfg.temperature, tail)
    micro = {k: _last_columns(v, tail) if k in PER_TOKEN_KEYS else v for k, v in micro.items()}
    mask = micro["loss_mask"]
    if cfg.kind == "sft":
        loss_sum, denom = losses.sft_loss(logp, mask, cfg.aggregation)
        metrics = {"loss/sft": losses.masked_mean(-logp, mask), "tokens": jnp.sum(mask)}
        return loss_sum, (denom, metrics)
    loss_sum, denom, metrics = losses.policy_loss(
        logp, micro["old_logprobs"], micro["advantages"], mask,
        ref_logp=micro["ref_logprobs"] if cfg.kl_coef > 0 else None,
        clip_low=cfg.clip_low, clip_high=cfg.clip_high,
        clip_ratio_c=cfg.clip_ratio_c if cfg.clip_ratio_c > 0 else None,
        kl_coef=cfg.kl_coef, kl_kind=cfg.kl_kind, mode=cfg.aggregation)
    return loss_sum, (denom, metrics)


def _combine(acc: dict, new: dict) -> dict:
    """Running combination of micro-batch metrics: max/min for extremes, sums for counts, else token-weighted."""
    out = {}
    for key, value in new.items():
        if key.endswith("/max"):
            out[key] = jnp.maximum(acc[key], value)
        elif key.endswith("/min"):
            out[key] = jnp.minimum(acc[key], value)
        elif key == "tokens":
            out[key] = acc[key] + value
        else:
            out[key] = acc[key] + value * new["tokens"]
    return out


def _metric_init(shapes: dict) -> dict:
    init = {"/max": -jnp.inf, "/min": jnp.inf}
    return {k: jnp.full(v.shape, next((x for s, x in init.items() if k.endswith(s)), 0.0), jnp.float32)
            for k, v in shapes.items()}


def accumulate_gradients(model, cfg: LossConfig, params: Any, batch: dict,
                         tail: int | None = None) -> tuple[Any, jax.Array, dict]:
    """(grad, loss, metrics) over a stacked [M, b, ...] batch: sum_k grad(S_k) / sum_k D_k, f32 gradients."""
    loss_fn = lambda p, m: micro_batch_loss(model, cfg, p, m, tail)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    first = jax.tree.map(lambda x: x[0], batch)
    metric_shapes = jax.eval_shape(lambda p, m: loss_fn(p, m)[1][1], params, first)

    def body(carry, micro):
        grads, total, denom, metrics = carry
        (loss_sum, (d, m)), g = grad_fn(params, micro)
        grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)
        return (grads, total + loss_sum, denom + d, _combine(metrics, m)), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), _metric_init(metric_shapes))
    (grads, total, denom, metrics), _ = jax.lax.scan(body, init, batch)
    inv = jnp.where(denom > 0, 1.0 / jnp.where(denom > 0, denom, 1.0), 0.0)
    grads = jax.tree.map(lambda g: g * inv, grads)
    tokens = jnp.maximum(metrics["tokens"], 1.0)
    metrics = {k: v if (k.endswith(("/max", "/min")) or k == "tokens") else v / tokens for k, v in metrics.items()}
    return grads, total * inv, metrics


def train_step(model, cfg: LossConfig, optimizer: optax.GradientTransformation, schedule: optax.Schedule,
               state: TrainState, batch: dict, tail: int | None = None) -> tuple[TrainState, dict]:
    """One optimizer step on a stacked [M, b, ...] mini-batch; returns (new state, scalar metrics)."""
    grads, loss, metrics = accumulate_gradients(model, cfg, state.params, batch, tail)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    skipped = state.skipped + jnp.where(finite, 0, 1).astype(jnp.int32)
    applied = state.step - state.skipped  # updates the schedule has counted so far
    new_state = state.replace(step=state.step + 1, params=keep(params, state.params),
                              opt_state=keep(opt_state, state.opt_state), skipped=skipped)
    metrics = dict(metrics, loss=loss, grad_norm=grad_norm, learning_rate=schedule(applied),
                   update_skipped=1.0 - finite.astype(jnp.float32), skipped_total=skipped.astype(jnp.float32))
    return new_state, jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), metrics)


def make_train_step(model, cfg: LossConfig, optim: OptimConfig, *, mesh: Mesh | None = None, rules=None,
                    shardings: TrainState | None = None) -> Callable[..., tuple[TrainState, dict]]:
    """`step(state, stacked_batch, tail=None)`: `train_step` jitted with the state donated (and laid out by
    `shardings`); `tail` is static (one compilation per value, see `batching.loss_columns`).

    The frozen reference params bypass the jitted step: the loss reads the reference's log-probs from the
    batch ("ref_logprobs"), so the step neither needs them nor may donate them (they are the caller's
    initial params, see `init_train_state`); the returned state carries them unchanged.
    """
    optimizer = make_optimizer(optim)
    schedule = warmup_constant_schedule(optim.learning_rate, optim.warmup_steps)
    fn = lambda state, batch, tail: train_step(model, cfg, optimizer, schedule, state, batch, tail)
    if mesh is None:
        jitted = jax.jit(fn, donate_argnums=0, static_argnums=2)
    else:
        scalar = NamedSharding(mesh, PartitionSpec())
        no_ref = shardings.replace(ref_params=None)
        fn = with_activation_sharding(fn, mesh, rules)
        jitted = jax.jit(fn, in_shardings=(no_ref, batch_rows_sharding(mesh, rules, stacked=True)),
                         out_shardings=(no_ref, scalar), donate_argnums=0, static_argnums=2)

    def step(state: TrainState, batch: dict, tail: int | None = None) -> tuple[TrainState, dict]:
        new_state, metrics = jitted(state.replace(ref_params=None), batch, tail)
        return new_state.replace(ref_params=state.ref_params), metrics
    return step

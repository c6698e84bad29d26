"""The jitted parts of generation: prefill, the on-device decode loop, append, and the state they carry.

`searchjax.generation` is the host side (sessions, buckets, capacity checks, results); this module is what
runs on the device. The model's own modules are reused: `decode_forward` applies its Embedding /
DecoderLayer / RMSNorm to its parameters with the cache as a loop carry.

Compilations. Parameters, the state, the budget, temperature, top-p and the stop table are traced
arguments; the static ones are the model (its config), `logits_fn`, the sampling mode (greedy / top-k
value / nucleus on-off), the EOS ids, the decode window and the mesh. Shapes are bucketed:
  batch B  -> d * 2^k (d = the mesh's batch shard count, 1 without a mesh),
  prompt P -> 2^k >= 8 (only if that leaves no free slot: a multiple of 16, else the exact length),
  append A -> 2^k >= 16 (`append_bucket`; only if that does not fit: a multiple of 16),
  decode window W -> 2^k >= 16 covering the slots used after the call, capped at S (`decode_window`),
  stop-automaton states -> 2^k >= 8, and for `generate` the cache S = P + 2^k >= P + max_new_tokens.
Bound: for a fixed (B, S), model and mesh, a session compiles prefill once per prompt bucket (<= log2(S) - 2
of them), append at most log2(S / 16) + 1 times (plus multiples of 16 only when the cache is nearly full),
and decode at most (log2(S / 16) + 2) times per (sampling mode, stop-state bucket) pair -- one per window.
A rollout with one sampling setting and one stop set thus compiles at most ~3 log2(S) programs in all
(S = 2048: <= 9 prefill + 8 append + 9 decode), and every later batch of the same (B, S) reuses them.

Decode step cost. Each step reads every weight once, plus the window's keys and values: the step runs
the model's layers with the cache as a loop carry written in place one slot per layer (`decode_forward`),
attends over the window W rather than all S slots, and samples without sorting the vocabulary
(`searchjax.sampling`), so its time grows with the text so far, not with max_cache_len.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import flax
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from searchjax import sampling, sharding
from searchjax.models import KVCache, init_cache, lm_head_weight, positions_from_mask, transformer

RUNNING, EOS, STOP, LENGTH = 0, 1, 2, 3

LogitsFn = Callable[[jax.Array, jax.Array], jax.Array]



@flax.struct.dataclass
class SamplerState:
    """Everything the jitted prefill / decode / append functions carry. B rows (incl. padding), S slots."""
    cache: Optional[KVCache]   # k, v [L, B, S, K, D]; None when decoding from a logits_fn without a model
    tokens: jax.Array          # [B, S] int32: row b's real tokens are tokens[b, :lengths[b]]
    lengths: jax.Array         # [B] int32: real tokens so far (= RoPE position of the next token)
    logprobs: jax.Array        # [B, S] float32: sampler log-prob of generated tokens (0 for prompt/appended)
    next_logits: jax.Array     # [B, V] float32: logits for each row's next token
    done: jax.Array            # [B] bool: stopped (or a padding row)
    stop_reason: jax.Array     # [B] int32: RUNNING / EOS / STOP / LENGTH
    stop_state: jax.Array      # [B] int32: stop-string automaton state
    turn_start: jax.Array      # [B] int32: lengths when the current decode call began
    step: jax.Array            # int32 scalar: decode steps taken in the current call
    row_keys: jax.Array        # [B] PRNG keys: fold_in(key(seed), row)


# -------------------------------------------------------------------------------------------- sharding

def constrain_state(state: SamplerState, mesh: Optional[Mesh], rules) -> SamplerState:
    """Pin every [B, ...] array of the state to the batch mesh axes (cache: batch is dimension 1)."""
    if mesh is None:
        return state
    batch_axes = sharding.batch_sharding(mesh, rules, ndim=1).spec[0]

    def pin(x, batch_dim):
        spec = [None] * x.ndim
        spec[batch_dim] = batch_axes
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(*spec)))

    replicated = NamedSharding(mesh, PartitionSpec())
    cache = state.cache
    if cache is not None:
        cache = KVCache(k=pin(cache.k, 1), v=pin(cache.v, 1), mask=pin(cache.mask, 0),
                        index=jax.lax.with_sharding_constraint(cache.index, replicated))
    fields = {f: pin(getattr(state, f), 0) for f in ("tokens", "lengths", "logprobs", "next_logits", "done",
                                                     "stop_reason", "stop_state", "turn_start", "row_keys")}
    return state.replace(cache=cache, step=jax.lax.with_sharding_constraint(state.step, replicated), **fields)


# ------------------------------------------------------------------------------------------ jitted parts

def next_logits(params, model, logits_fn, ids, positions, mask, cache, tokens, lengths):
    """Feed ids/positions/mask [B, T] (real tokens right-aligned in the block) -> (logits [B, V] f32 for the
    last column, updated cache). logits_fn, when given, replaces the model's logits."""
    logits = None
    if model is not None:
        hidden, cache = model.apply({"params": params}, ids, positions, mask, cache=cache, return_hidden=True)
        config = model.config
        head = lm_head_weight(params, config).astype(config.compute_dtype)
        logits = jnp.einsum("bh,hv->bv", hidden[:, -1].astype(config.compute_dtype), head,
                            preferred_element_type=jnp.float32)
    if logits_fn is not None:
        logits = logits_fn(tokens, lengths).astype(jnp.float32)
    return logits, cache


def decode_forward(params, model, token, position, running, cache: KVCache):
    """One token per row (token/position/running [B]) through the model -> (logits [B, V] f32, cache).

    The same layers as `model.apply` (the model's own Embedding / DecoderLayer / RMSNorm modules, applied to
    its parameters), but the layer loop carries the stacked [L, B, S, K, D] cache and writes only the new
    slot of each layer back into it (`dynamic_update_slice` on a loop carry, done in place by XLA). The
    model's `nn.scan` passes the cache as scanned inputs/outputs instead, which makes XLA build a fresh
    stacked cache and copy it every call: harmless once per prefill or append, but it is most of a decode
    step's time (several full-cache copies per token).
    """
    config = model.config
    index = cache.index
    x = transformer.Embedding(config).apply({"params": params["embed"]}, token[:, None])  # [B, 1, H]
    cos, sin = transformer.rope_cos_sin(position[:, None], config)
    slot_mask = jax.lax.dynamic_update_slice_in_dim(cache.mask, running[:, None], index, axis=1)
    attn_mask = transformer.attention_mask(running[:, None], slot_mask, index)
    layer = transformer.DecoderLayer(config)

    def body(carry, layer_params_and_index):
        x, k_all, v_all = carry
        layer_params, i = layer_params_and_index
        layer_cache = (jax.lax.dynamic_index_in_dim(k_all, i, 0, keepdims=False),
                       jax.lax.dynamic_index_in_dim(v_all, i, 0, keepdims=False))
        x, (k_layer, v_layer) = layer.apply({"params": layer_params}, x, layer_cache, cos, sin, attn_mask, index)
        start = (i, 0, index, 0, 0)
        k_all = jax.lax.dynamic_update_slice(k_all, jax.lax.dynamic_slice_in_dim(k_layer, index, 1, 1)[None], start)
        v_all = jax.lax.dynamic_update_slice(v_all, jax.lax.dynamic_slice_in_dim(v_layer, index, 1, 1)[None], start)
        return (x, k_all, v_all), None

    layer_ids = jnp.arange(config.num_layers, dtype=jnp.int32)
    (x, k_all, v_all), _ = jax.lax.scan(body, (x, cache.k, cache.v), (params["layers"], layer_ids),
                                        unroll=1 if config.scan_layers else config.num_layers)
    hidden = transformer.RMSNorm(config.rms_norm_eps, "embed", config.weight_dtype).apply(
        {"params": params["final_norm"]}, x)
    head = lm_head_weight(params, config).astype(config.compute_dtype)
    logits = jnp.einsum("bh,hv->bv", hidden[:, -1].astype(config.compute_dtype), head,
                        preferred_element_type=jnp.float32)
    return logits, KVCache(k=k_all, v=v_all, mask=slot_mask, index=index + 1)


def window_cache(cache: Optional[KVCache], window: int) -> Optional[KVCache]:
    """The first `window` slots of the cache (a copy, once per decode call)."""
    if cache is None or window >= cache.mask.shape[1]:
        return cache
    return KVCache(k=cache.k[:, :, :window], v=cache.v[:, :, :window], mask=cache.mask[:, :window],
                   index=cache.index)


def unwindow_cache(full: Optional[KVCache], part: Optional[KVCache]) -> Optional[KVCache]:
    """Write a windowed cache back over the first slots of the full one (in place: the full one is donated)."""
    if full is None or part.mask.shape[1] == full.mask.shape[1]:
        return part
    return KVCache(k=jax.lax.dynamic_update_slice_in_dim(full.k, part.k, 0, axis=2),
                   v=jax.lax.dynamic_update_slice_in_dim(full.v, part.v, 0, axis=2),
                   mask=jax.lax.dynamic_update_slice_in_dim(full.mask, part.mask, 0, axis=1), index=part.index)


@functools.partial(jax.jit, static_argnames=("model", "logits_fn", "cache_len", "mesh", "rules"))
def prefill(params, prompt_ids, prompt_mask, tokens, lengths, done, row_keys, *, model, logits_fn,
             cache_len, mesh, rules) -> SamplerState:
    """prompt_ids/prompt_mask [B, P] left-padded; tokens [B, S] the same prompts left-aligned."""
    batch = prompt_ids.shape[0]
    cache = init_cache(model.config, batch, cache_len) if model is not None else None
    logits, cache = next_logits(params, model, logits_fn, prompt_ids, positions_from_mask(prompt_mask),
                                 prompt_mask, cache, tokens, lengths)
    zeros = jnp.zeros((batch,), jnp.int32)
    state = SamplerState(cache=cache, tokens=tokens, lengths=lengths,
                         logprobs=jnp.zeros(tokens.shape, jnp.float32), next_logits=logits, done=done,
                         stop_reason=jnp.where(done, LENGTH, RUNNING).astype(jnp.int32), stop_state=zeros,
                         turn_start=lengths, step=jnp.zeros((), jnp.int32), row_keys=row_keys)
    return constrain_state(state, mesh, rules)


@functools.partial(jax.jit, static_argnames=("model", "logits_fn", "mode", "eos_token_ids", "window", "mesh",
                                             "rules"), donate_argnames=("state",))
def decode_loop(params, state: SamplerState, budget, temperature, top_p, stop_next_state, stop_match, *, model,
            logits_fn, mode, eos_token_ids, window, mesh, rules) -> SamplerState:
    """Sample until every row has stopped or `budget` steps ran. One step = sample a token for each running
    row from next_logits, advance its stop automaton, write it, and feed it to get the next logits. The loop
    runs on the cache's first `window` slots (`decode_window`; the host guarantees the call stays inside).
    Static: model, logits_fn, mode, window (recompile); dynamic: budget, temperature, top_p, the stop table."""
    batch, width = state.tokens.shape
    rows = jnp.arange(batch)
    eos = jnp.asarray(eos_token_ids if eos_token_ids else (-1,), jnp.int32)
    full_cache = state.cache
    state = state.replace(cache=window_cache(full_cache, window), step=jnp.zeros((), jnp.int32),
                          turn_start=state.lengths, stop_state=jnp.zeros_like(state.stop_state))

    def keep_going(st: SamplerState):
        return (st.step < budget) & ~jnp.all(st.done)

    def step(st: SamplerState) -> SamplerState:
        running = ~st.done
        keys = jax.vmap(jax.random.fold_in)(st.row_keys, st.lengths)
        token, logprob = sampling.sample(st.next_logits, keys, temperature, top_p, mode)
        automaton = stop_next_state[st.stop_state, token]
        reason = jnp.where(jnp.isin(token, eos), EOS,
                           jnp.where(automaton == stop_match, STOP,
                                     jnp.where(st.step + 1 >= budget, LENGTH, RUNNING)))
        slot = jnp.where(running, st.lengths, width)  # out of range -> dropped for stopped rows
        tokens = st.tokens.at[rows, slot].set(token, mode="drop")
        logprobs = st.logprobs.at[rows, slot].set(logprob, mode="drop")
        lengths = st.lengths + running.astype(jnp.int32)
        logits, cache = None, st.cache
        if model is not None:
            logits, cache = decode_forward(params, model, token, st.lengths, running, st.cache)
        if logits_fn is not None:
            logits = logits_fn(tokens, lengths).astype(jnp.float32)
        new = st.replace(cache=cache, tokens=tokens, lengths=lengths, logprobs=logprobs,
                         next_logits=jnp.where(running[:, None], logits, st.next_logits),
                         done=st.done | (running & (reason != RUNNING)),
                         stop_reason=jnp.where(running, reason, st.stop_reason).astype(jnp.int32),
                         stop_state=jnp.where(running, automaton, st.stop_state), step=st.step + 1)
        return constrain_state(new, mesh, rules)

    state = jax.lax.while_loop(keep_going, step, constrain_state(state, mesh, rules))
    return constrain_state(state.replace(cache=unwindow_cache(full_cache, state.cache)), mesh, rules)


@functools.partial(jax.jit, static_argnames=("model", "logits_fn", "mesh", "rules"), donate_argnames=("state",))
def append_block(params, state: SamplerState, block_ids, block_lengths, *, model, logits_fn, mesh,
            rules) -> SamplerState:
    """block_ids [B, A] with row b's block_lengths[b] new tokens right-aligned (left padding masked)."""
    batch, width = state.tokens.shape
    block = block_ids.shape[1]
    column = jnp.arange(block)[None, :]
    first = block - block_lengths[:, None]  # first real column of each row
    mask = column >= first
    positions = state.lengths[:, None] + jnp.maximum(column - first, 0)
    slot = jnp.where(mask, positions, width)
    rows = jnp.arange(batch)[:, None]
    tokens = state.tokens.at[rows, slot].set(block_ids, mode="drop")
    logprobs = state.logprobs.at[rows, slot].set(0.0, mode="drop")
    lengths = state.lengths + block_lengths
    logits, cache = next_logits(params, model, logits_fn, block_ids, positions, mask, state.cache, tokens, lengths)
    resumed = block_lengths > 0
    new = state.replace(cache=cache, tokens=tokens, logprobs=logprobs, lengths=lengths,
                        next_logits=jnp.where(resumed[:, None], logits, state.next_logits),
                        done=state.done & ~resumed, stop_reason=jnp.where(resumed, RUNNING, state.stop_reason))
    return constrain_state(new, mesh, rules)

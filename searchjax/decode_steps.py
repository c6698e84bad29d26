"""The jitted parts of generation: prefill, the on-device decode loop, append, and the state they carry.

`searchjax.generation` is the host side (sessions, buckets, capacity checks, results); this module is what
runs on the device. Prefill and append run the model's own forward (`Transformer.__call__` with the cache;
on one CPU device its attention through the block kernel, `native.block_attention_model`);
the decode step (`decode_forward`) is its own function over the same parameters and the same maths.

Compilations. Parameters, the state, the budget, temperature, top-p and the stop table are traced
arguments; the static ones are the model (its config), `logits_fn`, `logits_processor`, the sampling mode (greedy / top-k
value / nucleus on-off), the EOS ids, the decode window and the mesh. Shapes are bucketed:
  batch B  -> d * 2^k (d = the mesh's batch shard count, 1 without a mesh),
  prompt P -> 2^k >= 8 (only if that leaves no free slot: a multiple of 16, else the exact length),
  append A -> 2^k >= 16 (`append_bucket`; only if that does not fit: a multiple of 16),
  window W -> 2^k >= 16 up to 1,024 slots, then quarter octaves (1280, 1536, ..., 2560, 3072, ...), covering
    the slots used after the call (prefill, append) or the launch (decode: `generation.decode_segments`
    splits a long call into launches whose window grows with the text), capped at S (`decode_window`):
    what decode, prefill and append attend over (slots past it are empty),
  stop-automaton states -> 2^k >= 8, and for `generate` the cache S = P + 2^k >= P + max_new_tokens.
Bound: for a fixed (B, S), model and mesh, a session compiles prefill once per prompt bucket (<= log2(S) - 2
of them; its window is its bucket's), append once per (block bucket, window) pair it meets, and decode at
most once per (sampling mode, stop-state bucket, window): 7 windows up to 1,024 slots, 4 per octave above,
plus S itself. A rollout with one observation bucket, one sampling setting and one stop set thus compiles a
bounded set (S = 2048: <= 9 prefill + 11 append + 11 decode; S = 6144: 6 more windows), and every later
batch of the same (B, S) reuses them.

Decode step cost. Each step reads every weight once and the window's keys and values once, and writes one
slot per layer; it copies no weight and no layer's window (a test checks the optimized HLO of the loop
body). How (the CPU step, `searchjax.cpu_decode`): `decode_loop` makes per-layer weights (`layer_weights`)
and per-layer window buffers (`split_cache`, heads-major) once per launch, before its loop, and writes the
slots the launch wrote back afterwards (`merge_cache`, in place). The step (`decode_forward`) runs the layers
unrolled; each attends over its window read-only plus the new token, the two softmax parts merged exactly
(`searchjax.models.decode_attention`), and writes just the token's slot. (The former step sliced each layer's
cache and weights out of the stacked [L, ...] arrays in a layer scan and let attention write the token into
the layer's cache: on XLA:CPU those slices and the write are copies, ~60 % of a step with a 2,000-slot
window.) The window W rather than all S slots bounds the reads, and sampling does not sort the vocabulary
(`searchjax.sampling`), so a step's time grows with the text so far (`searchjax.bench.decode_window` measures
how much), not with max_cache_len. The per-call copies cost one more set of layer weights and one window of
memory while decoding (the window copy was made before too). On one CPU device the step's attention and, at
2-32 rows (1-32 in bf16), its products and LM head run as hand-written kernels (`searchjax.models.native`,
`packed_decode`): XLA:CPU's code for those shapes read the window and the weights at a third of the host's bandwidth.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import flax
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from searchjax import sampling, sharding
from searchjax.cpu_decode import (decode_forward, layer_weights, merge_cache, one_device, packed_decode,
                                  packed_lm_head, per_layer_decode, split_cache, window_layout)
from searchjax.models import KVCache, init_cache, lm_head_weight, native, positions_from_mask, transformer
from searchjax.models.kernels import matmul, update_slice_in_dim

RUNNING, EOS, STOP, LENGTH = 0, 1, 2, 3

LogitsFn = Callable[[jax.Array, jax.Array], jax.Array]
LogitsProcessor = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]  # (logits, tokens, lengths) -> logits



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
    """Pin every [B, ...] array of the state to the batch mesh axes."""
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
        # stacked [L, B, S, K, D] (batch is dimension 1), or split_cache's per-layer [B, K, W, D] (dimension 0)
        layer_batch_dim = 0 if isinstance(cache.k, tuple) else 1
        cache = KVCache(k=jax.tree.map(lambda x: pin(x, layer_batch_dim), cache.k),
                        v=jax.tree.map(lambda x: pin(x, layer_batch_dim), cache.v), mask=pin(cache.mask, 0),
                        index=jax.lax.with_sharding_constraint(cache.index, replicated))
    fields = {f: pin(getattr(state, f), 0) for f in ("tokens", "lengths", "logprobs", "next_logits", "done",
                                                     "stop_reason", "stop_state", "turn_start", "row_keys")}
    return state.replace(cache=cache, step=jax.lax.with_sharding_constraint(state.step, replicated), **fields)


# ------------------------------------------------------------------------------------------ jitted parts

def next_logits(params, model, logits_fn, ids, positions, mask, cache, tokens, lengths, logits_processor=None):
    """Feed ids/positions/mask [B, T] (real tokens right-aligned in the block) -> (logits [B, V] f32 for the
    last column, updated cache). logits_fn, when given, replaces the model's logits; logits_processor, when
    given, then maps them (`process_logits`)."""
    logits = None
    if model is not None:
        hidden, cache = model.apply({"params": params}, ids, positions, mask, cache=cache, return_hidden=True)
        config = model.config
        head = lm_head_weight(params, config).astype(config.compute_dtype)
        logits = matmul("bh,hv->bv", hidden[:, -1].astype(config.compute_dtype), head, jnp.float32)
    return process_logits(logits, logits_fn, logits_processor, tokens, lengths), cache


def process_logits(logits, logits_fn, logits_processor, tokens, lengths):
    """The next-token logits [B, V] f32 sampling uses: the model's `logits` (None without a model), replaced by
    logits_fn(tokens, lengths) when given, then mapped by logits_processor(logits, tokens, lengths) when given.
    Unlike `logits_fn` the processor sees the model's logits, so the LM head stays in the compiled step (a
    scripted policy that only biases them costs what the policy's own step costs)."""
    if logits_fn is not None:
        logits = logits_fn(tokens, lengths).astype(jnp.float32)
    if logits_processor is not None:
        logits = logits_processor(logits, tokens, lengths).astype(jnp.float32)
    return logits


def decode_forward_stacked(params, model, token, position, running, cache: KVCache):
    """`decode_forward` for accelerators (`per_layer_decode`): the model's own layers scanned over the stacked
    parameters, the stacked [L, B, W, K, D] cache a loop carry of which each layer writes only its new slot
    (in place), attention over the layer's window with the new token written first (`transformer.Attention`)."""
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
    logits = matmul("bh,hv->bv", hidden[:, -1].astype(config.compute_dtype), head, jnp.float32)
    return logits, KVCache(k=k_all, v=v_all, mask=slot_mask, index=index + 1)


def window_cache(cache: Optional[KVCache], window: int) -> Optional[KVCache]:
    """The first `window` slots of the stacked cache (a copy, once per decode launch; accelerators)."""
    if cache is None or window >= cache.mask.shape[1]:
        return cache
    return KVCache(k=cache.k[:, :, :window], v=cache.v[:, :, :window], mask=cache.mask[:, :window],
                   index=cache.index)


def unwindow_cache(full: Optional[KVCache], part: Optional[KVCache]) -> Optional[KVCache]:
    """Write a windowed stacked cache back over the first slots of the full one (in place: it is donated)."""
    if full is None or part.mask.shape[1] == full.mask.shape[1]:
        return part
    return KVCache(k=update_slice_in_dim(full.k, part.k, 0, axis=2), v=update_slice_in_dim(full.v, part.v, 0, axis=2),
                   mask=jax.lax.dynamic_update_slice_in_dim(full.mask, part.mask, 0, axis=1), index=part.index)


@functools.partial(jax.jit, static_argnames=("model", "logits_fn", "cache_len", "mesh", "rules", "logits_processor",
                                             "window"))
def prefill(params, prompt_ids, prompt_mask, tokens, lengths, done, row_keys, *, model, logits_fn,
             cache_len, mesh, rules, logits_processor=None, window=None) -> SamplerState:
    """prompt_ids/prompt_mask [B, P] left-padded; tokens [B, S] the same prompts left-aligned. The prompts
    attend over the cache's first `window` slots (>= P; None: all of them), as `append_block`'s blocks do."""
    batch = prompt_ids.shape[0]
    full = init_cache(model.config, batch, cache_len) if model is not None else None
    logits, cache = next_logits(params, native.block_attention_model(model, mesh), logits_fn, prompt_ids,
                                 positions_from_mask(prompt_mask), prompt_mask,
                                 window_cache(full, window or cache_len), tokens, lengths, logits_processor)
    cache = unwindow_cache(full, cache)
    zeros = jnp.zeros((batch,), jnp.int32)
    state = SamplerState(cache=cache, tokens=tokens, lengths=lengths,
                         logprobs=jnp.zeros(tokens.shape, jnp.float32), next_logits=logits, done=done,
                         stop_reason=jnp.where(done, LENGTH, RUNNING).astype(jnp.int32), stop_state=zeros,
                         turn_start=lengths, step=jnp.zeros((), jnp.int32), row_keys=row_keys)
    return constrain_state(state, mesh, rules)


@functools.partial(jax.jit, static_argnames=("model", "logits_fn", "mode", "eos_token_ids", "window", "mesh",
                                             "rules", "logits_processor"), donate_argnames=("state",))
def decode_loop(params, state: SamplerState, budget, segment, first, temperature, top_p, stop_next_state, stop_match,
                *, model, logits_fn, mode, eos_token_ids, window, mesh, rules, logits_processor=None) -> SamplerState:
    """One launch of a decode call: sample until every row has stopped or `segment` steps ran. One step =
    sample a token for each running row from next_logits, advance its stop automaton, write it, and feed it
    to get the next logits. `budget` is the steps the call has left (a row reaching it stops, "length"); a
    row still running after `segment` steps stays running for the call's next launch, and only the first
    launch (`first`) starts a new turn (turn_start, the stop automaton). `state.step` counts this launch's
    steps. The loop runs on the cache's first `window` slots (`generation.decode_segments`; the host
    guarantees the launch stays inside): on a CPU as per-layer copies with per-layer weights (`split_cache`,
    `layer_weights`, `decode_forward`), on TPU and GPU on the stacked cache and weights
    (`decode_forward_stacked`); `per_layer_decode` says why. Static: model, logits_fn, mode, window
    (recompile); dynamic: budget, segment, first, temperature, top_p, the stop table."""
    batch, width = state.tokens.shape
    rows = jnp.arange(batch)
    eos = jnp.asarray(eos_token_ids if eos_token_ids else (-1,), jnp.int32)
    full_cache = state.cache
    written_from = full_cache.index if full_cache is not None else None  # the launch's first slot
    per_layer = per_layer_decode(mesh)
    packed = model is not None and per_layer and packed_decode(model.config, batch, mesh)
    weights = layer_weights(params, model.config, pack=packed) if model is not None and per_layer else None
    packed_head = packed_lm_head(params, model.config) if packed else None
    if per_layer:
        layout = (window_layout(model.config, mesh, full_cache.k.dtype)
                  if model is not None and full_cache is not None else (None, None))
        cache = split_cache(full_cache, window, *layout)
    else:
        cache = window_cache(full_cache, window)
    state = state.replace(cache=cache, step=jnp.zeros((), jnp.int32),
                          turn_start=jnp.where(first, state.lengths, state.turn_start),
                          stop_state=jnp.where(first, 0, state.stop_state))

    def keep_going(st: SamplerState):
        return (st.step < segment) & ~jnp.all(st.done)

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
            if per_layer:
                logits, cache = decode_forward(params, weights, model, token, st.lengths, running, st.cache,
                                               native_attention=one_device(mesh), packed_head=packed_head)
            else:
                logits, cache = decode_forward_stacked(params, model, token, st.lengths, running, st.cache)
        logits = process_logits(logits, logits_fn, logits_processor, tokens, lengths)
        new = st.replace(cache=cache, tokens=tokens, lengths=lengths, logprobs=logprobs,
                         next_logits=jnp.where(running[:, None], logits, st.next_logits),
                         done=st.done | (running & (reason != RUNNING)),
                         stop_reason=jnp.where(running, reason, st.stop_reason).astype(jnp.int32),
                         stop_state=jnp.where(running, automaton, st.stop_state), step=st.step + 1)
        return constrain_state(new, mesh, rules)

    state = jax.lax.while_loop(keep_going, step, constrain_state(state, mesh, rules))
    merged = (merge_cache(full_cache, state.cache, written_from) if per_layer
              else unwindow_cache(full_cache, state.cache))
    return constrain_state(state.replace(cache=merged), mesh, rules)


@functools.partial(jax.jit, static_argnames=("model", "logits_fn", "mesh", "rules", "logits_processor", "window"),
                   donate_argnames=("state",))
def append_block(params, state: SamplerState, block_ids, block_lengths, *, model, logits_fn, mesh,
            rules, logits_processor=None, window=None) -> SamplerState:
    """block_ids [B, A] with row b's block_lengths[b] new tokens right-aligned (left padding masked).

    The block attends over the cache's first `window` slots (`decode_window` of the slots used after it; None:
    all S), sliced out and written back once: slots past them are empty, so the result is the same, but the
    block's [B, N, A, S] attention logits over the whole cache made an append's cost grow with the cache, not
    the text (a 512-token observation for 4 rows of SmolLM2 in f32: 4.6 s into 768 slots, 17.1 s into 6,144)."""
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
    logits, cache = next_logits(params, native.block_attention_model(model, mesh), logits_fn, block_ids, positions,
                                mask, window_cache(state.cache, window or width), tokens, lengths, logits_processor)
    cache = unwindow_cache(state.cache, cache)
    resumed = block_lengths > 0
    new = state.replace(cache=cache, tokens=tokens, logprobs=logprobs, lengths=lengths,
                        next_logits=jnp.where(resumed[:, None], logits, state.next_logits),
                        done=state.done & ~resumed, stop_reason=jnp.where(resumed, RUNNING, state.stop_reason))
    return constrain_state(new, mesh, rules)

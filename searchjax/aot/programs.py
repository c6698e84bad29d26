"""Every jitted program of an RL run at the config's real shapes, with abstract inputs on a mesh.

The programs are the run's own jitted functions, not copies: the update of `trainer.make_train_step`, the
log-prob pass of `trainer.make_logprob_fn` (old policy on the float32 masters, reference on the
param-dtype initial weights), `decode_steps.prefill` / `decode_loop` / `append_block` (the rollout), the
anchor's teacher-forced scorer of `scoring` (Dr.Free's information gain), and the embedders of
`searchjax.models.encoder` / `decoder_embedder`. Inputs are `jax.ShapeDtypeStruct`s carrying the shardings
the run gives them; no weight is loaded. Shapes are the largest the config admits (so that a program that
fits here fits in the run):

* update: [M, b, T] with b = batch.micro_batch_size, M = mini_batch_size / b, T = the largest prompt bucket
  + the largest response bucket, LM head on the response bucket (`batching.loss_columns`);
* log-probs: [b, T], the same tail; rollout: B = the rows of one generation session (prompts_per_step x
  group_size, or whole groups of at most rollout.session_rows) padded as `generation.start` pads them (the
  batch shard count times a power of two), prompt width `generation.prompt_bucket` of the largest prompt
  bucket or the largest power of two the cache leaves room for (`agent.rollout.required_cache_len`), cache
  `rollout.max_cache_len`, decode window = the whole cache (the last turn's worst case), append width
  `generation.append_bucket(max_obs_tokens)`;
* information gain: `scoring.answer_logliks`' packing at `information_gain.max_length` (the rows
  `max_tokens_per_call` allows, padded to the batch shards) and a 16-token answer bucket.

Calls per RL step (upper bounds): update rows / mini_batch_size x epochs; each log-prob pass rows / b; prefill
once per session; decode (max_turns + 1) x max_new_tokens_per_turn steps per session (every row running every
turn to its budget); append max_turns per session; information gain ceil(prompts x 7 contexts / rows per call)
(a 3-hop chain has 7: full, closed book, source, retrieval, 3 hops).
"""

from __future__ import annotations

import math
import types

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from searchjax import roofline
from searchjax.aot.compiler import Program

ANSWER_BUCKET = 16  # answer tokens scored per information-gain row (scoring.MIN_ANSWER_BUCKET = 8, doubled)
IG_CONTEXTS = 7  # contexts of a 3-hop proposal: full, closed book, source, retrieval, hop 1..3
QUERY_TOKENS = 32  # a search query's tokens in the retrieval encoder (E5: "query: " + the query)
EMBED_TOKENS = 64  # a question's tokens in the CCS decoder embedder (instruction prefix + question)
RETRIEVAL_ENCODER = "e5-base-v2"  # Search-R1's retriever (configs/search_r1.py: E5 + faiss Flat over wiki-18)


def _sds(shape, dtype, sharding) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def _abstract(tree, shardings):
    return jax.tree.map(lambda a, s: _sds(a.shape, a.dtype, s), tree, shardings)


def _layout(mesh) -> roofline.Layout:
    from searchjax.sharding import batch_shard_count
    return roofline.Layout(chips=mesh.size, fsdp=mesh.shape["fsdp"], tensor=mesh.shape["tensor"],
                           batch=batch_shard_count(mesh))


def _rows_sharding(mesh, ndim: int) -> NamedSharding:
    from searchjax.sharding import batch_sharding
    return batch_sharding(mesh, ndim=ndim)


def _params(cfg, mesh, dtype: str):
    from searchjax.models import abstract_params, param_shardings
    shapes = abstract_params(cfg.replace(param_dtype=dtype))
    return _abstract(shapes, param_shardings(cfg, mesh, shapes=shapes))


def train_shapes(config) -> dict:
    """Rows, micro-batches and lengths of the update and log-prob passes (see the module docstring)."""
    u = config.batch
    rows = config.prompts_per_step * config.rollout.group_size
    tail = max(u.response_buckets)
    return {"rows": rows, "micro": u.micro_batch_size, "M": u.mini_batch_size // u.micro_batch_size,
            "updates": rows // u.mini_batch_size * u.epochs, "T": max(u.prompt_buckets) + tail, "tail": tail}


def update_programs(config, model, mesh) -> list[Program]:
    """The trainer's update and its log-prob passes (old policy; reference when the KL term is on)."""
    from searchjax.models import param_shardings
    from searchjax.rl import trainer
    cfg = model.config
    s = train_shapes(config)
    lcfg = trainer.LossConfig(temperature=config.rollout.temperature if config.rollout.temperature > 0 else 1.0,
                              **config.loss)
    ocfg = trainer.OptimConfig(**config.optim)
    master = config.model.master_dtype or None
    optimizer = trainer.make_optimizer(ocfg)
    policy = _params(cfg, mesh, cfg.param_dtype)
    pshard = param_shardings(cfg, mesh, shapes=policy)
    shardings = trainer.state_shardings(optimizer, policy, pshard, mesh, master_dtype=master, keep_reference=False)
    state = _abstract(jax.eval_shape(lambda p: trainer.init_train_state(p, optimizer, master_dtype=master), policy),
                      shardings)
    step = trainer.make_train_step(model, lcfg, ocfg, mesh=mesh, shardings=shardings)
    stacked = trainer.batch_rows_sharding(mesh, stacked=True)
    M, b, T, tail = s["M"], s["micro"], s["T"], s["tail"]
    batch = {"input_ids": _sds((M, b, T), jnp.int32, stacked), "attention_mask": _sds((M, b, T), jnp.bool_, stacked),
             "loss_mask": _sds((M, b, T - 1), jnp.float32, stacked), "advantages": _sds((M, b), jnp.float32, stacked),
             "old_logprobs": _sds((M, b, T - 1), jnp.float32, stacked)}
    if lcfg.kl_coef > 0:
        batch["ref_logprobs"] = _sds((M, b, T - 1), jnp.float32, stacked)
    layout = _layout(mesh)
    master_name = master or cfg.param_dtype
    programs = [Program(
        "update", _jitted_of(step), (state, batch, tail), {},
        roofline.update_cost(cfg, layout, micro_batches=M, micro_rows=b, tokens=T, tail=tail,
                             remat=cfg.remat_policy != "none", master_dtype=master_name),
        s["updates"], mesh.size, shapes=f"[M={M}, b={b}, T={T}], head on {tail} columns, {master_name} masters, "
                                        f"remat {cfg.remat_policy}",
        trips=f"micro-batches {M}, layers {cfg.num_layers}, vocab chunks "
              f"{roofline.head_chunks(b, tail, cfg.vocab_size)}")]
    logprob_fn = trainer.make_logprob_fn(model, lcfg.temperature, mesh=mesh, param_shardings=pshard)
    rows = trainer.batch_rows_sharding(mesh, stacked=False)
    ids, mask = _sds((b, T), jnp.int32, rows), _sds((b, T), jnp.bool_, rows)
    passes = [("old_logprob", state.params, master_name)]
    if lcfg.kl_coef > 0:
        passes.append(("ref_logprob", policy, cfg.param_dtype))
    for name, params, dtype in passes:
        cost = roofline.forward_cost(cfg, layout, rows=b, tokens=T, pairs_per_row=roofline.causal_pairs(T),
                                     head_columns=tail, weight_dtype=dtype)
        programs.append(Program(name, logprob_fn, (params, ids, mask, tail), {}, cost, s["rows"] / b, mesh.size,
                                shapes=f"[b={b}, T={T}], {dtype} params, head on {tail} columns",
                                trips=f"layers {cfg.num_layers}, vocab chunks "
                                      f"{roofline.head_chunks(b, tail, cfg.vocab_size)}"))
    return programs


def _jitted_of(step):
    """What to lower for `trainer.make_train_step`'s step: the step itself when it has `lower`, else the jax.jit
    object its wrapper closes over (the wrapper only takes ref_params out of the state, as done here)."""
    if hasattr(step, "lower"):
        return step
    for cell in step.__closure__ or ():
        jitted = cell.cell_contents
        if hasattr(jitted, "lower"):
            return types.SimpleNamespace(
                lower=lambda state, batch, tail: jitted.lower(state.replace(ref_params=None), batch, tail))
    raise TypeError("trainer.make_train_step returned a function with no jitted step to lower")


def rollout_shapes(config, mesh) -> dict:
    """Rows B, prompt width P, cache S and append width A of the rollout (see the module docstring)."""
    from searchjax import generation
    from searchjax.sharding import batch_shard_count
    from searchjax.agent import rollout
    r = config.rollout
    rows = config.prompts_per_step * r.group_size
    # One generation session holds whole groups of at most rollout.session_rows rows, as the rollout splits them.
    prompts = rollout.sessions(config.prompts_per_step, rollout.RolloutConfig(**r.to_dict()))
    session = min(config.prompts_per_step, prompts) * r.group_size
    shards = batch_shard_count(mesh)
    B = shards * (1 << max(0, -(-session // shards) - 1).bit_length())  # generation.start's batch padding
    S = int(r.max_cache_len)
    turns = r.max_turns if r.search else 0
    A = generation.append_bucket(r.max_obs_tokens)
    # agent.rollout.required_cache_len: the padded prompt + every turn's budget + every append block.
    room = S - (turns + 1) * r.max_new_tokens_per_turn - turns * A
    if room < 8:
        raise ValueError(f"config.rollout.max_cache_len={S} leaves no room for a prompt: {turns + 1} turns of "
                         f"{r.max_new_tokens_per_turn} tokens and {turns} appends of {A} slots take {S - room}")
    P = min(generation.prompt_bucket([[0] * max(config.batch.prompt_buckets)]), 1 << (room.bit_length() - 1))
    return {"rows": rows, "session_rows": session, "sessions": -(-rows // session), "B": B, "P": P, "S": S, "A": A,
            "turns": turns, "steps": r.max_new_tokens_per_turn, "prompt_room": room}


def rollout_programs(config, model, mesh) -> list[Program]:
    """Prefill, the decode loop (window = the whole cache) and, with search, the observation append."""
    from searchjax import decode_steps, sampling, stop_strings
    from searchjax.agent import protocol
    from searchjax.rewards.qa import ANSWER_CLOSE
    cfg, r = model.config, config.rollout
    s = rollout_shapes(config, mesh)
    B, P, S, A = s["B"], s["P"], s["S"], s["A"]
    params = _params(cfg, mesh, cfg.param_dtype)
    rows1, rows2 = _rows_sharding(mesh, 1), _rows_sharding(mesh, 2)
    key_dtype = jax.random.key(0).dtype
    static = {"model": model, "logits_fn": None, "mesh": mesh, "rules": None}
    prefill_args = (params, _sds((B, P), jnp.int32, rows2), _sds((B, P), jnp.bool_, rows2),
                    _sds((B, S), jnp.int32, rows2), _sds((B,), jnp.int32, rows1), _sds((B,), jnp.bool_, rows1),
                    _sds((B,), key_dtype, rows1))
    layout = _layout(mesh)
    per_chip = B / layout.batch
    kv_full = roofline.kv_bytes(cfg, per_chip, S, cfg.dtype)
    # The model's nn.scan writes a fresh stacked cache: the whole cache is read and written per call.
    prefill = Program("prefill", decode_steps.prefill, prefill_args, dict(static, cache_len=S),
                      roofline.forward_cost(cfg, layout, rows=B, tokens=P, pairs_per_row=P * S, head_columns=1,
                                            weight_dtype=cfg.param_dtype, kv_read_bytes=kv_full,
                                            kv_write_bytes=kv_full),
                      s["sessions"], mesh.size,
                      shapes=f"[B={B} ({s['session_rows']} rows, {s['sessions']} session(s)), P={P}] into a "
                             f"{S}-slot cache",
                      trips=f"layers {cfg.num_layers}")
    out = prefill.jitted.lower(*prefill.args, **prefill.static).out_info
    replicated = NamedSharding(mesh, PartitionSpec())
    batch_axes = _rows_sharding(mesh, 1).spec[0]

    def as_pinned(o):
        """The state as `decode_steps.constrain_state` leaves it: scalars replicated, the [L, B, S, K, D] keys and
        values split on B (dimension 1), every other [B, ...] array on dimension 0."""
        if not o.shape:
            return _sds(o.shape, o.dtype, replicated)
        spec = [None] * len(o.shape)
        spec[1 if len(o.shape) == 5 else 0] = batch_axes
        return _sds(o.shape, o.dtype, NamedSharding(mesh, PartitionSpec(*spec)))
    state = jax.tree.map(as_pinned, out)
    stops = protocol.STOP_STRINGS if r.search else (ANSWER_CLOSE,)
    table = stop_strings.token_automaton([], stops, cfg.vocab_size)  # the shape only: no tokenizer needed
    scalar = lambda dtype: _sds((), dtype, replicated)  # noqa: E731
    decode_args = (params, state, scalar(jnp.int32), scalar(jnp.int32), scalar(jnp.bool_), scalar(jnp.float32),
                   scalar(jnp.float32), _sds(table.next_state.shape, jnp.int32, replicated), scalar(jnp.int32))
    decode = Program("decode", decode_steps.decode_loop, decode_args,
                     dict(static, mode=sampling.sampling_mode(r.temperature, r.top_p, r.top_k),
                          eos_token_ids=tuple(cfg.eos_token_ids), window=S),
                     roofline.decode_step_cost(cfg, layout, rows=B, window=S),
                     s["sessions"] * (s["turns"] + 1) * s["steps"],
                     mesh.size, shapes=f"one step of [B={B}] over a {S}-slot window, stop table "
                                       f"{table.next_state.shape}", trips=f"decode steps, layers {cfg.num_layers}")
    programs = [prefill, decode]
    if s["turns"]:
        programs.append(Program(
            "append", decode_steps.append_block,
            (params, state, _sds((B, A), jnp.int32, rows2), _sds((B,), jnp.int32, rows1)),
            static, roofline.forward_cost(cfg, layout, rows=B, tokens=A, pairs_per_row=A * S, head_columns=1,
                                          weight_dtype=cfg.param_dtype, kv_read_bytes=kv_full,
                                          kv_write_bytes=kv_full),
            s["sessions"] * s["turns"], mesh.size, shapes=f"[B={B}, A={A}] into the {S}-slot cache",
            trips=f"layers {cfg.num_layers}"))
    return programs


def decode_turn_segments(config, mesh) -> list[list[tuple[int, int]]]:
    """Per turn, `generation.decode_segments` (window, steps) when every row uses its whole budget (for the
    projection)."""
    from searchjax import generation
    s = rollout_shapes(config, mesh)
    used, turns = s["P"], []
    for turn in range(s["turns"] + 1):
        turns.append(generation.decode_segments(used, s["steps"], s["S"]))
        used += s["steps"] + (s["A"] if turn < s["turns"] else 0)
    return turns


def information_gain_program(config, model, mesh, anchor_cfg) -> Program:
    """The anchor's teacher-forced answer scorer as `scoring.answer_logliks` packs it at max_length."""
    from searchjax import scoring
    from searchjax.sharding import batch_shard_count
    ig = config.information_gain
    length = scoring.pow2_bucket(ig.max_length, scoring.MIN_LENGTH_BUCKET)
    room = 1 << max(0, (ig.max_tokens_per_call // length).bit_length() - 1)
    shards = batch_shard_count(mesh)
    batch = -(-scoring.pow2_bucket(room) // shards) * shards
    tail = min(ANSWER_BUCKET, length - 1)
    params = _params(anchor_cfg, mesh, anchor_cfg.param_dtype)
    rows2 = _rows_sharding(mesh, 2)
    replicated = NamedSharding(mesh, PartitionSpec())
    from searchjax.models import Transformer
    anchor = model if anchor_cfg == model.config else Transformer(anchor_cfg)
    args = (anchor, params, _sds((batch, length), jnp.int32, rows2), _sds((batch, length), jnp.bool_, rows2),
            _sds((), jnp.float32, replicated))
    cost = roofline.forward_cost(anchor_cfg, _layout(mesh), rows=batch, tokens=length,
                                 pairs_per_row=roofline.causal_pairs(length), head_columns=tail,
                                 weight_dtype=anchor_cfg.param_dtype)
    proposals = config.prompts_per_step * config.rollout.group_size
    return Program("info_gain", scoring._jitted_tail_logprobs(mesh), args, {"tail": tail, "vocab_chunk": None}, cost,
                   math.ceil(proposals * IG_CONTEXTS / room), mesh.size,
                   shapes=f"[{batch} rows ({room} real), {length}] x {tail}-token answers",
                   trips=f"layers {anchor_cfg.num_layers}")


def retrieval_encoder_program(mesh, queries_per_step: int, encoder_config=None) -> Program:
    """The retrieval server's query encoder (default: the RETRIEVAL_ENCODER preset of `encoder.ENCODER_PRESETS`)
    on one chip: its own process, outside the RL step."""
    from searchjax.models import encoder
    from searchjax.models.embedding import plan_batches
    ecfg = encoder_config or encoder.ENCODER_PRESETS[RETRIEVAL_ENCODER]
    plans = plan_batches([QUERY_TOKENS] * 64, 64, ecfg.max_length, steps_per_octave=encoder.STEPS_PER_OCTAVE,
                         max_batch_tokens=1024)
    _, length, rows = plans[0]
    device = SingleDeviceSharding(mesh.devices.flat[0])
    ids = jnp.zeros((1, 1), jnp.int32)
    shapes = jax.eval_shape(lambda: encoder.BertEncoder(ecfg).init(jax.random.key(0), ids, ids.astype(bool)))
    params = jax.tree.map(lambda a: _sds(a.shape, a.dtype, device), shapes["params"])
    args = (params, _sds((rows, length), jnp.int32, device), _sds((rows, length), jnp.bool_, device))
    return Program("retrieval_enc", encoder._bert_embed_fn(ecfg), args, {},
                   roofline.encoder_cost(ecfg, rows=rows, tokens=length), math.ceil(queries_per_step / rows), 1,
                   in_step=False, shapes=f"{ecfg.name} [{rows}, {length}] on one chip (retrieval server)")


def decoder_embedder_program(embedder_cfg, mesh, texts_per_step: int, batch_size: int) -> Program:
    """CCS's decoder embedder (`encoder.DecoderEmbedder`), loaded without a mesh: on one chip."""
    from searchjax.models import Transformer, abstract_params
    from searchjax.models.decoder_embedder import DecoderEmbedder
    from searchjax.models.embedding import plan_batches
    plans = plan_batches([EMBED_TOKENS] * batch_size, batch_size, 512, max_batch_tokens=4096)
    _, length, rows = plans[0]
    embedder = DecoderEmbedder("embedder", Transformer(embedder_cfg), None, None, append_token=None)
    device = SingleDeviceSharding(mesh.devices.flat[0])
    params = jax.tree.map(lambda a: _sds(a.shape, a.dtype, device), abstract_params(embedder_cfg))
    args = (params, _sds((rows, length), jnp.int32, device), _sds((rows, length), jnp.bool_, device))
    one_chip = roofline.Layout(chips=1, fsdp=1, tensor=1, batch=1)
    cost = roofline.forward_cost(embedder_cfg, one_chip, rows=rows, tokens=length,
                                 pairs_per_row=roofline.causal_pairs(length), head_columns=0,
                                 weight_dtype=embedder_cfg.param_dtype)
    return Program("embedder", embedder._embed, args, {}, cost, math.ceil(texts_per_step / rows), 1,
                   shapes=f"[{rows}, {length}] on one chip", trips=f"layers {embedder_cfg.num_layers}")

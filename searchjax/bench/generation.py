"""Generation benchmark: decode tokens/s on SmolLM2-135M vs transformers generate, and multi-turn rollouts.

    python -m launch.benchmark --only=generation

Rows:
  * decode b=1/8/32: greedy decode tokens/s of `searchjax.generation.decode` (prefill excluded; no early stop:
    EOS disabled, so every row generates `new_tokens`) next to transformers `generate(do_sample=False)` (torch
    eager, KV cache, same CPU, in a fresh process with torch's default malloc settings, see
    `common.torch_environ`; decode time = t(n tokens) - t(1 token), i.e. prefill excluded too).
    `bound_tok_s` is the memory-bandwidth ceiling: each decode step reads every weight once, so
    steps/s <= bandwidth / weight_bytes (bandwidth from `common.memory_bandwidth()`; ~540 MB of float32
    weights); `bound_fraction` = achieved steps/s over that ceiling (KV-cache reads make it slightly
    pessimistic). `matmul_only_bound_fraction`: the same fraction for a step that does only the step's
    matrix products (XLA's GEMMs over the same weights at the same batch; nothing else), i.e. what XLA
    itself reaches on this CPU; `vs_matmul_only` = our step's speed over that one's.
    Goals: >= 2x transformers at batch 8, >= 50 % of the bound.
  * decode b=8 max_cache_len=2048: the same with a rollout-sized, mostly empty cache (ours only).
  * rollout: a 3-turn search-agent shape (decode, append an <information>-sized block, decode, ...) with the
    session's kept cache vs re-prefilling the whole history every turn.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import jax
import numpy as np

from searchjax.bench import common

PROMPT_LEN = 32
ROLLOUT_CACHE_LEN = 2048  # a Search-R1-style rollout's max_cache_len


def _median_time(fn, iters: int) -> tuple[float, float]:
    """(first call seconds, median of `iters` further calls); fn() must block until done."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def _prompts(batch: int, vocab: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return rng.integers(100, vocab, size=(batch, PROMPT_LEN)).tolist()


def _ours_decode_seconds(model, params, prompts, new_tokens: int, iters: int,
                         cache_len: int = 0) -> tuple[float, float]:
    """(compile+first seconds, median decode seconds) for `new_tokens` greedy tokens, prefill excluded.
    cache_len: the session's max_cache_len (default: just enough)."""
    from searchjax import generation
    cache_len = max(cache_len, PROMPT_LEN + new_tokens)

    def once():
        session = generation.start(model, params, prompts, max_cache_len=cache_len, eos_token_ids=())
        jax.block_until_ready(session.state)
        start = time.perf_counter()
        _, results = generation.decode(session, new_tokens)
        elapsed = time.perf_counter() - start
        assert all(len(r.token_ids) == new_tokens for r in results)
        return elapsed

    first = once()
    return first, statistics.median(once() for _ in range(iters))


def _transformers_side(batches, new_tokens: int, iters: int, queue) -> None:
    """In a fresh process (`common.in_fresh_process`, torch's own malloc settings): SmolLM2 with the same
    weights in transformers, {batch: `_transformers_decode_seconds`} on the same prompts as ours."""
    import torch
    import transformers
    from searchjax.data import assets
    from searchjax.models import load_pretrained, save_pretrained
    with tempfile.TemporaryDirectory(prefix="bench-generation-") as directory:
        model, params = load_pretrained(assets.smollm2_gguf(), dtype="float32")
        save_pretrained(model, params, directory)
        vocab = model.config.vocab_size
        del params
        hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    queue.put({batch: _transformers_decode_seconds(hf, _prompts(batch, vocab), new_tokens, iters)
               for batch in batches})


def _transformers_decode_seconds(hf, prompts, new_tokens: int, iters: int) -> float:
    """Median seconds of generate(new_tokens) minus generate(1 token), per the same prompts."""
    import torch
    ids = torch.tensor(prompts)
    mask = torch.ones_like(ids)

    def run(n):
        with torch.no_grad():
            out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              temperature=None, top_p=None, top_k=None, pad_token_id=0)
        assert out.shape[1] == ids.shape[1] + n

    run(1)  # warm-up (allocator, first-call paths); torch eager has nothing to compile
    differences = []
    for _ in range(iters):
        start = time.perf_counter()
        run(new_tokens)
        full = time.perf_counter() - start
        start = time.perf_counter()
        run(1)
        differences.append(full - (time.perf_counter() - start))
    return max(statistics.median(differences), 1e-9)


def _rollout_seconds(model, params, batch: int, turns: int, decode_tokens: int, block: int, iters: int):
    """(continuation seconds, re-prefill seconds) for `turns` decode calls with a `block`-token append between."""
    from searchjax import generation
    prompts = _prompts(batch, model.config.vocab_size, seed=1)
    rng = np.random.default_rng(2)
    blocks = [rng.integers(100, model.config.vocab_size, size=(batch, block)).tolist() for _ in range(turns - 1)]
    cache_len = 2 * (PROMPT_LEN + turns * decode_tokens + (turns - 1) * block)  # room for re-prefill buckets

    def continuation():
        session = generation.start(model, params, prompts, max_cache_len=cache_len, eos_token_ids=())
        for turn in range(turns):
            session, _ = generation.decode(session, decode_tokens)
            if turn < turns - 1:
                session = generation.append(session, blocks[turn])

    def reprefill():
        history = [list(p) for p in prompts]
        for turn in range(turns):
            session = generation.start(model, params, history, max_cache_len=cache_len, eos_token_ids=())
            _, results = generation.decode(session, decode_tokens)
            if turn < turns - 1:
                history = [h + r.token_ids + b for h, r, b in zip(history, results, blocks[turn])]

    _, cont = _median_time(continuation, iters)
    _, re = _median_time(reprefill, iters)
    return cont, re


def _matmul_only_step_seconds(model, params, batch: int, iters: int) -> float:
    """Median seconds of a decode step's matrix products alone, at `batch` rows: every layer's q/k/v/o and
    MLP kernels and the LM head applied to a [batch, ...] activation in the same layer scan, nothing else
    (no attention over the cache, norms, RoPE or sampling). XLA's own ceiling for a decode step on this CPU."""
    import jax.numpy as jnp
    from searchjax.models import lm_head_weight
    config = model.config

    def layer(x, p):
        attn, mlp = p["attn"], p["mlp"]
        q = jnp.einsum("bh,hnd->bnd", x, attn["q_proj"]["kernel"])
        kv = (jnp.einsum("bh,hnd->bnd", x, attn["k_proj"]["kernel"]).sum()
              + jnp.einsum("bh,hnd->bnd", x, attn["v_proj"]["kernel"]).sum())
        x = jnp.einsum("bnd,ndh->bh", q, attn["o_proj"]["kernel"]) + kv
        gated = jnp.einsum("bh,hf->bf", x, mlp["gate_proj"]["kernel"]) * jnp.einsum("bh,hf->bf", x,
                                                                                   mlp["up_proj"]["kernel"])
        return jnp.einsum("bf,fh->bh", gated, mlp["down_proj"]["kernel"]) * 1e-3, None

    @jax.jit
    def step(params, x):
        x, _ = jax.lax.scan(layer, x, params["layers"])
        return jnp.einsum("bh,hv->bv", x, lm_head_weight(params, config))

    x = jnp.full((batch, config.hidden_size), 1e-2, jnp.float32)
    _, median = _median_time(lambda: jax.block_until_ready(step(params, x)), max(iters, 10))
    return median


def run(args: common.BenchArgs) -> list[dict]:
    from searchjax.data import assets
    from searchjax.models import load_pretrained
    model, params = load_pretrained(assets.smollm2_gguf(), dtype="float32")
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    bandwidth = common.memory_bandwidth()
    # --quick is a smoke run of this file (a minute or two on a busy machine), not a measurement.
    new_tokens = 8 if args.quick else 64
    batches = (1, 8) if args.quick else (1, 8, 32)
    iters = 1 if args.quick else max(1, min(args.iters, 3))
    reference_iters = 1 if args.quick else max(1, min(args.iters, 2))  # transformers at b=32: minutes per call
    references = common.in_fresh_process(_transformers_side, batches, new_tokens, reference_iters,
                                          environ=common.torch_environ())
    rows = []
    for batch in batches:
        prompts = _prompts(batch, model.config.vocab_size)
        first, ours = _ours_decode_seconds(model, params, prompts, new_tokens, iters)
        reference = references[batch]
        ours_tok_s = batch * new_tokens / ours
        ref_tok_s = batch * (new_tokens - 1) / reference
        bound_steps = bandwidth / weight_bytes
        matmul_step = _matmul_only_step_seconds(model, params, batch, iters)
        rows.append({"case": f"decode b={batch}", "batch": batch, "new_tokens": new_tokens,
                     "ours_tok_s": ours_tok_s, "transformers_tok_s": ref_tok_s, "speedup": ours_tok_s / ref_tok_s,
                     "bound_tok_s": batch * bound_steps, "bound_fraction": (ours_tok_s / batch) / bound_steps,
                     "matmul_only_bound_fraction": (1 / matmul_step) / bound_steps,
                     "vs_matmul_only": matmul_step * ours_tok_s / batch,
                     "compile_s": max(first - ours, 0.0), "weight_mb": weight_bytes / 1e6,
                     "bandwidth_gb_s": bandwidth / 1e9})
    # A rollout-sized cache (most of it still empty): the step attends over the filled window only, so this
    # should match the row above rather than scale with max_cache_len.
    prompts = _prompts(8, model.config.vocab_size)
    first, ours = _ours_decode_seconds(model, params, prompts, new_tokens, iters, cache_len=ROLLOUT_CACHE_LEN)
    rows.append({"case": f"decode b=8 max_cache_len={ROLLOUT_CACHE_LEN}", "batch": 8, "new_tokens": new_tokens,
                 "ours_tok_s": 8 * new_tokens / ours, "bound_tok_s": 8 * bandwidth / weight_bytes,
                 "bound_fraction": (new_tokens / ours) / (bandwidth / weight_bytes),
                 "compile_s": max(first - ours, 0.0)})
    turns, decode_tokens, block = 3, (8 if args.quick else 32), (16 if args.quick else 96)
    cont, re = _rollout_seconds(model, params, 8, turns, decode_tokens, block, iters)
    rows.append({"case": f"rollout b=8 {turns} turns", "batch": 8, "new_tokens": turns * decode_tokens,
                 "continuation_s": cont, "reprefill_s": re, "speedup": re / cont})
    return rows

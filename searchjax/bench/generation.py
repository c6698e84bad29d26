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


def _ours_decode_seconds(model, params, prompts, new_tokens: int, cache_len: int = 0) -> float:
    """Seconds of `new_tokens` greedy tokens, prefill excluded. cache_len: the session's max_cache_len
    (default: just enough)."""
    from searchjax import generation
    cache_len = max(cache_len, PROMPT_LEN + new_tokens)
    session = generation.start(model, params, prompts, max_cache_len=cache_len, eos_token_ids=())
    jax.block_until_ready(session.state)
    start = time.perf_counter()
    _, results = generation.decode(session, new_tokens)
    elapsed = time.perf_counter() - start
    assert all(len(r.token_ids) == new_tokens for r in results)
    return elapsed


def _ours_side(dtype: str, batch: int, new_tokens: int):
    """`common.alternate` side: our greedy decode of `new_tokens` tokens for `batch` rows."""
    from searchjax.data import assets
    from searchjax.models import load_pretrained
    model, params = load_pretrained(assets.smollm2_gguf(), dtype=dtype)
    prompts = _prompts(batch, model.config.vocab_size)
    _ours_decode_seconds(model, params, prompts, new_tokens)  # compiles
    return (lambda: _ours_decode_seconds(model, params, prompts, new_tokens)), {}


def _transformers_side(dtype: str, batch: int, new_tokens: int):
    """`common.alternate` side: transformers `generate` (greedy, its KV cache) on the same weights and prompts;
    one timed unit = t(new_tokens) - t(1 token), i.e. prefill excluded as on our side."""
    import torch
    import transformers
    from searchjax.data import assets
    from searchjax.models import load_pretrained, save_pretrained
    threads = common.set_torch_threads()
    with tempfile.TemporaryDirectory(prefix="bench-generation-") as directory:
        model, params = load_pretrained(assets.smollm2_gguf(), dtype="float32")
        save_pretrained(model, params, directory)
        vocab = model.config.vocab_size
        del params
        hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype)).eval()
    ids = torch.tensor(_prompts(batch, vocab))
    mask = torch.ones_like(ids)

    def generate(n):
        start = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              temperature=None, top_p=None, top_k=None, pad_token_id=0)
        assert out.shape[1] == ids.shape[1] + n
        return time.perf_counter() - start

    generate(1)
    return (lambda: max(generate(new_tokens) - generate(1), 1e-9)), {"threads": threads}


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
    MLP kernels and the LM head applied to a [batch, ...] activation, nothing else (no attention over the
    cache, norms, RoPE or sampling). XLA's own ceiling for a decode step on this CPU. The weights are the
    per-layer trees our CPU decode step reads (cpu_decode.layer_weights, made once outside the timing): a
    scan over the stacked weights would copy each layer's slice every step, and that ceiling would flatter us."""
    import jax.numpy as jnp
    from searchjax.cpu_decode import layer_weights
    from searchjax.models import lm_head_weight
    from searchjax.models.kernels import matmul
    config = model.config

    def layer(x, p):
        attn, mlp = p["attn"], p["mlp"]
        q = matmul("bh,hnd->bnd", x, attn["q_proj"]["kernel"])
        kv = (matmul("bh,hnd->bnd", x, attn["k_proj"]["kernel"]).sum()
              + matmul("bh,hnd->bnd", x, attn["v_proj"]["kernel"]).sum())
        x = matmul("bnd,ndh->bh", q, attn["o_proj"]["kernel"]) + kv
        gated = matmul("bh,hf->bf", x, mlp["gate_proj"]["kernel"]) * matmul("bh,hf->bf", x, mlp["up_proj"]["kernel"])
        return matmul("bf,fh->bh", gated, mlp["down_proj"]["kernel"]) * 1e-3, None

    @jax.jit
    def step(layers, head, x):
        for weights in layers:
            x, _ = layer(x, weights)
        return matmul("bh,hv->bv", x, head, jnp.float32)

    layers = jax.block_until_ready(jax.jit(lambda p: layer_weights(p, config))(params))
    head = lm_head_weight(params, config).astype(config.compute_dtype)
    x = jnp.full((batch, config.hidden_size), 1e-2, config.compute_dtype)
    _, median = _median_time(lambda: jax.block_until_ready(step(layers, head, x)), max(iters, 10))
    return median


def run(args: common.BenchArgs) -> list[dict]:
    common.require_cpu("generation")
    from searchjax.data import assets
    from searchjax.models import load_pretrained
    model, params = load_pretrained(assets.smollm2_gguf(), dtype=args.dtype)
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    bandwidth = common.memory_bandwidth()
    # --quick is a smoke run of this file (a minute or two on a busy machine), not a measurement.
    new_tokens = 8 if args.quick else 64
    batches = (1, 8) if args.quick else (1, 8, 32)
    iters = 1 if args.quick else max(1, min(args.iters, 3))
    rows = []
    for batch in batches:
        timed = common.alternate({
            "ours": (_ours_side, (args.dtype, batch, new_tokens), common.ours_environ()),
            "transformers": (_transformers_side, (args.dtype, batch, new_tokens), common.torch_environ()),
        }, rounds=iters, warmup=args.warmup)
        ours, reference = timed["ours"], timed["transformers"]
        ours_tok_s = batch * new_tokens / ours["median_s"]
        ref_tok_s = batch * (new_tokens - 1) / reference["median_s"]
        bound_steps = bandwidth / weight_bytes
        matmul_step = _matmul_only_step_seconds(model, params, batch, iters)
        rows.append({"case": f"decode b={batch}", "dtype": args.dtype, "batch": batch, "new_tokens": new_tokens,
                     "ours_tok_s": ours_tok_s, "ours_s": f"{ours['median_s']:.3g} ({ours['min_s']:.3g}-{ours['max_s']:.3g})",
                     "transformers_tok_s": ref_tok_s,
                     "transformers_s": f"{reference['median_s']:.3g} ({reference['min_s']:.3g}-{reference['max_s']:.3g})",
                     "speedup": ours_tok_s / ref_tok_s,
                     "bound_tok_s": batch * bound_steps, "bound_fraction": (ours_tok_s / batch) / bound_steps,
                     "matmul_only_bound_fraction": (1 / matmul_step) / bound_steps,
                     "vs_matmul_only": matmul_step * ours_tok_s / batch, "weight_mb": weight_bytes / 1e6,
                     "bandwidth_gb_s": bandwidth / 1e9, "torch_threads": reference["info"]["threads"]})
    # A rollout-sized cache (most of it still empty): the step attends over the filled window only, so this
    # should match the row above rather than scale with max_cache_len.
    prompts = _prompts(8, model.config.vocab_size)
    _ours_decode_seconds(model, params, prompts, new_tokens, cache_len=ROLLOUT_CACHE_LEN)
    ours = statistics.median(_ours_decode_seconds(model, params, prompts, new_tokens, cache_len=ROLLOUT_CACHE_LEN)
                             for _ in range(iters))
    rows.append({"case": f"decode b=8 max_cache_len={ROLLOUT_CACHE_LEN}", "dtype": args.dtype, "batch": 8,
                 "new_tokens": new_tokens, "ours_tok_s": 8 * new_tokens / ours, "bound_tok_s": 8 * bandwidth / weight_bytes,
                 "bound_fraction": (new_tokens / ours) / (bandwidth / weight_bytes)})
    turns, decode_tokens, block = 3, (8 if args.quick else 32), (16 if args.quick else 96)
    cont, re = _rollout_seconds(model, params, 8, turns, decode_tokens, block, iters)
    rows.append({"case": f"rollout b=8 {turns} turns", "dtype": args.dtype, "batch": 8,
                 "new_tokens": turns * decode_tokens, "continuation_s": cont, "reprefill_s": re, "speedup": re / cont})
    return rows

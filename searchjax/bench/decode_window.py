"""Decode-step time against the filled cache window: SmolLM2-135M, the current step vs the former one.

    python -m launch.benchmark --only=decode_window [--dtype=bfloat16] [--quick]

What is timed: greedy decode steps on a cache of S = 2,048 slots (a Search-R1 rollout's max_cache_len) whose
first `filled` slots hold keys/values (random values: a step's cost does not depend on them) over the
window W = `generation.decode_window(filled + steps, S)` that a `decode` call would use: 128 slots for 100
filled, 2,048 for 2,000. One jitted call runs n steps in a `lax.fori_loop` (n traced, so one compilation per
case) with the same per-call preparation as `decode_steps.decode_loop`; per-step seconds =
(t(n steps) - t(1 step)) / (n - 1), so that preparation and the dispatch cancel out. Medians of args.iters.

  * current: `cpu_decode.decode_forward` (per-layer weights and windows made once per call, the windows in
    `cpu_decode.window_layout`'s dtype as `decode_loop` makes them, the window read in place, the token merged
    by log-sum-exp, one slot written per layer), with the CPU kernels where `decode_loop` uses them
    (`searchjax.models.native`: attention always, the skinny matmul from 2 rows, from 1 in bf16;
    `SEARCHJAX_NATIVE=0` runs the jnp forms instead).
  * former: the step before it, which is still the accelerators' step, `decode_steps.decode_forward_stacked`
    (a scan over layers slicing each layer's cache and weights out of the stacked arrays, attention writing the
    token into the layer cache; `cpu_decode.per_layer_decode` says which target runs which).

Rows: step_ms per (step, batch, filled), and the figures the work is judged by:
  * long/short: step time with 2,000 filled slots over 100, batch 1 (goal <= 1.3).
  * roofline at batch 8, 2,000 filled: bytes a step must read (every weight once + the window's keys and
    values, W slots) / `common.roofline_bandwidth` (the best of this host's jitted read, copy and triad, each
    reported in read_copy_triad_gb_s); vs_roofline = measured / that (goal <= 1.3), each round's step against
    a reading taken just before it, the median over rounds (`paired_ratios`). vs_read_roofline: the same
    against `common.read_bandwidth` (the fastest rate those kernels read at; the step only reads).
  * short-window speed: former / current step time at batch 1, 100 filled (> 1: faster now).
--quick: batch 1 only, 4 steps, 1 iteration (a smoke run of this file, not a measurement).

Measured (2026-12-01, `--iters=5`, float32, a shared 2-core Xeon, streaming read 13.2 GB/s), step ms current vs
former: b=1 100 filled 50.6 vs 101.2 (2.0x faster); b=1 2,000 filled 68.2 vs 164.4; b=8 2,000 filled 164.9 vs
355.8 (roofline 98.3). long/short b=1: 1.35 vs 1.62 (goal 1.3); vs roofline b=8: 1.68 vs 3.62 (goal 1.3).
What is left at batch 8 is the attention products themselves: batched over (B, K) with G = 3 query rows each,
XLA:CPU runs them at ~5 GB/s of window (30 layers of `decode_attention` alone at b=8, 2,048 slots: 140-155 ms).
First call (compile + one step): ~12-16 s for the unrolled current step, < 1 s for the former layer scan.
"""

from __future__ import annotations

import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from searchjax import sampling
from searchjax.bench import common

CACHE_LEN = 2048


@functools.partial(jax.jit, static_argnames=("model", "window", "former"))
def _greedy_steps(params, cache, token, steps, *, model, window, former):
    """`steps` greedy steps from `token` (all rows running) on the cache's first `window` slots -> last tokens."""
    from searchjax import cpu_decode, decode_steps
    position = jnp.full(token.shape, cache.index, jnp.int32)
    running = jnp.ones(token.shape, bool)
    if former:
        part = decode_steps.window_cache(cache, window)

        def forward(token, position, part):
            return decode_steps.decode_forward_stacked(params, model, token, position, running, part)
    else:
        config = model.config
        packed = cpu_decode.packed_decode(config, token.shape[0], None)  # as decode_loop chooses
        weights = cpu_decode.layer_weights(params, config, pack=packed)
        head = cpu_decode.packed_lm_head(params, config) if packed else None
        layout = cpu_decode.window_layout(config, None, cache.k.dtype)  # as decode_loop makes it
        part = cpu_decode.split_cache(cache, window, *layout)

        def forward(token, position, part):
            return cpu_decode.decode_forward(params, weights, model, token, position, running, part,
                                             packed_head=head)

    def step(_, carry):
        token, position, part = carry
        logits, part = forward(token, position, part)
        # the greedy decode loop's argmax (`sampling.sample`): over batch 8's 49k-column logits jnp.argmax's
        # (value, index) reduction took 0.96 ms (of a ~27 ms bf16 step), sampling.argmax 0.29 (2-core AMD EPYC)
        return sampling.argmax(logits), position + 1, part

    token, _, part = jax.lax.fori_loop(0, steps, step, (token, position, part))
    return token, part.mask


def _filled_cache(config, batch: int, filled: int):
    from searchjax.models import KVCache
    shape = (config.num_layers, batch, CACHE_LEN, config.num_kv_heads, config.head_dim)
    rng = np.random.default_rng(0)
    k = jnp.asarray(rng.standard_normal(shape, np.float32), config.compute_dtype)
    v = jnp.asarray(rng.standard_normal(shape, np.float32), config.compute_dtype)
    mask = jnp.asarray(np.arange(CACHE_LEN)[None, :] < filled).repeat(batch, 0)
    return KVCache(k=k, v=v, mask=mask, index=jnp.asarray(filled, jnp.int32))


def _step_seconds(model, params, cache, window: int, former: bool, steps: int, iters: int, bandwidths) -> dict:
    """Per-step seconds over `iters` rounds (median, min, max) and, from `bandwidths` (a callable returning
    `common.memory_bandwidths`' readings), one reading taken just before each round, returned per round beside
    its step time (`rounds`): this host's bandwidth moves within minutes (a C++ read on both cores of a 2-core AMD
    EPYC: 35.5, then 26.3 GB/s a quarter hour later), so a roofline ratio against one reading from the run's
    start measured the host's drift as much as the step."""
    token = jnp.full((cache.mask.shape[0],), 100, jnp.int32)

    def call(n):
        start = time.perf_counter()
        jax.block_until_ready(_greedy_steps(params, cache, token, np.int32(n), model=model, window=window,
                                            former=former))
        return time.perf_counter() - start

    compile_s = call(1)
    per_step, rounds = [], []
    for _ in range(iters):
        reading = bandwidths()
        one, many = call(1), call(steps)
        per_step.append(max(many - one, 0.0) / (steps - 1))
        rounds.append((per_step[-1], reading))
    return {"median_s": statistics.median(per_step), "min_s": min(per_step), "max_s": max(per_step),
            "first_call_s": compile_s, "rounds": rounds}


def paired_ratios(rounds, nbytes: float) -> dict:
    """Roofline ratios of (step seconds, bandwidth readings) rounds: each round's step against the bytes at the
    bandwidth read just before it, medians over the rounds. vs_roofline takes `common.roofline_bandwidth` (the
    best of the jitted read, copy and triad, their bytes counted as STREAM does: read and written);
    vs_read_roofline takes `common.read_bandwidth` (the fastest rate any of them read at), the ceiling of a step
    that only reads."""
    strict = [common.roofline_bandwidth(reading) for _, reading in rounds]
    read = [common.read_bandwidth(reading) for _, reading in rounds]
    return {"vs_roofline": statistics.median(s * b / nbytes for (s, _), b in zip(rounds, strict)),
            "vs_read_roofline": statistics.median(s * b / nbytes for (s, _), b in zip(rounds, read)),
            "bandwidth_gb_s": statistics.median(strict) / 1e9, "read_gb_s": statistics.median(read) / 1e9}


def run(args: common.BenchArgs) -> list[dict]:
    common.require_cpu("decode_window")
    from searchjax.data import assets
    from searchjax.generation import decode_window
    from searchjax.models import load_pretrained
    from searchjax.roofline import kv_bytes
    model, params = load_pretrained(assets.smollm2_gguf(), dtype=args.dtype)
    config = model.config
    dtype = jnp.dtype(config.compute_dtype).name  # --dtype with "auto" resolved for this host
    steps = 4 if args.quick else 16
    iters = 1 if args.quick else max(1, args.iters)
    # (8, 1100): the same 2,048-slot window just over half filled, as right after a rollout's window doubles (the
    # step reads the whole window: its cost follows the window, not the filled slots)
    cases = [(1, 100), (1, 2000)] + ([] if args.quick else [(8, 2000), (8, 1100)])
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    rows, times = [], {}
    for batch, filled in cases:
        cache = _filled_cache(config, batch, filled)
        window = decode_window(filled + steps, CACHE_LEN)
        window_bytes = kv_bytes(config, batch, window, jnp.dtype(config.compute_dtype).name)
        nbytes = weight_bytes + window_bytes
        for name, former in (("current", False), ("former", True)):
            t = _step_seconds(model, params, cache, window, former, steps, iters,
                              bandwidths=functools.partial(common.memory_bandwidths, iters=2))
            times[name, batch, filled] = t["median_s"]
            ratios = paired_ratios(t["rounds"], nbytes)
            # the readings of the round nearest the median step, beside the ratios' medians
            reading = min(t["rounds"], key=lambda r: abs(r[0] - t["median_s"]))[1]
            readings = "/".join(f"{reading[k] / 1e9:.1f}" for k in ("read", "copy", "triad"))
            rows.append({"case": f"step b={batch} filled={filled}", "step": name, "dtype": dtype, "batch": batch,
                         "filled": filled, "window": window, "step_ms": 1e3 * t["median_s"],
                         "range_ms": f"{1e3 * t['min_s']:.3g}-{1e3 * t['max_s']:.3g}",
                         "first_call_s": t["first_call_s"],
                         "roofline_ms": 1e3 * nbytes / (ratios["bandwidth_gb_s"] * 1e9), **ratios,
                         "weight_mb": weight_bytes / 1e6, "window_mb": window_bytes / 1e6,
                         "read_copy_triad_gb_s": readings})
        del cache
    for name in ("current", "former"):
        rows.append({"case": "long/short b=1 (goal <= 1.3)", "step": name, "dtype": dtype,
                     "ratio": times[name, 1, 2000] / times[name, 1, 100]})
        if not args.quick:
            row = next(r for r in rows if r.get("step") == name and r.get("batch") == 8)
            rows.append({"case": "vs roofline b=8 filled=2000 (goal <= 1.3)", "step": name, "dtype": dtype,
                         "ratio": row["vs_roofline"]})
            rows.append({"case": "vs read roofline b=8 filled=2000", "step": name, "dtype": dtype,
                         "ratio": row["vs_read_roofline"]})
    rows.append({"case": "short window b=1: former / current step time", "dtype": dtype,
                 "ratio": times["former", 1, 100] / times["current", 1, 100]})
    return rows

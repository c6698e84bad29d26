"""Timing and hardware-ceiling helpers shared by the benchmark suites.

Every speed figure in searchjax is reported next to a reference measured in the same process and
run (transformers/torch, sentence-transformers, faiss Flat, ...), so a noisy machine moves both
sides together; the ratio is what we quote. Compile time is reported apart from steady state.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import statistics
import time
from typing import Any, Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class BenchArgs:
    """Options common to all suites (launch/benchmark.py fills them from flags)."""
    warmup: int = 1          # untimed calls after the first (compiling) call
    iters: int = 5           # timed calls; the median is reported
    quick: bool = False      # smaller shapes, for a smoke run of the harness itself
    out_dir: str = "bench_results"
    dtype: str = "float32"   # compute dtype of both sides: "float32", "bfloat16", or "auto" (the host's choice)


def block(x: Any) -> Any:
    """Wait for every jax array in x (no-op for numpy / torch results)."""
    import jax
    return jax.block_until_ready(x)


def timeit(fn: Callable[[], Any], *, warmup: int = 1, iters: int = 5) -> dict[str, float]:
    """Time fn() -> {"first_s": first call (compile + run), "median_s", "min_s", "max_s"}.

    The first call is timed on its own, so for a jitted function first_s - median_s is the
    compile (or cache-load) time.
    """
    start = time.perf_counter()
    block(fn())
    first = time.perf_counter() - start
    for _ in range(warmup):
        block(fn())
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        block(fn())
        times.append(time.perf_counter() - start)
    return {"first_s": first, "median_s": statistics.median(times), "min_s": min(times),
            "max_s": max(times), "compile_s": max(first - statistics.median(times), 0.0)}


def matmul_peak_flops(n: int = 2048, dtype: str = "float32", iters: int = 5) -> float:
    """Measured FLOP/s of one large jitted jnp.dot: the practical f32 matmul ceiling of this host."""
    import jax
    import jax.numpy as jnp
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
    b = jnp.asarray(np.random.default_rng(1).standard_normal((n, n)), dtype)
    dot = jax.jit(jnp.dot)
    t = timeit(lambda: dot(a, b), warmup=1, iters=iters)
    return 2.0 * n ** 3 / t["min_s"]


def memory_bandwidth(megabytes: int = 512, iters: int = 5) -> float:
    """Measured read bandwidth in bytes/s: a jitted sum over a buffer far larger than the caches."""
    import jax
    import jax.numpy as jnp
    x = jnp.ones((megabytes * 2 ** 20 // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    t = timeit(lambda: total(x), warmup=1, iters=iters)
    return x.nbytes / t["min_s"]


def format_table(rows: list[dict]) -> str:
    """Rows as an aligned plain-text table (columns = union of keys, in first-seen order)."""
    if not rows:
        return "(no rows)"
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    table = [columns] + [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def torch_environ() -> dict:
    """os.environ without `runtime.HUGE_PAGES_TUNABLE`, for the torch references: they run as torch users run
    them (THP via glibc's malloc made the train benchmark's torch update about 15 % slower here, 27.2 vs 23.2 s,
    while the JAX side gains)."""
    from searchjax.runtime import HUGE_PAGES_TUNABLE
    tunables = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if t and t != HUGE_PAGES_TUNABLE]
    environ = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    return environ | ({"GLIBC_TUNABLES": ":".join(tunables)} if tunables else {})


def in_fresh_process(fn, *args, environ: dict | None = None) -> dict:
    """Run fn(*args, queue) in a spawned process (its own peak memory, no JAX/torch cross-talk), started
    with `environ` (default: this process's environment)."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=fn, args=(*args, queue))
    saved = dict(os.environ)
    try:
        if environ is not None:  # a spawned child inherits os.environ at start()
            os.environ.clear()
            os.environ.update(environ)
        process.start()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    while True:  # a child killed (e.g. out of memory) never puts a result: do not wait for it forever
        try:
            result = queue.get(timeout=5)
            break
        except Exception:  # queue.Empty
            if not process.is_alive():
                raise RuntimeError(f"{fn.__name__} died with exit code {process.exitcode} (out of memory?)")
    process.join()
    return result

"""Timing and hardware-ceiling helpers shared by the benchmark suites.

Every speed figure in searchjax is reported next to a reference measured in the same process and
run (transformers/torch, sentence-transformers, faiss Flat, ...), so a noisy machine moves both
sides together; the ratio is what we quote. Compile time is reported apart from steady state.
"""

from __future__ import annotations

import dataclasses
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

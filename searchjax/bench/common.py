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
import sys
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
    model: str = "smollm2"   # the policy of the suites that take one (rollout): an HF checkpoint dir, a GGUF or an alias


def block(x: Any) -> Any:
    """Wait for every jax array in x (no-op for numpy / torch results). Where jax was never imported, x holds
    no jax array: a reference side's process (torch) then stays without jax."""
    jax = sys.modules.get("jax")
    return x if jax is None else jax.block_until_ready(x)


def timed(fn: Callable[[], Any]) -> Callable[[], float]:
    """A `common.alternate` unit: run() -> seconds of one fn() call with every result ready."""
    def run():
        start = time.perf_counter()
        block(fn())
        return time.perf_counter() - start
    return run


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


def memory_bandwidths(megabytes: int = 512, iters: int = 5) -> dict[str, float]:
    """Streaming bandwidths of this host in bytes/s, each over buffers far larger than the caches, best of
    `iters` after a warm-up call (bytes counted as the kernel must move them):

      read:  jitted sum(a)             |a| bytes
      copy:  jitted b = a              2 |a| bytes (read a, write b; b's storage donated and reused)
      triad: jitted b = a + s * c      3 |a| bytes (STREAM's triad: read two, write one; b reused)
      numpy_copy: np.copyto(b, a)      2 |a| bytes, one thread: a cross-check of the jitted copy's arithmetic

    The numpy copy runs on one core. Measured on a 2-core Xeon (512 MB): read 22, numpy copy 20, jitted triad 8,
    jitted copy 5 GB/s: XLA:CPU's element-wise loops stream well below the read, so the rooflines use the best
    of the three jitted kernels (the read), the bandwidth a decode step's loads can reach."""
    import jax
    import jax.numpy as jnp
    n = megabytes * 2 ** 20 // 4
    a = jnp.ones((n,), jnp.float32)
    c = jnp.full((n,), 2.0, jnp.float32)
    nbytes = a.nbytes
    # copy and triad write into a donated buffer that is fed back (b = a + 0 with a's storage reused): a fresh
    # output per call would be malloc'd and page-faulted in on first touch, timing the kernel's page faults
    # (measured 3.8 GB/s for the copy that way against 12.7 GB/s for numpy's into an existing buffer)
    total = jax.jit(jnp.sum)
    copied = jax.jit(lambda x, y: y * 1.0, donate_argnums=0)  # y into x's storage: read y, write x
    triad_fn = jax.jit(lambda x, y, z: y + 3.0 * z, donate_argnums=0)
    buffers = {"out": jnp.zeros((n,), jnp.float32)}

    def copy_once():
        buffers["out"] = copied(buffers["out"], a)
        return buffers["out"]

    def triad_once():
        buffers["out"] = triad_fn(buffers["out"], a, c)
        return buffers["out"]

    read = timeit(lambda: total(a), warmup=1, iters=iters)["min_s"]
    copy = timeit(copy_once, warmup=1, iters=iters)["min_s"]
    triad = timeit(triad_once, warmup=1, iters=iters)["min_s"]
    source, target = np.ones(n, np.float32), np.empty(n, np.float32)
    numpy_copy = timeit(lambda: np.copyto(target, source), warmup=1, iters=iters)["min_s"]
    return {"read": nbytes / read, "copy": 2 * nbytes / copy, "triad": 3 * nbytes / triad,
            "numpy_copy": 2 * nbytes / numpy_copy}


def memory_bandwidth(megabytes: int = 512, iters: int = 5) -> float:
    """The host's streaming bandwidth in bytes/s for byte rooflines: the best of the jitted read, copy and
    triad of `memory_bandwidths` (a decode step mostly reads; the best kernel is the attainable ceiling)."""
    return roofline_bandwidth(memory_bandwidths(megabytes, iters))


def roofline_bandwidth(measured: dict[str, float]) -> float:
    """The rooflines' bandwidth from `memory_bandwidths`' readings: the best of the jitted read, copy and triad
    (numpy's one-thread copy is a cross-check only)."""
    return max(measured["read"], measured["copy"], measured["triad"])


def read_bandwidth(measured: dict[str, float]) -> float:
    """The fastest rate in bytes/s at which `memory_bandwidths`' jitted kernels read: the read itself, half the
    copy's bytes, two thirds of the triad's. The ceiling of a step that only reads (a decode step: its weights
    and its window), where `roofline_bandwidth` also credits the copy's and triad's writes: on a 2-core AMD EPYC
    (2026-12-06) the jitted copy's 2 |a| bytes came to 59 GB/s in a run whose read took 33.5, and a C++ read of
    16 streams on both cores 35 GB/s."""
    return max(measured["read"], measured["copy"] / 2, measured["triad"] * 2 / 3)


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
    """os.environ without `runtime.MALLOC_TUNABLES`, for the torch references: they run as torch users run
    them (THP via glibc's malloc made the train benchmark's torch update about 15 % slower here, 27.2 vs 23.2 s,
    while the JAX side gains)."""
    tunables = _users_tunables()
    environ = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    return environ | ({"GLIBC_TUNABLES": tunables} if tunables else {})


def torch_kept_memory_environ() -> dict:
    """`torch_environ` with `runtime.KEEP_MEMORY_TUNABLES` (not the huge pages, which made torch slower): a second
    torch reference whose glibc keeps what it frees, as ours does. Where the host takes freed memory back within
    seconds, torch's default allocator pays fresh page faults for its large tensors on every call (its logits,
    400 MB a scoring call at 8 x 256), and a benchmark that alternates the sides idles it between calls."""
    from searchjax.runtime import KEEP_MEMORY_TUNABLES, with_malloc_tunables
    return torch_environ() | {"GLIBC_TUNABLES": with_malloc_tunables(_users_tunables(), KEEP_MEMORY_TUNABLES)}


def _users_tunables() -> str:
    """GLIBC_TUNABLES as the user set it, without ours (a parent launched through the re-exec carries them)."""
    from searchjax.runtime import MALLOC_TUNABLES
    return ":".join(t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if t and t not in MALLOC_TUNABLES)


def summary(seconds: list[float]) -> dict[str, float]:
    """{"median_s", "min_s", "max_s", "n"} of a list of timings (the figure we quote is the median)."""
    return {"median_s": statistics.median(seconds), "min_s": min(seconds), "max_s": max(seconds),
            "n": len(seconds)}


def _side_worker(setup, args, connection) -> None:
    """A benchmark side's process: `setup(*args)` -> (run, info); send info; then run() per "run" message,
    sending back its seconds (or its (seconds, details) pair), until "stop". Exceptions go back to the parent
    as text."""
    import traceback
    try:
        run, info = setup(*args)
        connection.send(("ready", info))
        while connection.recv() == "run":
            result = run()
            connection.send(("ok", (float(result[0]), result[1]) if isinstance(result, tuple) else float(result)))
    except BaseException:  # noqa: BLE001 - the parent reports it with the side's name
        connection.send(("error", traceback.format_exc()))
    finally:
        connection.close()


def alternate(sides: dict, rounds: int, warmup: int = 1) -> dict[str, dict]:
    """Time several implementations fairly: each in its own fresh process, warmed, then called in turn.

    sides: {name: (setup, args, environ)}, setup a module-level function; in a spawned process started with
    `environ` (None: this process's environment), setup(*args) loads its side and returns (run, info): run()
    does one timed unit and returns its seconds (so a side can leave out what it should not be charged for,
    e.g. prefill), or (seconds, details) with details a picklable dict about that unit (the last timed unit's
    come back as "details"); info is any picklable dict (e.g. its first result, for an agreement check). Every side is
    started and set up before any timing (one side's load never overlaps another's run), then each side runs
    `warmup` untimed calls, then `rounds` rounds in which every side runs once, one at a time, so drift in the
    machine's load hits all sides alike. Returns {name: summary(seconds) | {"info": info, "seconds": [...]}}.
    """
    ctx = multiprocessing.get_context("spawn")
    workers = {}
    saved = dict(os.environ)
    try:
        for name, (setup, args, environ) in sides.items():
            parent, child = ctx.Pipe()
            if environ is not None:  # a spawned child inherits os.environ at start()
                os.environ.clear()
                os.environ.update(environ)
            process = ctx.Process(target=_side_worker, args=(setup, tuple(args), child), daemon=True)
            process.start()
            os.environ.clear()
            os.environ.update(saved)
            child.close()
            workers[name] = (process, parent, _receive(name, parent, process))  # set up one side at a time
        seconds, details = {name: [] for name in sides}, {name: {} for name in sides}
        for round_ in range(warmup + rounds):
            for name, (process, parent, _) in workers.items():
                parent.send("run")
                elapsed = _receive(name, parent, process)
                if isinstance(elapsed, tuple):
                    elapsed, details[name] = elapsed
                if round_ >= warmup:
                    seconds[name].append(elapsed)
        return {name: summary(seconds[name]) | {"info": info, "seconds": seconds[name], "details": details[name]}
                for name, (_, _, info) in workers.items()}
    finally:
        os.environ.clear()
        os.environ.update(saved)
        for process, parent, *_ in workers.values():
            try:
                parent.send("stop")
            except OSError:
                pass
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


def _receive(name: str, connection, process):
    """The next message of a side's worker; its error (with the worker's traceback) or death raises here."""
    while not connection.poll(5):
        if not process.is_alive():
            raise RuntimeError(f"benchmark side {name!r} died with exit code {process.exitcode} (out of memory?)")
    try:
        status, value = connection.recv()
    except EOFError:
        process.join(timeout=5)
        raise RuntimeError(f"benchmark side {name!r} died with exit code {process.exitcode}") from None
    if status == "error":
        raise RuntimeError(f"benchmark side {name!r} failed:\n{value}")
    return value


def ours_environ() -> dict:
    """os.environ with `runtime.MALLOC_TUNABLES` in GLIBC_TUNABLES: our side's best setting (see
    `runtime.use_transparent_huge_pages`), set at process start as the launch scripts do."""
    from searchjax.runtime import with_malloc_tunables
    return dict(os.environ) | {"GLIBC_TUNABLES": with_malloc_tunables(_users_tunables())}


def torch_device() -> str:
    """Where a torch reference runs: "cuda" when JAX's default backend is a GPU (both sides on the accelerator,
    each in its own process), else "cpu". Decided by JAX's backend, not torch's, so a host whose torch sees a GPU
    that JAX does not use never compares a GPU reference with a CPU side."""
    import jax
    return "cuda" if jax.default_backend() == "gpu" else "cpu"


def require_cpu(suite: str) -> None:
    """Raise, naming the suite, unless JAX runs on the CPU: the suites whose references and bounds are CPU ones
    (torch on the CPU, the host's streaming bandwidth and GEMM) would set them against an accelerator."""
    import jax
    backend = jax.default_backend()
    if backend != "cpu":
        raise RuntimeError(f"benchmark suite {suite!r} measures against CPU references and bounds, and JAX runs on "
                           f"{backend} here: on an accelerator run --only=rollout (or JAX_PLATFORMS=cpu)")


def torch_synchronize(device: str) -> None:
    """Wait for the torch work queued on `device` (a no-op on the CPU): a timer read after it counts that work."""
    if device == "cuda":
        import torch
        torch.cuda.synchronize()


def set_torch_threads() -> int:
    """torch's intra-op threads = this host's cores (its best setting here); returns the count."""
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
    return torch.get_num_threads()


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

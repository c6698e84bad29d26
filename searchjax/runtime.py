"""Process-level JAX settings shared by launch scripts, notebooks and tests."""

from __future__ import annotations

import contextlib
import functools
import os
import threading


def enable_compilation_cache(path: str | None = None) -> str:
    """Turn on JAX's persistent compilation cache so reruns skip XLA compilation.

    The directory is `path`, else $SEARCHJAX_COMPILATION_CACHE, else <cache_dir>/jax. Every compiled
    program is cached (min compile time 0): tests and launch scripts recompile the same small programs
    on every run, and on 2 CPU cores compilation dominates their wall time.
    """
    import jax
    from searchjax.data import assets
    path = path or os.environ.get("SEARCHJAX_COMPILATION_CACHE") or str(assets.cache_dir() / "jax")
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def skip_absent_tpu() -> bool:
    """Set JAX_PLATFORMS=cpu when the TPU runtime is installed but this host has no TPU and no GPU plugin.

    install.sh installs libtpu (for the deviceless compile check, docs/compile_check.md), and with it JAX's
    backend start-up probes for a TPU on every host: on a CPU machine that costs seconds and prints a screen of
    libtpu errors before every run. A no-op when JAX_PLATFORMS is set, on a TPU VM (/dev/accel*, /dev/vfio/), or
    when a GPU plugin is installed (JAX then picks the GPU). Returns whether it set the variable. Called when
    searchjax is imported, which must come before JAX's backend starts to matter.
    """
    import glob
    import importlib.util
    if "JAX_PLATFORMS" in os.environ or importlib.util.find_spec("libtpu") is None:
        return False
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        return False
    plugins = importlib.util.find_spec("jax_plugins")
    if plugins is not None and any(glob.glob(os.path.join(p, "*")) for p in plugins.submodule_search_locations or []):
        return False
    os.environ["JAX_PLATFORMS"] = "cpu"
    import sys
    if "jax" in sys.modules:  # imported first: JAX read the variable already, its backends start later
        sys.modules["jax"].config.update("jax_platforms", "cpu")
    return True


BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset:
    """The feature flags of this host's CPU (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def host_compute_dtype(backend: str | None = None, flags: frozenset | None = None) -> str:
    """The compute dtype that is fast where this process runs: "bfloat16" or "float32".

    bfloat16 on TPU and GPU, and on a CPU with a bf16 matrix unit (AMX-BF16 or AVX-512 BF16), where XLA's
    bf16 GEMM with float32 accumulation runs about 5x its float32 GEMM (measured 1.04 vs 0.21 TFLOP/s for a
    2048^3 product on a 2-core Xeon); float32 on other CPUs (AVX2-only hosts emulate bf16, and it is slower
    than float32 there). backend / flags default to JAX's default backend and /proc/cpuinfo.
    """
    if backend is None:
        import jax
        backend = jax.default_backend()
    if backend in ("tpu", "gpu", "cuda", "rocm"):
        return "bfloat16"
    flags = cpu_flags() if flags is None else flags
    return "bfloat16" if any(flag in flags for flag in BF16_CPU_FLAGS) else "float32"


def resolve_dtype(name: str) -> str:
    """A config's dtype field with "auto" replaced by `host_compute_dtype()`; other names unchanged."""
    return host_compute_dtype() if name == "auto" else name


HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"
# Freed memory stays in the process: one malloc arena, no chunk of its own mapping, no trimming of the heap's top
# (`use_transparent_huge_pages` says why).
KEEP_MEMORY_TUNABLES = ("glibc.malloc.arena_max=1", "glibc.malloc.mmap_max=0",
                        "glibc.malloc.trim_threshold=1099511627776")
MALLOC_TUNABLES = (HUGE_PAGES_TUNABLE, *KEEP_MEMORY_TUNABLES)


def with_malloc_tunables(tunables: str, ours: tuple = MALLOC_TUNABLES) -> str:
    """A GLIBC_TUNABLES value with `ours` (default `MALLOC_TUNABLES`) added after it, but none whose name it
    already sets: a setting the user made stays as made."""
    named = {t.split("=")[0] for t in tunables.split(":") if t}
    return ":".join(filter(None, [tunables, *(t for t in ours if t.split("=")[0] not in named)]))


def use_transparent_huge_pages() -> None:
    """Re-execute this process (same interpreter and argv) with glibc's malloc asking for transparent huge pages
    and keeping the memory it frees (`MALLOC_TUNABLES`).

    XLA:CPU takes its large buffers (layer-stacked activations and gradients, the scan's zero-filled outputs)
    from malloc, and where the kernel's THP mode is `madvise` (a common default) they get 4 KiB pages: a
    page fault per 4 KiB on first touch and TLB misses on every strided pass. With GLIBC_TUNABLES
    glibc.malloc.hugetlb=1 (glibc >= 2.35) malloc madvises its mappings for 2 MiB pages: one SmolLM2
    2 x 512-token micro-batch forward + backward took 5.5-5.7 s instead of 6.0-6.2 s (2 cores, same day).

    Kept memory: XLA:CPU mallocs each execution's temporaries as one block (3.37 GB for the train benchmark's
    bf16 update) and frees it at the end; glibc serves so large a block from a mapping of its own and unmaps it
    on free, so every call faults all of it in again. How much that costs depends on what the host does with
    memory given back: on the 2-core sandbox of 2026-12-06 a 3.37 GB first touch took 0.6 s right after a
    free and 6.2 s after 11 s idle (the host had reclaimed it), and the bf16 update took 7.9 s back to back
    but 12.8 s when each call followed 11 s of something else (a rollout; the benchmark's torch side). With one
    arena (`arena_max=1`: the block comes from the main heap even when an XLA thread asks), no separate
    mappings (`mmap_max=0`) and no trimming, the block stays mapped between calls: 8.5 s after the same gaps,
    8.3 s back to back (`docs/performance.md`, "The update's temporaries kept mapped"). The process keeps its
    peak footprint instead of returning memory between calls, and blocks of other sizes leave holes: the main
    job peaked at 8.6 GiB with these tunables and 4.6 GiB without (6 min 12 s against 6 min 42 s; docs/performance.md,
    "The Dr.Free pool, f32 products through OpenBLAS, memory the malloc tunables keep"). Generation, whose blocks
    vary most, gives its large ones back (`returning_large_blocks`). SEARCHJAX_HUGE_PAGES=0 where memory is short.

    glibc reads GLIBC_TUNABLES once at start-up, hence the re-exec, which launch scripts do first thing in
    `__main__`, before absl parses flags and before JAX is imported. A no-op when glibc.malloc.hugetlb is
    already set, on other platforms or older glibc, when THP is `never`, or with SEARCHJAX_HUGE_PAGES=0.
    """
    import platform
    import sys
    if os.environ.get("SEARCHJAX_HUGE_PAGES", "1") == "0":
        return
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in tunables or sys.platform != "linux":
        return
    libc, version = platform.libc_ver()
    try:
        if libc != "glibc" or tuple(int(x) for x in version.split(".")[:2]) < (2, 35):
            return
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[never]" in f.read():
                return
    except (OSError, ValueError):
        return
    env = dict(os.environ, GLIBC_TUNABLES=with_malloc_tunables(tunables))
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


# mallopt(3) parameters (glibc's malloc.h).
_M_MMAP_THRESHOLD, _M_MMAP_MAX = -3, -4
# Blocks of at least this size that no free chunk of the heap fits get a mapping of their own inside
# `returning_large_blocks`: glibc's largest mmap threshold on 64-bit (half its 64 MiB heap size).
RETURNED_BLOCK_BYTES = 32 << 20
_GLIBC_MMAP_MAX = 65536  # glibc's default M_MMAP_MAX
_returning = {"depth": 0, "lock": threading.Lock()}


def keeps_freed_memory() -> bool:
    """Whether this process runs with `KEEP_MEMORY_TUNABLES`' no-mmap rule (GLIBC_TUNABLES as glibc read it)."""
    import sys
    return sys.platform == "linux" and "glibc.malloc.mmap_max=0" in os.environ.get("GLIBC_TUNABLES", "").split(":")


@functools.lru_cache(maxsize=1)
def _mallopt():
    import ctypes
    return ctypes.CDLL("libc.so.6", use_errno=True).mallopt


def _set_mmap_max(value: int) -> None:
    if not _mallopt()(_M_MMAP_MAX, value):
        raise OSError(f"mallopt(M_MMAP_MAX, {value}) failed")


@contextlib.contextmanager
def returning_large_blocks():
    """Inside this block, glibc gives a large block that no free heap chunk fits (>= RETURNED_BLOCK_BYTES) a
    mapping of its own and unmaps it when freed; outside it, `KEEP_MEMORY_TUNABLES` keep everything in the heap.

    The keep is for the update: XLA:CPU takes its temporaries as one block of the same size at every call, and a
    block kept in the heap is reused without faulting it in again (`use_transparent_huge_pages`). Generation is
    the opposite case: prefills, appends and decode segments of a rollout ask for blocks of many sizes, the heap
    keeps the high-water mark of their sum plus the holes between them, and a process that keeps everything
    peaked at 10.8 GiB in the Dr.Free paper solver's rollouts where one that keeps nothing peaked at 7.1 GiB
    (docs/performance.md, "Generation gives its large blocks back"). Inside this block the same rollouts peaked at
    6.9 GiB. The price is first-touch page faults on the blocks mapped afresh: the 8-row rollout benchmark at
    Search-R1's budgets ran 2.7 % slower (104.9 s against 102.1 s, alternated), and its peak fell from 9.3 to
    6.0 GiB; the paper solver's 10-row rollouts 6 % slower (90.5 s against 85.2 s a chunk, ~12 s more system
    time each), their peak 6.8 GiB against 9.8-11.4 GiB and rising. Those calls ran back to back. On a VM whose
    kernel reports free memory to its host (free page reporting, e.g. Firecracker's balloon), a block given back and
    idle for ~2 s is taken by the host and faulted in again there: a 64-token decode at batch 8 took 2.0 s after a
    3 s gap against 1.3 s back to back, and 1.2 s either way with the blocks kept (docs/performance.md, "Memory the
    VM takes back"). `searchjax.generation` runs its calls in this block. Nested blocks are one block; a no-op
    in a process that does not keep freed memory, and with SEARCHJAX_RETURN_BLOCKS=0 (where memory is ample and
    that time matters more than the peak). Yields whether it is active: XLA allocates when a program runs, so a
    caller that dispatched one blocks on it inside.
    """
    if not keeps_freed_memory() or os.environ.get("SEARCHJAX_RETURN_BLOCKS", "1") == "0":
        yield False
        return
    with _returning["lock"]:
        _returning["depth"] += 1
        if _returning["depth"] == 1:
            _mallopt()(_M_MMAP_THRESHOLD, RETURNED_BLOCK_BYTES)
            _set_mmap_max(_GLIBC_MMAP_MAX)
    try:
        yield True
    finally:
        with _returning["lock"]:
            _returning["depth"] -= 1
            if _returning["depth"] == 0:
                _set_mmap_max(0)

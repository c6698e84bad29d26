"""Process-level JAX settings shared by launch scripts, notebooks and tests."""

from __future__ import annotations

import os


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

"""model.dtype "auto": the host's fast compute dtype (searchjax.runtime.host_compute_dtype), resolved when a
checkpoint loads."""

import jax
import jax.numpy as jnp

from searchjax import runtime


def test_host_compute_dtype_by_backend_and_cpu_flags():
    assert runtime.host_compute_dtype("tpu", frozenset()) == "bfloat16"
    assert runtime.host_compute_dtype("gpu", frozenset()) == "bfloat16"
    assert runtime.host_compute_dtype("cpu", frozenset({"avx2", "fma"})) == "float32"  # AMD EPYC-like: no bf16 unit
    assert runtime.host_compute_dtype("cpu", frozenset({"avx512f", "amx_bf16", "amx_tile"})) == "bfloat16"
    assert runtime.host_compute_dtype("cpu", frozenset({"avx512f", "avx512_bf16"})) == "bfloat16"
    assert runtime.host_compute_dtype("cpu", frozenset({"avx512f"})) == "float32"


def test_cpu_flags_reads_proc_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 avx2 amx_bf16\n\n")
    assert runtime.cpu_flags(str(cpuinfo)) == {"fpu", "sse2", "avx2", "amx_bf16"}
    assert runtime.cpu_flags(str(tmp_path / "absent")) == frozenset()


def test_auto_resolves_when_a_checkpoint_loads(tiny_hf_checkpoints):
    from searchjax.models import load_pretrained
    directory, _ = next(iter(tiny_hf_checkpoints.values()))
    expected = runtime.host_compute_dtype()
    model, params = load_pretrained(directory, dtype="auto", param_dtype="float32")
    assert model.config.dtype == expected and model.config.param_dtype == "float32"
    model, params = load_pretrained(directory, dtype="auto")
    assert model.config.param_dtype == expected
    assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(expected)}
    assert runtime.resolve_dtype("float32") == "float32" and runtime.resolve_dtype("auto") == expected

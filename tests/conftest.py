"""Session setup shared by every test.

XLA_FLAGS must be set before jax is imported anywhere: 8 simulated CPU devices let the mesh tests
run data x fsdp x tensor = 2 x 2 x 2 on one machine. Expensive assets are session fixtures, loaded
once. No test downloads anything: hubs are unreachable, so HF_HUB_OFFLINE is forced.

The suite runs with its own empty searchjax cache ($SEARCHJAX_CACHE: indexes, built default sets,
converted tokenizers), made once per test session and removed at its end, so no test can pass or fail
because of what an earlier run left in the user's cache: every run sees what a fresh machine sees.
Only the persistent XLA compilation cache is shared with the user's (it holds compiled programs, keyed
by their HLO, never results), because recompiling every program would double the suite's wall time.
Subprocesses started by tests inherit both variables.

Two workers. pytest.ini runs the suite in 2 pytest-xdist worker processes, one test file at a time each
(`--dist loadfile`: a file's module fixtures are made once). Much of a test's time is single-threaded
(tracing, XLA compilation, Python around the model, subprocess start-up), so two workers on two cores
finish sooner than one. The workers share the session's searchjax cache (made by the controlling process;
every cache entry is written to a temporary sibling and renamed into place, so concurrent builders are
safe) and the compilation cache. Files holding a test marked `heavy` are handed out first, most heavy tests
first, so the two workers do not end with one long file running alone. `-n 0` runs everything in one
process.
"""

import atexit
import os
import pathlib
import shutil
import tempfile


SESSION_CACHE_VAR = "SEARCHJAX_TEST_SESSION_CACHE"  # set by the controlling pytest process for its workers


def _isolate_searchjax_cache() -> None:
    inherited = os.environ.get(SESSION_CACHE_VAR)
    if inherited and os.environ.get("PYTEST_XDIST_WORKER") and os.path.isdir(inherited):
        os.environ["SEARCHJAX_CACHE"] = inherited  # an xdist worker: the controller made it and removes it
        return
    user_cache = pathlib.Path(os.environ.get("SEARCHJAX_CACHE", pathlib.Path.home() / ".cache" / "searchjax"))
    os.environ.setdefault("SEARCHJAX_COMPILATION_CACHE", str(user_cache / "jax"))
    session_cache = tempfile.mkdtemp(prefix="searchjax-test-cache-")
    os.environ["SEARCHJAX_CACHE"] = os.environ[SESSION_CACHE_VAR] = session_cache
    atexit.register(shutil.rmtree, session_cache, ignore_errors=True)


_isolate_searchjax_cache()

# LLVM at -O1 for the suite's programs (XLA:CPU's default is 3): the suite is bound by compiling ~2,500
# distinct programs, mostly small, and LLVM's passes and code generation are half of each compile (perf).
# Numerics are the same (no fast-math at any level); the heavy products are library GEMMs that LLVM does not
# generate. Measured alone, empty caches: a tiny model's update compiles in 4.4 s instead of 5.7; the main job
# test takes 143 s of CPU instead of 159; encoding 2,066 passages took the same time. Outside the suite
# (benchmarks, a user's runs) XLA's default stands.
_SUITE_XLA_FLAGS = ["--xla_force_host_platform_device_count=8"]
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    _SUITE_XLA_FLAGS.append("--xla_backend_optimization_level=1")
os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *_SUITE_XLA_FLAGS]).strip()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# JAX on the CPU, launcher subprocesses too (libtpu, the tpu extra, stays idle); SEARCHJAX_TEST_PLATFORMS=cuda,cpu
# runs chosen files' JAX on a GPU instead (docs/performance.md, "On a GPU": files whose meshes want 8 devices fail).
TEST_PLATFORMS = os.environ.get("SEARCHJAX_TEST_PLATFORMS", "cpu")
if TEST_PLATFORMS == "cpu":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
else:
    os.environ["JAX_PLATFORMS"] = TEST_PLATFORMS
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402  (after XLA_FLAGS)
import pytest  # noqa: E402

from searchjax import runtime  # noqa: E402
from searchjax.data import assets  # noqa: E402

jax.config.update("jax_platforms", TEST_PLATFORMS)
if TEST_PLATFORMS != "cpu":
    # The parity tests compare float32 maths with float32 references; a GPU multiplies float32 in TF32 (10-bit
    # mantissa) at JAX's default precision, a TPU in bf16 passes.
    jax.config.update("jax_default_matmul_precision", "highest")
runtime.enable_compilation_cache()


def pytest_collection_modifyitems(config, items):
    """Files with the most `heavy` tests first (ties and the rest keep their order): xdist's loadfile scheduler
    hands files out in this order (pytest.ini turns its own reordering, by test count, off)."""
    heavy = {}
    for item in items:
        heavy[item.path] = heavy.get(item.path, 0) + (item.get_closest_marker("heavy") is not None)
    order = {path: rank for rank, path in enumerate(heavy)}
    items.sort(key=lambda item: (-heavy[item.path], order[item.path]))


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_programs():
    """Drop JAX's in-memory compiled programs after each test module.

    Why: each worker runs many test files in one process, and every loaded XLA:CPU executable keeps its JIT-linked code
    mapped. Two fresh-clone runs of the suite crashed at the same point (94 %, a persistent-cache load inside
    tests/trainer/test_trainer_resume.py) while that test passes alone: the suspected cause is the process's
    accumulated executables (memory maps near vm.max_map_count = 65,530). Programs a later module needs
    again come back from the persistent compilation cache."""
    yield
    import gc
    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="session")
def smollm2_gguf_path():
    return assets.smollm2_gguf()


@pytest.fixture(scope="session")
def minilm_dir():
    return assets.minilm_dir()


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf_path):
    """(model, params, tokenizer): SmolLM2-135M-Instruct real weights from the GGUF, float32."""
    from searchjax.models import load_pretrained
    from searchjax.tokenization import load_tokenizer
    model, params = load_pretrained(smollm2_gguf_path, dtype="float32")
    return model, params, load_tokenizer(smollm2_gguf_path)

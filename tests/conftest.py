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
"""

import atexit
import os
import pathlib
import shutil
import tempfile


def _isolate_searchjax_cache() -> None:
    user_cache = pathlib.Path(os.environ.get("SEARCHJAX_CACHE", pathlib.Path.home() / ".cache" / "searchjax"))
    os.environ.setdefault("SEARCHJAX_COMPILATION_CACHE", str(user_cache / "jax"))
    session_cache = tempfile.mkdtemp(prefix="searchjax-test-cache-")
    os.environ["SEARCHJAX_CACHE"] = session_cache
    atexit.register(shutil.rmtree, session_cache, ignore_errors=True)


_isolate_searchjax_cache()

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # launcher subprocesses too: libtpu (the tpu extra) stays idle
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402  (after XLA_FLAGS)
import pytest  # noqa: E402

from searchjax import runtime  # noqa: E402
from searchjax.data import assets  # noqa: E402

jax.config.update("jax_platforms", "cpu")
runtime.enable_compilation_cache()


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_programs():
    """Drop JAX's in-memory compiled programs after each test module.

    Why: the whole suite runs in one process, and every loaded XLA:CPU executable keeps its JIT-linked code
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

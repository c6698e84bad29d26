"""Session setup shared by every test.

XLA_FLAGS must be set before jax is imported anywhere: 8 simulated CPU devices let the mesh tests
run data x fsdp x tensor = 2 x 2 x 2 on one machine. Expensive assets are session fixtures, loaded
once. No test downloads anything: hubs are unreachable, so HF_HUB_OFFLINE is forced.
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402  (after XLA_FLAGS)
import pytest  # noqa: E402

from searchjax import runtime  # noqa: E402
from searchjax.data import assets  # noqa: E402

jax.config.update("jax_platforms", "cpu")
runtime.enable_compilation_cache()


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

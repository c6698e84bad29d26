"""Text encoders against sentence-transformers / transformers, and the length-bucket planner."""

import dataclasses
import json
import shutil

import numpy as np
import pytest

from searchjax.models.embedding import length_bucket, plan_batches
from searchjax.models.encoder import EncoderConfig, load_encoder


def _cosine_rows(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


# 1 - cosine to sentence-transformers' float32 embeddings, at most. bfloat16 products round each operand to 8
# significant bits (relative error 2^-9) and accumulate in float32; the embedding's error is then a few 1e-3 of
# its length, mostly orthogonal to it, so 1 - cos ~ |error|^2 / 2 stays near 1e-5 (measured up to 5e-5 on random
# tokens): 5e-4 allows an error of 3 % of the length. float32 differs only in summation order.
COSINE_GAP = {"float32": 1e-5, "bfloat16": 5e-4}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_minilm_matches_sentence_transformers(minilm, minilm_dir, corpus, dtype):
    from searchjax.runtime import host_compute_dtype
    from sentence_transformers import SentenceTransformer
    # the session's encoder is the default one ("auto": the host's dtype); the other dtype is loaded here
    assert minilm.describe()["dtype"] == minilm.config.dtype == host_compute_dtype()
    assert minilm.config.attention_impl == "native"   # JAX runs on the CPU here
    encoder = minilm if minilm.config.dtype == dtype else load_encoder(minilm_dir, preset="all-minilm-l6-v2",
                                                                        dtype=dtype)
    # the products' kernels are stored in their dtype (cast once, at load), the rest in float32
    layer = encoder.params["layer_0"]
    assert layer["ffn_in"]["kernel"].dtype == np.dtype(dtype) and layer["ffn_in"]["bias"].dtype == np.float32
    assert encoder.params["word_embeddings"]["embedding"].dtype == np.float32
    passages = [p.contents for p in corpus[::100][:100]]          # 100 passages spread over the corpus
    queries = ["who painted the mona lisa", "What is the height of K2?", "capital of australia"]
    reference = SentenceTransformer(str(minilm_dir), device="cpu")
    ref_p = reference.encode(passages, batch_size=32, convert_to_numpy=True)
    ref_q = reference.encode(queries, convert_to_numpy=True)
    ours_p = encoder.encode(passages)
    ours_q = encoder.encode(queries, is_query=True)
    assert ours_p.shape == (100, 384) and ours_p.dtype == np.float32
    assert _cosine_rows(ours_p, ref_p).min() >= 1 - COSINE_GAP[dtype]
    assert _cosine_rows(ours_q, ref_q).min() >= 1 - COSINE_GAP[dtype]
    np.testing.assert_allclose(np.linalg.norm(ours_p, axis=1), 1.0, atol=1e-5)
    # each query's nearest passages are the reference's (no near-ties among the top 3 here)
    assert [list(np.argsort(-(ref_p @ q))[:3]) for q in ref_q] == [list(np.argsort(-(ours_p @ q))[:3]) for q in ours_q]


def test_encoder_dtype_is_checked_before_loading(minilm_dir):
    with pytest.raises(ValueError, match="EncoderConfig.dtype must be .* got 'fp8'"):
        load_encoder(minilm_dir, preset="all-minilm-l6-v2", dtype="fp8")
    with pytest.raises(ValueError, match="EncoderConfig.attention_impl must be None or 'native', got 'flash'"):
        EncoderConfig("x", attention_impl="flash")


def test_gelu_is_torch_exact_gelu():
    """The encoder's GELU (the erf form, `encoder._gelu`) against torch's exact GELU and scipy's erfc in float64."""
    import scipy.special
    import torch
    from searchjax.models.encoder import _gelu
    x = np.concatenate([np.linspace(-12, 12, 4001), np.random.default_rng(0).standard_normal(4000) * 3])
    x = x.astype(np.float32)
    exact = 0.5 * x.astype(np.float64) * scipy.special.erfc(-x.astype(np.float64) / np.sqrt(2))
    ours = np.asarray(_gelu(x), np.float64)
    theirs = torch.nn.functional.gelu(torch.from_numpy(x)).double().numpy()
    # float32 rounding of x (1 + erf) / 2: a few ulps of the output, ~1e-6 at |x| ~ 12
    np.testing.assert_allclose(ours, exact, rtol=1e-6, atol=2e-6)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=2e-6)


def test_native_attention_matches_the_einsums_and_an_exact_reference(monkeypatch):
    """The encoder's attention through the CPU kernel (`native.block_attention` with every slot before every query)
    against its einsum form and float64 numpy, in bfloat16, with padded keys and a row without a real token. The
    kernel runs for long buckets only; its AMX gate is lifted here so any CPU runs it (vdpbf16ps or its f32 form
    where the build lacks AMX)."""
    import jax
    import jax.numpy as jnp
    from searchjax.models import encoder, native
    monkeypatch.setattr(native, "amx_tiles", lambda: True)
    heads, d, t = 12, 32, encoder.NATIVE_ATTENTION_MIN_TOKENS
    einsums = EncoderConfig("x", dtype="bfloat16")
    kernel = dataclasses.replace(einsums, attention_impl="native")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((3, t, heads * d)).astype(np.float32) * scale for scale in (0.4, 0.4, 1.0))
    mask = np.arange(t)[None] < np.array([t, 100, 0])[:, None]   # full, padded, no real token

    def attend(config):
        return jax.jit(lambda *a: encoder._attention(*a, config))(q, k, v, mask)
    hlo = jax.jit(lambda *a: encoder._attention(*a, kernel)).lower(q, k, v, mask).as_text()
    assert native.BLOCK_ATTENTION_TARGET in hlo
    short = jax.jit(lambda *a: encoder._attention(*a, kernel)).lower(*(x[:, :t - 8] for x in (q, k, v, mask)))
    assert native.BLOCK_ATTENTION_TARGET not in short.as_text()   # below the threshold: the einsums
    # float64 reference. A row without a real token (never made by `embedding.embed_batched`, which gives padding
    # rows one) attends to all its slots through the kernel, not to NaN; the einsums' equal logits weigh them
    # uniformly instead, so that row is compared with the reference only.
    rounded = [np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64).reshape(3, t, heads, d) for x in (q, k, v)]
    logits = np.einsum("bthd,bshd->bhts", rounded[0], rounded[1]) / np.sqrt(d)
    logits = np.where(mask[:, None, None, :] | ~mask.any(1)[:, None, None, None], logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    reference = np.einsum("bhts,bshd->bthd", probs / probs.sum(-1, keepdims=True), rounded[2]).reshape(3, t, -1)
    ours, theirs = np.asarray(attend(kernel)), np.asarray(attend(einsums))
    # The kernel rounds the probabilities and its output to bf16 (2^-9 relative each): an output, a convex
    # combination of values of size ~3 at most, stays within ~2 x 3 x 2^-9 = 0.012 of exact (1.3e-3 measured).
    assert np.abs(ours - reference).max() < 0.012
    assert np.abs(ours[:2] - theirs[:2]).max() < 0.012 and np.abs(theirs[:2] - reference[:2]).max() < 0.012
    assert np.abs(ours - reference).mean() < 1e-3   # most outputs far closer than the bound


def test_plan_batches_covers_every_index_with_power_of_two_buckets():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 300, size=203)
    plans = plan_batches(lengths, batch_size=32, max_length=256)
    seen = np.concatenate([idx for idx, _, _ in plans])
    assert sorted(seen.tolist()) == list(range(203))
    for idx, padded_length, rows in plans:
        assert padded_length in (16, 32, 64, 128, 256)
        assert padded_length >= min(lengths[idx].max(), 256)
        assert rows >= len(idx) and rows & (rows - 1) == 0 and rows <= 32
    assert [length_bucket(n, 2) for n in (1, 17, 25, 33, 49, 100, 129)] == [16, 24, 32, 48, 64, 128, 192]
    assert [length_bucket(n, 4) for n in (1, 17, 21, 25, 29, 33, 41, 100, 129, 200)] == [
        16, 20, 24, 28, 32, 40, 48, 112, 160, 224]   # quarter steps: 2^k (1 + j/4), the encoder's default
    capped = plan_batches(lengths, batch_size=64, max_length=256, steps_per_octave=2, max_batch_tokens=1024)
    assert sorted(np.concatenate([idx for idx, _, _ in capped]).tolist()) == list(range(203))
    for idx, padded_length, rows in capped:
        assert rows * padded_length <= 1024 and rows >= len(idx) and padded_length >= min(lengths[idx].max(), 256)
    assert {(len(idx), n) for idx, n, _ in capped if n == 256} == {(4, 256)}   # 1024 tokens / 256 = 4 rows


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory, minilm_dir):
    """A 2-layer random-weight BERT saved by transformers, with MiniLM's tokenizer files."""
    import torch
    import transformers
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=512)
    torch.manual_seed(0)
    model = transformers.BertModel(config, add_pooling_layer=True).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():     # every tensor random, so a dropped bias or a swapped norm shows
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.3 * noise if "LayerNorm.weight" in name else 0.3 * noise)
    directory = tmp_path_factory.mktemp("tiny-bert")
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm_dir / name, directory / name)
    return directory, model


@pytest.mark.parametrize("preset", ["e5-small-v2", "bge-small-en-v1.5"])
def test_e5_and_bge_conventions_against_transformers(tiny_bert_dir, preset):
    """E5: mean pooling with "query: " / "passage: "; BGE: [CLS] pooling with its query instruction."""
    import torch
    import transformers
    directory, model = tiny_bert_dir
    encoder = load_encoder(directory, preset=preset, batch_size=4, dtype="float32")  # parity at 1e-4: float32
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    query_prefix = {"e5-small-v2": "query: ", "bge-small-en-v1.5":
                    "Represent this sentence for searching relevant passages: "}[preset]
    passage_prefix = {"e5-small-v2": "passage: ", "bge-small-en-v1.5": ""}[preset]
    texts = ["who wrote hamlet", "The Eiffel Tower is a wrought-iron lattice tower in Paris.", "a b c d e f g"]

    def reference(strings):
        batch = tokenizer(strings, padding=True, truncation=True, max_length=512, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state
        if preset.startswith("bge"):
            pooled = hidden[:, 0]
        else:
            m = batch["attention_mask"][..., None].float()
            pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1).numpy()

    np.testing.assert_allclose(encoder.encode(texts, is_query=True), reference([query_prefix + t for t in texts]),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(encoder.encode(texts), reference([passage_prefix + t for t in texts]),
                               rtol=1e-4, atol=1e-4)


def test_checkpoint_that_does_not_match_config_is_refused(tiny_bert_dir, tmp_path):
    from searchjax.models.checkpoint_io import CheckpointError
    directory, _ = tiny_bert_dir
    broken = tmp_path / "broken"
    shutil.copytree(directory, broken)
    config = json.loads((broken / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="left unset.*layer_2"):
        load_encoder(broken, preset="e5-small-v2")
    config["num_hidden_layers"], config["intermediate_size"] = 2, 48
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"intermediate\.dense\.(weight|bias).*has shape"):
        load_encoder(broken, preset="e5-small-v2")

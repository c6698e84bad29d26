"""Decoder embedder (Qwen3-Embedding style) against transformers on a tiny random-weight Qwen3."""

import dataclasses

import numpy as np
import pytest

TEXTS = ["who wrote hamlet ?", "The Eiffel Tower is a wrought-iron lattice tower in Paris .",
         "capital of australia", "a b c d e f g h i j k l m n o p q r s t u v w x y z , repeated a b c d e f"]
TASK = "Given a web search query , retrieve relevant passages that answer the query"


@pytest.fixture(scope="module")
def tiny_qwen3_embedder_dir(tmp_path_factory):
    """A 2-layer random Qwen3 saved by transformers, with a byte-level BPE trained on the test texts."""
    import torch
    import transformers
    from tiny_bpe import tiny_bpe
    hf_tokenizer = tiny_bpe(TEXTS + [f"Instruct: {TASK}\nQuery:"], vocab_size=300)
    config = transformers.Qwen3Config(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                      max_position_embeddings=128, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    assert len(hf_tokenizer) <= config.vocab_size
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                          dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.3 * noise if "norm" in name else 0.2 * noise)
    directory = tmp_path_factory.mktemp("tiny-qwen3-embedder")
    model.save_pretrained(directory)
    hf_tokenizer.save_pretrained(directory)
    return directory, model, hf_tokenizer


def test_last_token_pooling_matches_transformers(tiny_qwen3_embedder_dir):
    import torch
    from searchjax.models.decoder_embedder import load_decoder_embedder
    directory, model, hf_tokenizer = tiny_qwen3_embedder_dir
    embedder = load_decoder_embedder(directory, name="tiny-qwen3-embedding", task=TASK, max_length=128, batch_size=4)
    eos = hf_tokenizer.convert_tokens_to_ids("<|endoftext|>")

    def reference(strings, keep=None):
        rows = []
        for s in strings:      # one unpadded sequence at a time: the last position is the appended <|endoftext|>
            ids = hf_tokenizer(s, add_special_tokens=False)["input_ids"][:keep] + [eos]
            with torch.no_grad():
                hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
            rows.append(torch.nn.functional.normalize(hidden, dim=-1).numpy())
        return np.stack(rows)

    queries = embedder.encode(TEXTS, is_query=True)
    passages = embedder.encode(TEXTS)
    np.testing.assert_allclose(queries, reference([f"Instruct: {TASK}\nQuery:{t}" for t in TEXTS]), atol=1e-4)
    np.testing.assert_allclose(passages, reference(TEXTS), atol=1e-4)
    assert embedder.describe()["pooling"] == "last" and queries.shape == (len(TEXTS), 32)
    # Truncation keeps the first max_length - 1 tokens and still ends in <|endoftext|>.
    short = dataclasses.replace(embedder, max_length=16)
    np.testing.assert_allclose(short.encode(TEXTS), reference(TEXTS, keep=15), atol=1e-4)

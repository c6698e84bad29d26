"""Tokenizer wrapper against transformers: the GGUF-built tokenizer, an HF directory, and a sentencepiece-style
byte-fallback tokenizer for token_bytes."""

import json

import pytest

from searchjax.tokenization import Tokenizer, load_tokenizer

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "  Leading spaces, tabs\tand\nnewlines\n\n  survive round trips.",
    "Unicode: café, naïve, Zürich, 東京, Ελληνικά, emoji 🙂👍🏽 and math ∑ x² ≤ 3.",
    "Numbers 1234567 and 3.14159; code: def f(x): return x**2  # comment",
    "<|im_start|>user\nHi there<|im_end|>\n",
]


def test_encode_decode_match_transformers(smollm2, smollm2_hf_tokenizer):
    _, _, tokenizer = smollm2
    for text in SENTENCES:
        ids = tokenizer.encode(text)
        assert ids == smollm2_hf_tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == smollm2_hf_tokenizer.decode(ids) == text
        assert tokenizer.decode(ids, skip_special_tokens=True) == smollm2_hf_tokenizer.decode(
            ids, skip_special_tokens=True)


def test_token_bytes_concatenate_to_the_utf8_text(smollm2):
    """token_bytes is exact per token, including tokens that hold only part of a multi-byte character."""
    _, _, tokenizer = smollm2
    for text in SENTENCES:
        ids = tokenizer.encode(text)
        assert b"".join(tokenizer.token_bytes(i) for i in ids) == text.encode("utf-8")
    partial = [i for i in tokenizer.encode("🙂") if not tokenizer.token_bytes(i).decode("utf-8", "ignore")]
    assert partial, "expected the emoji to be split into byte tokens"
    assert tokenizer.token_bytes(tokenizer.eos_token_ids[0]) == b"<|im_end|>"
    assert tokenizer.token_bytes(tokenizer.vocab_size + 5) == b""


def test_chat_template_and_special_ids_match_transformers(smollm2, smollm2_hf_tokenizer):
    _, _, tokenizer = smollm2
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Capital of Peru?"},
                {"role": "assistant", "content": "Lima."}, {"role": "user", "content": "And of Chile?"}]
    for add_generation_prompt in (True, False):
        assert tokenizer.apply_chat_template(messages, add_generation_prompt) == (
            smollm2_hf_tokenizer.apply_chat_template(messages, tokenize=False,
                                                     add_generation_prompt=add_generation_prompt))
    rendered = tokenizer.apply_chat_template(messages[1:2])
    assert rendered.endswith("<|im_start|>assistant\n")
    assert tokenizer.eos_token_ids == (smollm2_hf_tokenizer.eos_token_id,)
    assert tokenizer.pad_token_id == smollm2_hf_tokenizer.pad_token_id
    assert tokenizer.vocab_size == len(smollm2_hf_tokenizer) == 49152


def test_hf_directory_with_generation_config_eos(smollm2_hf_tokenizer, tmp_path):
    smollm2_hf_tokenizer.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.eos_token_ids == (2, 0)
    assert tokenizer.encode(SENTENCES[2]) == smollm2_hf_tokenizer.encode(SENTENCES[2], add_special_tokens=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty: no tokenizer.json"):
        load_tokenizer(tmp_path / "empty")


def test_sentencepiece_style_token_bytes():
    """'\u2581' pieces are spaces and <0xNN> pieces raw bytes (Llama 2 / Mistral byte fallback)."""
    from tokenizers import Tokenizer as RawTokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in ["\u2581", "h", "i", "\u2581h", "\u2581hi", "t", "\u2581t", "e", "\u2581te"]:
        vocab[piece] = len(vocab)
    merges = [("\u2581", "h"), ("\u2581h", "i"), ("\u2581", "t"), ("\u2581t", "e")]
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    raw.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    raw.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>", unk_token="<unk>", bos_token="<s>")
    tokenizer = Tokenizer(hf, source="in-memory sentencepiece-style tokenizer")
    text = "hi té hi"
    ids = tokenizer.encode(text)
    assert any(hf.convert_ids_to_tokens(i).startswith("<0x") for i in ids)  # é went through byte fallback
    assert tokenizer.decode(ids) == text
    # Decoding strips the one leading space the normaliser prepended; mid-sequence bytes are exact.
    assert b"".join(tokenizer.token_bytes(i) for i in ids) == b" " + text.encode("utf-8")
    assert tokenizer.token_bytes(2) == b"</s>"

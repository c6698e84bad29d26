"""Fixtures for the EviBack tests: a tiny random HF model with a chat-template tokenizer (the local judge's
reference is transformers + torch on the same weights). The scripted Teacher lives in eviback_scripts.py."""

import pytest
from tiny_bpe import tiny_bpe

TINY_VOCAB = 384
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
TOKENIZER_TEXT = [
    'Reply with only one of these JSON objects: {"verdict": "Supported"} or {"verdict": "Ambiguous"} or '
    '{"verdict": "Insufficient"}',
    "Question: Who wrote Hamlet? Retrieved documents: Doc 1(Title: Hamlet) Hamlet is a tragedy by Shakespeare.",
    "The capital of France is Paris. Paris is on the Seine. Lyon is a city in France.",
    "You are an evidence auditor. Judge whether the documents answer the question.",
]


@pytest.fixture(scope="session")
def tiny_judge_model(tmp_path_factory):
    """(our model, our params, our tokenizer, transformers reference model): a random Qwen3, vocab 384."""
    import torch
    import transformers
    from searchjax.models import load_pretrained
    from searchjax.tokenization import load_tokenizer
    config = transformers.Qwen3Config(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                              dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # every tensor random, scale large enough that options score clearly apart
        for name, p in reference.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1.0 + 0.3 * noise if "norm" in name else 0.25 * noise)
    directory = tmp_path_factory.mktemp("tiny-judge")
    reference.save_pretrained(str(directory))
    tiny_bpe(TOKENIZER_TEXT, vocab_size=TINY_VOCAB, chat_template=CHAT_TEMPLATE).save_pretrained(str(directory))
    model, params = load_pretrained(directory, dtype="float32")
    return model, params, load_tokenizer(directory), reference

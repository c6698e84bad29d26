"""Fixtures for the scoring tests: tiny random HF checkpoints (transformers + torch) and a tiny tokenizer.

Each tiny model is built by transformers from an in-code config, every tensor randomised (norm weights
and biases too, so a dropped bias or a wrong norm would show), saved with `save_pretrained`, then
loaded by our `load_pretrained`. The torch model is the reference.
"""

import pytest

TINY_VOCAB = 320
TOKENIZER_TEXT = [
    "The capital of France is Paris. Paris is on the Seine.",
    "Question: Who wrote Hamlet? Answer: William Shakespeare",
    "Marie Curie won the Nobel Prize in Physics and in Chemistry.",
    "The Amazon river flows through Brazil, Peru and Colombia.",
]


def _hf_config(arch: str):
    import transformers
    common = dict(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
                  bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if arch == "qwen3":  # q/k norm, head_dim != hidden / heads, untied
        return transformers.Qwen3Config(head_dim=24, tie_word_embeddings=False, **common)
    if arch == "qwen2":  # q/k/v bias, tied
        return transformers.Qwen2Config(tie_word_embeddings=True, **common)
    if arch == "llama":  # tied, plain
        return transformers.LlamaConfig(tie_word_embeddings=True, **common)
    raise ValueError(arch)


def _tiny_tokenizer(directory):
    """A byte-level BPE tokenizer trained on a few sentences (vocabulary < TINY_VOCAB), saved in HF format."""
    from tiny_bpe import tiny_bpe
    tiny_bpe(TOKENIZER_TEXT, vocab_size=TINY_VOCAB).save_pretrained(str(directory))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """tiny_model(arch) -> (model, params, torch_model, checkpoint_dir), built once per arch."""
    cache = {}

    def build(arch: str):
        if arch not in cache:
            import torch
            import transformers
            from searchjax.models import load_pretrained
            torch.manual_seed({"qwen3": 0, "qwen2": 1, "llama": 2}[arch])
            reference = transformers.AutoModelForCausalLM.from_config(_hf_config(arch), attn_implementation="eager")
            with torch.no_grad():
                for name, p in reference.named_parameters():
                    if name.endswith("norm.weight"):
                        p.copy_(1.0 + 0.2 * torch.randn_like(p))
                    elif name.endswith("bias"):
                        p.copy_(0.2 * torch.randn_like(p))
                    else:
                        p.copy_(0.15 * torch.randn_like(p))
            reference.eval()
            directory = tmp_path_factory.mktemp(f"tiny-{arch}")
            reference.save_pretrained(str(directory))
            _tiny_tokenizer(directory)
            model, params = load_pretrained(directory, dtype="float32")
            cache[arch] = (model, params, reference, directory)
        return cache[arch]
    return build


@pytest.fixture(scope="session")
def smollm2_torch(smollm2_gguf_path):
    """transformers' own GGUF loader on the same SmolLM2 file: the reference for the real-weights tests."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_gguf_path.parent), gguf_file=smollm2_gguf_path.name,
                                                 dtype=torch.float32, attn_implementation="eager")
    return model.eval()


@pytest.fixture(scope="session")
def torch_logprobs():
    """torch_logprobs(reference, ids, temperature=1.0) -> [len(ids) - 1] float64 reference log-probs."""
    return _torch_row_logprobs


def _torch_row_logprobs(reference, ids, temperature=1.0):
    """Reference log p(x_t | x_<t) for one unpadded row: transformers logits, torch log_softmax (float32)."""
    import numpy as np
    import torch
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor([list(ids)])).logits[0].float()
        logp = torch.log_softmax(logits / temperature, dim=-1)[:-1]
        return logp.gather(-1, torch.tensor(list(ids[1:]))[:, None])[:, 0].numpy().astype(np.float64)

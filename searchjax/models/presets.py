"""Named model shapes. Numbers are those of each model's Hugging Face config.json (cited per entry); loading a
checkpoint with `load_pretrained` reads its own config.json, so presets serve abstract shapes, sharding plans,
benchmarks and random-weight tests. Base and instruct variants share shapes unless noted.
"""

from __future__ import annotations

from searchjax.models.transformer import ModelConfig

_LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}


def _qwen3(**kw) -> ModelConfig:
    # Common Qwen3 fields: vocab 151936, head_dim 128, 8 kv heads, rope_theta 1e6, rms_norm_eps 1e-6,
    # max_position_embeddings 40960, bos 151643, eos 151645 (<|im_end|>).
    base = dict(architecture="qwen3", vocab_size=151936, head_dim=128, num_kv_heads=8, rope_theta=1_000_000.0,
                rms_norm_eps=1e-6, qk_norm=True, max_position_embeddings=40960, bos_token_id=151643,
                eos_token_ids=(151645,), pad_token_id=151643)
    return ModelConfig(**{**base, **kw})


def _qwen25(**kw) -> ModelConfig:
    # Common Qwen2.5 fields: rope_theta 1e6, rms_norm_eps 1e-6, qkv bias, bos 151643; instruct eos 151645.
    base = dict(architecture="qwen2", vocab_size=151936, rope_theta=1_000_000.0, rms_norm_eps=1e-6, qkv_bias=True,
                max_position_embeddings=32768, bos_token_id=151643, eos_token_ids=(151645, 151643),
                pad_token_id=151643)
    return ModelConfig(**{**base, **kw})


_PRESETS = {
    # huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json
    "qwen3-0.6b": lambda: _qwen3(hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
                                 tie_embeddings=True),
    # huggingface.co/Qwen/Qwen3-1.7B/blob/main/config.json
    "qwen3-1.7b": lambda: _qwen3(hidden_size=2048, intermediate_size=6144, num_layers=28, num_heads=16,
                                 tie_embeddings=True),
    # huggingface.co/Qwen/Qwen3-4B/blob/main/config.json
    "qwen3-4b": lambda: _qwen3(hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32,
                               tie_embeddings=True),
    # huggingface.co/Qwen/Qwen3-4B-Instruct-2507/blob/main/config.json: 256K context, rope_theta 5e6
    "qwen3-4b-instruct-2507": lambda: _qwen3(hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32,
                                             tie_embeddings=True, rope_theta=5_000_000.0,
                                             max_position_embeddings=262144),
    # huggingface.co/Qwen/Qwen3-8B/blob/main/config.json
    "qwen3-8b": lambda: _qwen3(hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32,
                               tie_embeddings=False),
    # huggingface.co/Qwen/Qwen3-32B/blob/main/config.json
    "qwen3-32b": lambda: _qwen3(hidden_size=5120, intermediate_size=25600, num_layers=64, num_heads=64,
                                tie_embeddings=False),
    # huggingface.co/Qwen/Qwen2.5-3B-Instruct/blob/main/config.json (tied)
    "qwen2.5-3b": lambda: _qwen25(hidden_size=2048, intermediate_size=11008, num_layers=36, num_heads=16,
                                  num_kv_heads=2, head_dim=128, tie_embeddings=True),
    # huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json (vocab 152064, untied; the base model's
    # max_position_embeddings is 131072)
    "qwen2.5-7b": lambda: _qwen25(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
                                  num_heads=28, num_kv_heads=4, head_dim=128, tie_embeddings=False),
    # huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/config.json
    "llama3.1-8b": lambda: ModelConfig(architecture="llama", vocab_size=128256, hidden_size=4096,
                                       intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8,
                                       head_dim=128, rope_theta=500_000.0, rope_scaling=_LLAMA31_ROPE,
                                       rms_norm_eps=1e-5, max_position_embeddings=131072, bos_token_id=128000,
                                       eos_token_ids=(128001, 128008, 128009)),
    # huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct/blob/main/config.json (= the GGUF's llama.* metadata)
    "smollm2-135m": lambda: ModelConfig(architecture="llama", vocab_size=49152, hidden_size=576,
                                        intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
                                        head_dim=64, rope_theta=100_000.0, rms_norm_eps=1e-5,
                                        tie_embeddings=True, max_position_embeddings=8192, bos_token_id=1,
                                        eos_token_ids=(2,), pad_token_id=2),
    # Tiny random-weight test shapes, one per architecture switch.
    # head_dim 16 != hidden / heads = 8, untied, q/k norm.
    "tiny-qwen3": lambda: ModelConfig(architecture="qwen3", vocab_size=256, hidden_size=32, intermediate_size=64,
                                      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                                      rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=False,
                                      max_position_embeddings=128, bos_token_id=1, eos_token_ids=(2,),
                                      pad_token_id=0),
    # q/k/v bias, tied embeddings.
    "tiny-qwen2": lambda: ModelConfig(architecture="qwen2", vocab_size=256, hidden_size=32, intermediate_size=64,
                                      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                                      rope_theta=1_000_000.0, qkv_bias=True, tie_embeddings=True,
                                      max_position_embeddings=128, bos_token_id=1, eos_token_ids=(2,),
                                      pad_token_id=0),
    # llama3 rope scaling with a short original context so every frequency band (low, medium, high) occurs.
    "tiny-llama": lambda: ModelConfig(architecture="llama", vocab_size=256, hidden_size=32, intermediate_size=64,
                                      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10_000.0,
                                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 64},
                                      rms_norm_eps=1e-5, tie_embeddings=False, max_position_embeddings=512,
                                      bos_token_id=1, eos_token_ids=(2,), pad_token_id=0),
}

PRESET_NAMES = tuple(_PRESETS)


def get_preset(name: str, **overrides) -> ModelConfig:
    """The named ModelConfig, with field overrides (e.g. dtype="bfloat16", remat_policy="full")."""
    if name not in _PRESETS:
        raise KeyError(f"unknown model preset {name!r}; available: {', '.join(PRESET_NAMES)}")
    config = _PRESETS[name]()
    return config.replace(**overrides) if overrides else config

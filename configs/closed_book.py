"""Closed-book QA with the embedded-default policy: SmolLM2-135M-Instruct answers from its weights alone.

Purpose: the smallest end-to-end run of the model stack (GGUF import -> tokenizer + chat template -> jitted
prefill and KV-cache greedy decode). Expected result: short, mostly fluent answers; a 135M model gets the easy
ones ("Paris") right and invents the rest. Run time: about a minute on 2 CPU cores, most of it compilation
(cached for reruns).

  python -m launch.closed_book                                       # this config
  python -m launch.closed_book --config=configs/closed_book.py:local  # 2 questions, 16 tokens: a smoke run
  python -m launch.closed_book --config.model_path=/ckpt/Qwen3-0.6B --config.dtype=bfloat16
"""

import ml_collections


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.model_path = ""  # HF directory or .gguf file; "" = the embedded default, assets.smollm2_gguf()
    config.dtype = "float32"  # compute dtype ("float32" | "bfloat16"); parameters are stored in the same dtype
    config.max_new_tokens = 48  # greedy tokens generated per question (generation also stops at eos)
    config.system_prompt = ""  # "" = the chat template's default system message
    config.questions = [  # answered closed-book, one chat turn each
        "What is the capital of France?",
        "Who wrote the play Romeo and Juliet?",
        "What is the largest planet in the Solar System?",
        "In which year did the Second World War end?",
        "What is the chemical symbol for gold?",
    ]
    if variant == "local":
        config.questions = config.questions[:2]
        config.max_new_tokens = 16
    elif variant:
        raise ValueError(f"unknown closed_book config variant {variant!r}; valid: '' or 'local'")
    return config

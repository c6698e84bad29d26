r"""Closed-book QA: load a checkpoint (default: SmolLM2-135M-Instruct from its GGUF), chat-template a few
questions and answer them greedily with `searchjax.generation.generate` (the KV-cache sampler the rollout uses).
Prints question -> answer.

  python -m launch.closed_book [--config=configs/closed_book.py[:local]] [--config.max_new_tokens=32]
"""

from __future__ import annotations

import pathlib
import time

from absl import app
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", str(pathlib.Path(__file__).resolve().parents[1] / "configs" / "closed_book.py"),
    "Closed-book QA config file.", lock_config=True)


def answer_closed_book(model, params, tokenizer, questions: list[str], *, max_new_tokens: int,
                       system_prompt: str = "") -> list[str]:
    """One chat turn per question, decoded greedily in one batch; the answers (special tokens dropped)."""
    from searchjax import generation
    prompts = []
    for question in questions:
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else [])
        messages.append({"role": "user", "content": question})
        prompts.append(tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True)))
    results = generation.generate(model, params, prompts, max_new_tokens=max_new_tokens, tokenizer=tokenizer)
    return [tokenizer.decode(r.token_ids, skip_special_tokens=True).strip() for r in results]


def main(argv):
    del argv
    from searchjax import runtime
    from searchjax.data import assets
    from searchjax.models import load_pretrained
    from searchjax.tokenization import load_tokenizer
    runtime.enable_compilation_cache()
    config = _CONFIG.value
    path = config.model_path or str(assets.smollm2_gguf())
    start = time.perf_counter()
    model, params = load_pretrained(path, dtype=config.dtype)
    tokenizer = load_tokenizer(path)
    print(f"loaded {path} ({model.config.architecture}, {model.config.num_layers} layers) "
          f"in {time.perf_counter() - start:.1f}s")
    start = time.perf_counter()
    answers = answer_closed_book(model, params, tokenizer, list(config.questions),
                                 max_new_tokens=config.max_new_tokens, system_prompt=config.system_prompt)
    for question, answer in zip(config.questions, answers):
        print(f"Q: {question}\nA: {answer}\n")
    print(f"answered {len(answers)} questions in {time.perf_counter() - start:.1f}s (greedy, KV cache)")


if __name__ == "__main__":
    app.run(main)

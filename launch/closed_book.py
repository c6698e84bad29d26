r"""Closed-book QA: load a checkpoint (default: SmolLM2-135M-Instruct from its GGUF), chat-template a few
questions and answer them with greedy decoding through the KV cache. Prints question -> answer.

  python -m launch.closed_book [--config=configs/closed_book.py[:local]] [--config.max_new_tokens=32]
"""

from __future__ import annotations

import functools
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from ml_collections import config_flags

from searchjax.models import init_cache, positions_from_mask

_CONFIG = config_flags.DEFINE_config_file(
    "config", str(pathlib.Path(__file__).resolve().parents[1] / "configs" / "closed_book.py"),
    "Closed-book QA config file.", lock_config=True)


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens"))
def _greedy_loop(model, params, prompt_ids, prompt_mask, eos_ids, pad_id, *, max_new_tokens: int):
    """Prefill the left-padded prompts [B, P] into a cache of P + max_new_tokens slots, then decode greedily.

    Static (recompiles): model, max_new_tokens, and the shapes of prompt_ids/eos_ids. Returns tokens [B, N] with
    pad_id after each row's first eos (the eos itself kept).
    """
    batch, prompt_len = prompt_ids.shape
    cache = init_cache(model.config, batch, prompt_len + max_new_tokens)
    positions = positions_from_mask(prompt_mask)
    logits, cache = model.apply({"params": params}, prompt_ids, positions, prompt_mask, cache)
    first = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    next_position = positions[:, -1] + 1

    def step(carry, _):
        token, position, done, cache = carry
        emitted = jnp.where(done, pad_id, token)
        done = done | jnp.isin(token, eos_ids)
        logits, cache = model.apply({"params": params}, token[:, None], position[:, None],
                                    jnp.ones((batch, 1), bool), cache)
        token = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
        return (token, position + 1, done, cache), emitted

    init = (first, next_position, jnp.zeros((batch,), bool), cache)
    _, tokens = jax.lax.scan(step, init, None, length=max_new_tokens)
    return tokens.T


def greedy_generate(model, params, prompts: list[list[int]], *, max_new_tokens: int, eos_ids, pad_id: int,
                    bucket: int = 64) -> list[list[int]]:
    """Greedy continuations (up to and including the first eos) of token-id prompts, batched with left padding."""
    length = -(-max(len(p) for p in prompts) // bucket) * bucket
    ids = np.full((len(prompts), length), pad_id, np.int32)
    mask = np.zeros((len(prompts), length), bool)
    for row, prompt in enumerate(prompts):
        ids[row, length - len(prompt):] = prompt
        mask[row, length - len(prompt):] = True
    tokens = np.asarray(_greedy_loop(model, params, jnp.asarray(ids), jnp.asarray(mask),
                                     jnp.asarray(eos_ids, jnp.int32), pad_id, max_new_tokens=max_new_tokens))
    out = []
    for row in tokens.tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in set(eos_ids)), len(row))
        out.append(row[:end])
    return out


def answer_closed_book(model, params, tokenizer, questions: list[str], *, max_new_tokens: int,
                       system_prompt: str = "", bucket: int = 64) -> list[str]:
    """One chat turn per question; the decoded answers (special tokens dropped)."""
    prompts = []
    for question in questions:
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else [])
        messages.append({"role": "user", "content": question})
        prompts.append(tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True)))
    completions = greedy_generate(model, params, prompts, max_new_tokens=max_new_tokens,
                                  eos_ids=tokenizer.eos_token_ids, pad_id=tokenizer.pad_token_id, bucket=bucket)
    return [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in completions]


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
                                 max_new_tokens=config.max_new_tokens, system_prompt=config.system_prompt,
                                 bucket=config.prompt_bucket)
    for question, answer in zip(config.questions, answers):
        print(f"Q: {question}\nA: {answer}\n")
    print(f"answered {len(answers)} questions in {time.perf_counter() - start:.1f}s (greedy, KV cache)")


if __name__ == "__main__":
    app.run(main)

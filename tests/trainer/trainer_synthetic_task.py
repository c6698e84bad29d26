"""A synthetic search task for the learning check: every answer is only in retrieved text.

World: 256 made-up entities ("bako", "mizu", ...), each with a colour drawn uniformly from COLOURS. The
corpus has one passage per entity, title = name, text = "<name> is <colour>." The question "What colour
is <name>?" carries no information about the colour, so a policy that does not read what it retrieved
scores 1 / len(COLOURS) = 1/8 in expectation, whatever it learns.

Tokenizer: a byte-level BPE trained here on the task's own text (the Search-R1 instruction, questions,
passages), with the protocol tags as added tokens and a ChatML template, saved in HF format and loaded
through `searchjax.tokenization.load_tokenizer`; every entity name and colour is a single token.

Demonstrations come from the real rollout (`searchjax.agent.rollout.rollout`) driven by a scripted
expert `logits_fn` (no model): search the entity named in the question, then answer the last colour
word in the sequence (the retrieved passage's); they are token-for-token what the rollout produces.
Blind answers (a random colour, no search) are demonstrated too (see `demonstrations`).
"""

from __future__ import annotations

import itertools
import pathlib

import numpy as np

SYLLABLES = ("ba", "ko", "mi", "du", "ze", "ra", "lu", "fo", "ti", "ne", "sa", "po", "gu", "he", "vi", "jo")
COLOURS = ("red", "blue", "green", "pink", "gray", "gold", "black", "white")
TAGS = ("<think>", "</think>", "<search>", "</search>", "<information>", "</information>", "<answer>", "</answer>")
# The rollout settings of the task (demonstrations and RL alike): one searching turn, then the answer turn.
ROLLOUT = dict(max_turns=1, max_new_tokens_per_turn=6, max_obs_tokens=24, topk=1, max_cache_len=128)
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def instruction_pieces() -> list[str]:
    """The Search-R1 instruction split at its tags (each piece becomes one added token)."""
    import re

    from searchjax.agent import protocol
    pattern = "(" + "|".join(re.escape(t) for t in TAGS) + ")"
    return [p for p in re.split(pattern, protocol.SEARCH_R1_INSTRUCTION) if p and p not in TAGS]


def entity_names() -> list[str]:
    return [a + b for a, b in itertools.product(SYLLABLES, SYLLABLES)]


def world(seed: int = 0) -> dict[str, str]:
    """name -> colour, uniform and independent."""
    rng = np.random.default_rng(seed)
    return {name: COLOURS[int(rng.integers(len(COLOURS)))] for name in entity_names()}


def question(name: str) -> str:
    return f"What colour is {name}?"


def build_tokenizer(directory: pathlib.Path):
    """Train, save (HF format) and load the task's tokenizer; returns the searchjax Tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from searchjax.agent import protocol
    from searchjax.tokenization import load_tokenizer
    text = []
    for name, colour in world().items():
        prompt = f"<|im_start|>user\n{protocol.build_user_prompt(question(name))}<|im_end|>\n<|im_start|>assistant\n"
        text.append(prompt + f"<search> {name}</search>\n\n<information>Doc 1(Title: {name}) {name} is {colour}."
                    f"</information>\n\n<answer> {colour}</answer>")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(text, trainer)
    # Added after training (or training drops some): the tags, and the instruction's text between them, so
    # the 120-token Search-R1 instruction costs ~15 tokens and the tiny model's attention is not diluted.
    tok.add_tokens([AddedToken(t, normalized=False) for t in dict.fromkeys(list(TAGS) + instruction_pieces())])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    hf.chat_template = CHAT_TEMPLATE
    directory.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(directory))
    tokenizer = load_tokenizer(directory)
    for word in [" " + w for w in entity_names() + list(COLOURS)] + list(TAGS):
        ids = tokenizer.encode(word)
        assert len(ids) == 1, f"{word!r} is not a single token: {ids}"
    return tokenizer


def passages(colours: dict[str, str]) -> list:
    from retrieval.corpus import Passage
    return [Passage(id=name, title=name, text=f"{name} is {colour}.") for name, colour in colours.items()]


def prompts(names, colours: dict[str, str], tag: str) -> list:
    from searchjax.agent.rollout import Prompt
    return [Prompt(uid=f"{tag}/{n}", question=question(n), golden_answers=(colours[n],), data_source="synthetic")
            for n in names]


def demonstrations(tokenizer, names, worlds, seed: int = 0) -> tuple[list, list]:
    """(searching, blind) expert demonstrations, one of each per name and world seed.

    searching: the real rollout of the scripted expert in that world (its own colours, corpus and BM25
    index): search the name, copy the retrieved colour. blind: answer a random colour at once, i.e. the
    prompt's ids followed by the ids of "<answer>", " COLOUR", "</answer>", exactly what the rollout
    records for that action. Colours vary across worlds, so the colour must be read from the passage.
    """
    from retrieval.bm25 import BM25Index
    from searchjax.agent.rollout import RolloutConfig, rollout
    from searchjax.rl.sft import Demonstration, as_demonstration
    rng = np.random.default_rng(seed)
    cfg = RolloutConfig(group_size=1, **ROLLOUT)
    expert = expert_logits_fn(tokenizer)  # one function object: generation compiles it once
    answer_open, answer_close = tokenizer.encode("<answer>"), tokenizer.encode("</answer>")
    searching, blind = [], []
    for w in worlds:
        colours = world(w)
        for t in rollout(None, None, tokenizer, BM25Index.build(passages(colours)), prompts(names, colours, f"demo{w}"),
                         cfg, seed=0, logits_fn=expert):
            searching.append(as_demonstration(t))
            guess = tokenizer.encode(" " + COLOURS[int(rng.integers(len(COLOURS)))])
            response = answer_open + guess + answer_close
            blind.append(Demonstration(tuple(t.prompt_ids), tuple(response), (1,) * len(response)))
    return searching, blind


def expert_logits_fn(tokenizer):
    """Scripted searching policy: <search> NAME</search>, then after the information block
    <answer> COLOUR</answer>, NAME = last entity token so far (the question's), COLOUR = last colour token
    (the retrieved passage's). Returns logits [B, V] with +30 on the chosen token."""
    import jax.numpy as jnp

    from searchjax.agent import protocol
    V = tokenizer.vocab_size
    one = lambda s: tokenizer.encode(s)
    ids = {t: one(t)[0] for t in TAGS}
    is_entity = np.zeros(V, bool)
    is_entity[[one(" " + n)[0] for n in entity_names()]] = True
    is_colour = np.zeros(V, bool)
    is_colour[[one(" " + c)[0] for c in COLOURS]] = True
    info_close_in_prompt = tokenizer.encode(protocol.build_user_prompt("x")).count(ids["</information>"])
    is_entity, is_colour = jnp.asarray(is_entity), jnp.asarray(is_colour)

    def logits_fn(tokens, lengths):
        S = tokens.shape[1]
        pos = jnp.arange(S)[None, :]
        valid = pos < lengths[:, None]
        last = jnp.take_along_axis(tokens, (lengths - 1)[:, None], axis=1)[:, 0]
        prev = jnp.take_along_axis(tokens, jnp.maximum(lengths - 2, 0)[:, None], axis=1)[:, 0]

        def last_of(table):  # last token of the row whose id is in table
            hit = valid & table[tokens]
            idx = jnp.max(jnp.where(hit, pos, -1), axis=1)
            return jnp.take_along_axis(tokens, jnp.maximum(idx, 0)[:, None], axis=1)[:, 0]

        observed = jnp.sum(valid & (tokens == ids["</information>"]), axis=1) > info_close_in_prompt
        choice = jnp.where(observed, ids["<answer>"], ids["<search>"])
        choice = jnp.where(last == ids["<search>"], last_of(is_entity), choice)
        choice = jnp.where(is_entity[last] & (prev == ids["<search>"]), ids["</search>"], choice)
        choice = jnp.where(last == ids["<answer>"], last_of(is_colour), choice)
        choice = jnp.where(is_colour[last] & (prev == ids["<answer>"]), ids["</answer>"], choice)
        return jnp.where(jnp.arange(V)[None, :] == choice[:, None], 30.0, 0.0)

    return logits_fn

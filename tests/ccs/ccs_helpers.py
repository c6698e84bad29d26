"""Trajectories built token by token the way searchjax.agent.rollout builds them, and small CCS test helpers."""

import dataclasses

from searchjax.agent import protocol
from searchjax.agent.rollout import Prompt, Trajectory
from searchjax.judges.templates import PROMPTS_DIR
from searchjax.rewards.qa import extract_answer

PROMPT_FILE = PROMPTS_DIR / "ccs_reconstructor.v1.txt"


def prompt_sections():
    """(system text, user text before {trace}, user text after {trace}), read from the prompt file by hand."""
    text = PROMPT_FILE.read_text(encoding="utf-8")
    system = text.split("[system]\n", 1)[1].split("\n[user]\n", 1)[0].strip("\n")
    user = text.split("\n[user]\n", 1)[1].strip("\n")
    before, after = user.split("{trace}")
    return system, before, after


def short_hits(hits, chars):
    """The hits with each passage's text cut to `chars` characters (short evidence keeps prompts small)."""
    return [dataclasses.replace(h, text=h.text[:chars]) for h in hits]


def make_trajectory(tokenizer, prompt: Prompt, turns, *, sample_index=0) -> Trajectory:
    """turns: a list of ("search", generated text, query, observation text or hits), ("invalid", generated text)
    and, last, ("final", generated text). Generated text gets loss mask 1, observations 0, as in the rollout."""
    ids, mask, queries, retrieved = [], [], [], []
    for turn in turns:
        kind, generated = turn[0], turn[1]
        gen = tokenizer.encode(generated)
        ids += gen
        mask += [1] * len(gen)
        if kind == "search":
            query, obs = turn[2], turn[3]
            hits = [] if isinstance(obs, str) else list(obs)
            text = obs if isinstance(obs, str) else protocol.search_observation(hits)
            queries.append(query)
            retrieved.append(hits)
        elif kind == "invalid":
            text = protocol.INVALID_ACTION_OBSERVATION
        else:
            continue
        obs_ids = tokenizer.encode(text)
        ids += obs_ids
        mask += [0] * len(obs_ids)
    final = turns[-1][1] if turns and turns[-1][0] == "final" else ""
    answer = extract_answer(final)
    return Trajectory(prompt=prompt, sample_index=sample_index, prompt_ids=[0], response_ids=ids, loss_mask=mask,
                      sampler_logprobs=[0.0] * len(ids), response_text=tokenizer.decode(ids), queries=queries,
                      doc_ids=[[h.id for h in hits] for hits in retrieved], retrieved=retrieved, answer=answer,
                      num_searches=len(queries), duplicate_queries=0, forced_termination=False,
                      valid_answer=bool(answer))


def search_turn(thought, query, obs):
    return ("search", f"<think> {thought} </think>\n<search> {query} </search>", query, obs)


def final_turn(thought, answer):
    return ("final", f"<think> {thought} </think>\n<answer> {answer} </answer>")


def user_message(body: dict) -> str:
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    assert len(users) == 1, body["messages"]
    return users[0]


def trace_of(body: dict) -> str:
    """The {trace} part of a reconstructor request received by a scripted server."""
    _, before, after = prompt_sections()
    content = user_message(body)
    assert content.startswith(before) and content.endswith(after), content[:300]
    return content[len(before):len(content) - len(after)]


def scripted_logits_fn(sequences, eos_id: int, vocab_size: int):
    """A policy that writes row r's script: logits_fn(tokens [B, S], lengths [B]) -> [B, V] with all mass on
    sequences[r][lengths[r]] (the row's full intended sequence: prompt, generated and observation tokens),
    EOS past its end. The rollout appends the real observations, which the script must predict exactly."""
    import jax.numpy as jnp
    import numpy as np
    width = max(len(s) for s in sequences) + 1
    table = np.full((len(sequences), width), eos_id, np.int32)
    for r, seq in enumerate(sequences):
        table[r, :len(seq)] = seq
    table = jnp.asarray(table)

    def logits_fn(tokens, lengths):
        rows = jnp.minimum(jnp.arange(tokens.shape[0]), table.shape[0] - 1)
        target = table[rows, jnp.minimum(lengths, width - 1)]
        return jnp.where(jnp.arange(vocab_size)[None, :] == target[:, None], 0.0, -1e4).astype(jnp.float32)
    return logits_fn


class ShortPassages:
    """A retriever that cuts every passage of `inner` to `chars` characters (observations stay small)."""

    def __init__(self, inner, chars):
        self.inner, self.chars = inner, chars

    def search(self, queries, topk):
        return [short_hits(hits, self.chars) for hits in self.inner.search(queries, topk)]

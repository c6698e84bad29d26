"""Crafted chain records, proposer replies, scripted policies and fakes for the Dr.Free proposer tests."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from retrieval.corpus import Hit


def passage(title: str, text: str, pid: str | None = None) -> dict:
    return {"id": pid or title.lower().replace(" ", "_"), "title": title, "text": text}


def chain_record(chain_id: str, labels: list[str], relations: list[str], passages: list[dict]) -> dict:
    """A chain record in chains.chain_record's layout (only the fields the proposer side reads, plus ids)."""
    return {"id": chain_id, "hops": len(relations),
            "entities": [{"id": f"Q{k}", "title": p["title"], "label": label}
                         for k, (label, p) in enumerate(zip(labels, passages))],
            "relations": [{"id": f"P{k}", "label": r} for k, r in enumerate(relations)],
            "answer": labels[-1], "answer_aliases": [labels[-1]], "passages": passages, "hop_evidence": []}


# Crafted chains: one per hop count, facts stated in the passages so grounding is known by construction.
FILM = passage("Crouching Tiger", "Crouching Tiger is a 2000 film directed by Ang Lee, with music by Tan Dun.")
LEE = passage("Ang Lee", "Ang Lee is a film director born in Pingtung County, Taiwan.")
PINGTUNG = passage("Pingtung County", "Pingtung County is a county in southern Taiwan.")
TAIWAN = passage("Taiwan", "Taiwan is an island country in East Asia whose capital is Taipei.")
CHAIN_1 = chain_record("h1-000000", ["Crouching Tiger", "Ang Lee"], ["director"], [FILM, LEE])
CHAIN_2 = chain_record("h2-000000", ["Crouching Tiger", "Ang Lee", "Pingtung County"], ["director", "place of birth"],
                       [FILM, LEE, PINGTUNG])
CHAIN_3 = chain_record("h3-000000", ["Crouching Tiger", "Ang Lee", "Pingtung County", "Taiwan"],
                       ["director", "place of birth", "country"], [FILM, LEE, PINGTUNG, TAIWAN])


def reply(question: str, answer: str, think: str = "I follow the chain.") -> str:
    return f"<think>{think}</think>\n<question>{question}</question>\n<answer>{answer}</answer>"


@dataclasses.dataclass
class FakeTrajectory:
    """The fields of searchjax.agent.rollout.Trajectory the proposer rewards read."""
    prompt: object
    response_text: str
    sample_index: int = 0
    response_ids: list = dataclasses.field(default_factory=list)


def scripted_logits_fn(sequences, eos_id: int, vocab_size: int, width: int = 2048):
    """logits_fn(tokens [B, S], lengths [B]) -> [B, V]: all mass on sequences[b][lengths[b]] (EOS past the end),
    so row b generates exactly its script; padding rows follow the last script."""
    table = np.full((len(sequences), width), eos_id, np.int32)
    for r, seq in enumerate(sequences):
        table[r, :len(seq)] = seq
    table = jnp.asarray(table)

    def logits_fn(tokens, lengths):
        rows = jnp.minimum(jnp.arange(tokens.shape[0]), table.shape[0] - 1)
        target = table[rows, jnp.minimum(lengths, table.shape[1] - 1)]
        return jnp.where(jnp.arange(vocab_size)[None, :] == target[:, None], 0.0, -1e4).astype(jnp.float32)

    return logits_fn


class CountingRetriever:
    """Records every search call; hit k of query q is a deterministic passage about q."""

    def __init__(self):
        self.calls = []

    def search(self, queries, topk):
        self.calls.append((list(queries), topk))
        return [[Hit(id=f"{q}#{k}", title=f"Result {k}", text=f"Text {k} about {q}.", score=1.0 / (k + 1))
                 for k in range(topk)] for q in queries]

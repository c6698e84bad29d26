"""Stop strings as a token-level automaton, built on the host and advanced on device one token per step.

A stop string such as `</search>` is matched on the decoded *text*, and a tokenizer can produce that text
with many token sequences (`</search>`, `</` `search` `>`, `</sea` `rch>`, `.</` `search>`, ...). Matching
token ids would miss most of them, and decoding on the host every step would leave the device. Instead:

1. Byte automaton. The stop strings (UTF-8 bytes) form an Aho-Corasick trie (Aho & Corasick, 1975): a
   state is a prefix of some stop string, `delta[q, c]` is the longest stop-string prefix that is a suffix
   of (text of q) + c, and q is accepting iff some stop string is a suffix of its text. After reading any
   text, the state is the longest suffix of the text that is a stop-string prefix, so a match is seen
   whatever the text was split into.
2. Token automaton. For every state q and vocabulary token t, walk t's bytes (`tokenizer.token_bytes(t)`,
   the bytes t contributes when decoded in context) through `delta`:
       next_state[q, t] = MATCH                   if an accepting state is reached at any byte of t
                        = delta*(q, bytes(t))     otherwise
   MATCH is absorbing. A token that completes a stop string anywhere inside its bytes therefore stops the
   row at once; the whole token (the stop text and any bytes after it in the same token) stays in the output.

The table is [states, V] int32, padded to a power-of-two number of states (>= 8) so that a new set of stop
strings rarely changes the shape of the jitted decode loop. It is built with numpy, walking every token's
byte position at once over all states (about 0.1 s for a 49k vocabulary), and cached per (tokenizer, stop
strings, vocabulary width).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

MIN_STATES = 8


@dataclasses.dataclass(frozen=True)
class StopTable:
    """next_state [N, V] int32 (N a power of two >= 8; rows past the last real state are unused);
    match_state: the absorbing state meaning "a stop string was completed"; stops: the strings."""
    next_state: np.ndarray
    match_state: int
    stops: tuple[str, ...]


def byte_automaton(stops: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Aho-Corasick DFA over bytes: (delta [Q, 256] int32, accepting [Q] bool); state 0 is the empty prefix."""
    children: list[dict[int, int]] = [{}]
    accepting = [False]
    for stop in stops:
        if not stop:
            raise ValueError("stop strings must be non-empty")
        node = 0
        for byte in stop:
            if byte not in children[node]:
                children.append({})
                accepting.append(False)
                children[node][byte] = len(children) - 1
            node = children[node][byte]
        accepting[node] = True
    num_states = len(children)
    delta = np.zeros((num_states, 256), np.int32)
    fail = np.zeros(num_states, np.int32)
    # Breadth-first: a node's failure link and full transition row only need shallower nodes.
    queue = []
    for byte, child in children[0].items():
        delta[0, byte] = child
        queue.append(child)
    head = 0
    while head < len(queue):
        node = queue[head]
        head += 1
        accepting[node] = accepting[node] or accepting[fail[node]]
        delta[node] = delta[fail[node]]
        for byte, child in children[node].items():
            fail[child] = delta[fail[node], byte]
            delta[node, byte] = child
            queue.append(child)
    return delta, np.asarray(accepting, bool)


def token_automaton(token_bytes: Sequence[bytes], stops: Sequence[str], vocab_size: int) -> StopTable:
    """The [states, vocab_size] token table described in the module docstring.

    token_bytes[t]: the bytes of token t; ids in [len(token_bytes), vocab_size) (a model vocabulary padded
    past the tokenizer's) contribute no bytes and leave the state unchanged.
    """
    stops = tuple(stops)
    delta, accepting = byte_automaton([s.encode("utf-8") for s in stops])
    num_states = delta.shape[0]
    match_state = num_states
    padded_states = max(MIN_STATES, 1 << int(np.ceil(np.log2(num_states + 1))))

    num_tokens = min(len(token_bytes), vocab_size)
    lengths = np.fromiter((len(token_bytes[t]) for t in range(num_tokens)), np.int64, num_tokens)
    order = np.argsort(-lengths, kind="stable")  # longest first: at byte position p, the first k tokens have one
    max_len = int(lengths.max(initial=0))
    byte_matrix = np.zeros((num_tokens, max(max_len, 1)), np.uint8)
    for row, t in enumerate(order):
        if lengths[t]:
            byte_matrix[row, :lengths[t]] = np.frombuffer(token_bytes[t], np.uint8)
    sorted_lengths = lengths[order]

    state = np.repeat(np.arange(num_states, dtype=np.int32)[:, None], num_tokens, axis=1)  # [Q, tokens]
    matched = np.zeros((num_states, num_tokens), bool)
    for position in range(max_len):
        count = int(np.searchsorted(-sorted_lengths, -position, side="left"))  # tokens longer than `position`
        step = delta[state[:, :count], byte_matrix[:count, position][None, :]]
        state[:, :count] = step
        matched[:, :count] |= accepting[step]
    state = np.where(matched, match_state, state)

    table = np.zeros((padded_states, vocab_size), np.int32)
    table[:num_states, order] = state
    # Ids past the tokenizer's vocabulary: no bytes, state unchanged.
    table[:num_states, num_tokens:] = np.arange(num_states, dtype=np.int32)[:, None]
    table[match_state, :] = match_state
    return StopTable(next_state=table, match_state=match_state, stops=stops)


_TOKEN_BYTES_CACHE: dict[int, tuple[object, list[bytes]]] = {}
_TABLE_CACHE: dict[tuple, tuple[object, StopTable]] = {}


def vocabulary_bytes(tokenizer) -> list[bytes]:
    """[tokenizer.token_bytes(t) for t < tokenizer.vocab_size], cached per tokenizer object."""
    entry = _TOKEN_BYTES_CACHE.get(id(tokenizer))
    if entry is None or entry[0] is not tokenizer:
        values = [bytes(tokenizer.token_bytes(t)) for t in range(tokenizer.vocab_size)]
        # The tokenizer is kept alive by the cache entry, so its id cannot be reused by another object.
        entry = _TOKEN_BYTES_CACHE[id(tokenizer)] = (tokenizer, values)
    return entry[1]


def stop_table(tokenizer, stops: Sequence[str], vocab_size: int) -> StopTable:
    """token_automaton for a tokenizer's vocabulary, cached per (tokenizer, stops, vocab_size)."""
    stops = tuple(stops)
    for i, stop in enumerate(stops):
        if not isinstance(stop, str) or not stop:
            raise ValueError(f"stop[{i}]={stop!r}: stop strings must be non-empty str")
    if stops and tokenizer is None:
        raise ValueError(f"stop={stops!r} needs a tokenizer: stop strings are matched on decoded text")
    key = (id(tokenizer), stops, int(vocab_size))
    entry = _TABLE_CACHE.get(key)
    if entry is None or entry[0] is not tokenizer:
        token_bytes = vocabulary_bytes(tokenizer) if stops else []
        entry = _TABLE_CACHE[key] = (tokenizer, token_automaton(token_bytes, stops, vocab_size))
    return entry[1]

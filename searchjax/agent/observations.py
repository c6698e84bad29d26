"""Token-level observations of the search agent: batch tokenisation, and observations cut to a token budget.

The rollout (searchjax/agent/rollout.py), the SFT demonstrations (searchjax/data/demonstrations.py) and the
searching proposer (searchjax/drfree/search_proposer.py) encode observations here, so a demonstration's tokens
are the rollout's, token for token.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from searchjax.agent import protocol

# Appended (before `</information>`) to an observation cut to max_obs_tokens.
TRUNCATION_MARKER = " ... [truncated]"


def _rust_tokenizer(tokenizer):
    """The Rust tokenizer behind a searchjax Tokenizer when its own encode/decode add nothing to it (no clean-up
    of tokenization spaces), else None. Its batch calls run on every core outside the GIL."""
    from searchjax.tokenization import Tokenizer
    if isinstance(tokenizer, Tokenizer) and not tokenizer.hf.clean_up_tokenization_spaces:
        return tokenizer.hf.backend_tokenizer
    return None


def encode_many(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """[tokenizer.encode(t) for t in texts], in one batch call when the tokenizer has a Rust backend."""
    backend = _rust_tokenizer(tokenizer)
    if backend is None or not texts:
        return [tokenizer.encode(t) for t in texts]
    return [e.ids for e in backend.encode_batch(list(texts), add_special_tokens=False)]


def decode_many(tokenizer, sequences: Sequence[Sequence[int]]) -> list[str]:
    """[tokenizer.decode(ids) for ids in sequences], in one batch call when the tokenizer has a Rust backend."""
    backend = _rust_tokenizer(tokenizer)
    if backend is None or not sequences:
        return [tokenizer.decode(ids) for ids in sequences]
    return backend.decode_batch([list(ids) for ids in sequences], skip_special_tokens=False)


# ------------------------------------------------------------------------------------------- observations

@dataclasses.dataclass(frozen=True)
class ObservationCodec:
    """Encodes observations to at most `budget` tokens (searchjax/agent/rollout.py's docstring, "Observations"). Public: the SFT
    demonstrations (searchjax/data/demonstrations.py) encode their observations with it, token for token as the
    rollout does."""

    tokenizer: object
    budget: int
    head: str  # "\n\n<information>": the information block's wrapper, taken from the protocol itself
    tail: str  # "</information>\n\n"
    info_head: tuple  # ids of head
    info_tail: tuple  # ids of TRUNCATION_MARKER + tail
    marker: tuple  # ids of TRUNCATION_MARKER

    @classmethod
    def build(cls, tokenizer, budget: int) -> "ObservationCodec":
        head, tail = protocol.information_block("\0").split("\0")
        codec = cls(tokenizer, budget, head, tail, tuple(tokenizer.encode(head)),
                    tuple(tokenizer.encode(TRUNCATION_MARKER + tail)), tuple(tokenizer.encode(TRUNCATION_MARKER)))
        minimum = len(codec.info_head) + len(codec.info_tail) + 1
        if budget < minimum:
            raise ValueError(f"RolloutConfig.max_obs_tokens={budget} cannot hold a truncated information block "
                             f"(wrapper and marker take {minimum - 1} tokens); use at least {minimum}")
        return codec

    def _cut(self, body_ids: list, room: int) -> list:
        """The first <= room body tokens, backing off (<= 3 tokens) so the cut ends a whole UTF-8 character."""
        room = max(room, 0)
        for k in range(room, max(room - 4, 0), -1):
            try:
                b"".join(self.tokenizer.token_bytes(t) for t in body_ids[:k]).decode("utf-8")
                return body_ids[:k]
            except UnicodeDecodeError:
                continue
        return body_ids[:room]

    def encode(self, text: str, *, information: bool) -> tuple[list[int], bool]:
        """(token ids, truncated?) of an observation; `information`: text is an information block."""
        return self.encode_many([text], information=information)[0]

    def encode_many(self, texts: Sequence[str], *, information: bool) -> list[tuple[list[int], bool]]:
        """`encode` of each text; each distinct text is tokenised once, all in one batch call (two when some
        information blocks are truncated: their bodies are re-encoded alone)."""
        distinct = list(dict.fromkeys(texts))
        encoded = dict(zip(distinct, encode_many(self.tokenizer, distinct)))
        long = [t for t in distinct if len(encoded[t]) > self.budget]
        if information and long:
            bodies = encode_many(self.tokenizer, [t[len(self.head):len(t) - len(self.tail)] for t in long])
            room = self.budget - len(self.info_head) - len(self.info_tail)
            out = {t: (list(self.info_head) + self._cut(body, room) + list(self.info_tail), True)
                   for t, body in zip(long, bodies)}
        else:
            out = {t: (self._cut(encoded[t], self.budget - len(self.marker)) + list(self.marker), True) for t in long}
        for t in distinct:
            out.setdefault(t, (encoded[t], False))
        return [(list(out[t][0]), out[t][1]) for t in texts]

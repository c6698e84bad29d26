"""Decoder embedders (Qwen3-Embedding style): our decoder with last-token pooling, for dense retrieval and CCS.

Queries become "Instruct: {task}\nQuery:{q}" and documents stay bare, each followed by <|endoftext|>, whose
last hidden state (L2-normalised) is the embedding. Batching and `encode` come from
searchjax.models.embedding.BucketedEmbedder.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Sequence

import jax

from searchjax.models.embedding import BucketedEmbedder, pool

QWEN3_EMBEDDING_TASK = "Given a web search query, retrieve relevant passages that answer the query"


@dataclasses.dataclass
class DecoderEmbedder(BucketedEmbedder):
    """Our decoder (searchjax.models Transformer, return_hidden=True) as an embedder: last-token pooling.

    Queries become f"Instruct: {task}\\nQuery:{query}" (Qwen3-Embedding's format); passages are bare.
    `append_token` (Qwen3-Embedding: "<|endoftext|>") is appended to every input, whose hidden state is the embedding.
    """

    name: str
    model: object                    # searchjax.models.Transformer
    params: dict
    tokenizer: object                # searchjax.tokenization.Tokenizer
    task: str = QWEN3_EMBEDDING_TASK
    append_token: str | None = "<|endoftext|>"
    max_length: int = 512
    normalize: bool = True
    batch_size: int = 16
    steps_per_octave: int = 1
    max_batch_tokens: int | None = 4096
    source: str = ""                 # the directory loaded from (recorded in manifests, to reload)
    warmup_tokens = 64               # the instruction prefix alone is ~20 tokens (a class attribute, not a field)

    def __post_init__(self):
        from searchjax.models import positions_from_mask
        model, normalize = self.model, self.normalize

        @jax.jit
        def embed(params, input_ids, token_mask):
            hidden, _ = model.apply({"params": params}, input_ids, positions_from_mask(token_mask), token_mask,
                                    cache=None, return_hidden=True)
            return pool(hidden, token_mask, "last", normalize)
        self._embed = embed
        self._append_ids: list[int] = []
        if self.append_token is not None:
            self._append_ids = self.tokenizer.encode(self.append_token, add_special_tokens=False)
            if len(self._append_ids) != 1:
                raise ValueError(f"append_token {self.append_token!r} is not a single token of this tokenizer")

    @property
    def dim(self) -> int:
        return self.model.config.hidden_size

    def describe(self) -> dict:
        return {"name": self.name, "kind": "decoder", "dim": self.dim, "pooling": "last", "normalize": self.normalize,
                "task": self.task, "append_token": self.append_token, "max_length": self.max_length,
                "path": self.source}

    def format_query(self, query: str) -> str:
        return f"Instruct: {self.task}\nQuery:{query}"

    def tokenize(self, texts: Sequence[str], is_query: bool) -> list[list[int]]:
        """Token ids per text; truncated so the appended token always survives."""
        keep = self.max_length - len(self._append_ids)
        return [self.tokenizer.encode(self.format_query(t) if is_query else t, add_special_tokens=False)[:keep]
                + self._append_ids for t in texts]

    def _token_limit(self) -> int:
        return self.max_length

    def _pad_id(self) -> int:
        return self.tokenizer.pad_token_id or 0


def load_decoder_embedder(path: str | os.PathLike, *, name: str | None = None, dtype: str = "float32",
                          **kwargs) -> DecoderEmbedder:
    """A DecoderEmbedder from an HF decoder directory (e.g. Qwen3-Embedding-0.6B) via searchjax.models."""
    from searchjax.models import load_pretrained
    from searchjax.tokenization import load_tokenizer
    model, params = load_pretrained(path, dtype=dtype)
    return DecoderEmbedder(name or pathlib.Path(path).name, model, params, load_tokenizer(path), source=str(path),
                           **kwargs)

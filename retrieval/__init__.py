"""Retrieval for search agents: wiki-18 corpora, BM25 and faiss indexes, a Search-R1 /retrieve server, clients.

    from retrieval import default_index, open_index
    index = default_index("bm25")                  # the embedded-default corpus, built once and cached
    hits = index.search(["capital of france"], topk=3)[0]     # Hit(.id, .title, .text, .contents, .score)

Modules: corpus (Passage, Hit, jsonl I/O, the default corpus, Search-R1 passage formatting), bm25
(BM25Index), index (DenseIndex, index directories and manifests, open_index, default_index), server
(FastAPI app with micro-batching), server_requests (the /retrieve request body, its limits and checks, the
answer's layout), client (Retriever, InProcessRetriever, HttpRetriever, probe), corpus_store
(corpus fingerprints cached by file size and mtime), streamed (IVF-PQ built over streamed vectors, for
wiki-18-size corpora), synthetic (seeded synthetic vectors for scale rehearsals). Encoders live in
searchjax.models.encoder and searchjax.models.decoder_embedder.

The public names below are resolved on first access (PEP 562), so `import retrieval` costs
milliseconds: bm25s pulls in jax and scipy (about 2 s), which only code that builds or loads a BM25
index should pay for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> the submodule that defines it
_EXPORTS = {
    "BM25Index": "retrieval.bm25",
    "Hit": "retrieval.corpus",
    "Passage": "retrieval.corpus",
    "format_passages": "retrieval.corpus",
    "read_jsonl_corpus": "retrieval.corpus",
    "DenseIndex": "retrieval.index",
    "DenseIndexConfig": "retrieval.index",
    "IndexMismatchError": "retrieval.index",
    "default_index": "retrieval.index",
    "open_index": "retrieval.index",
    "save_index": "retrieval.index",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:   # static analysers and IDEs see the real names
    from retrieval.bm25 import BM25Index
    from retrieval.corpus import Hit, Passage, format_passages, read_jsonl_corpus
    from retrieval.index import (DenseIndex, DenseIndexConfig, IndexMismatchError, default_index, open_index,
                                 save_index)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'retrieval' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value     # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

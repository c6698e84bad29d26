"""Retrieval for search agents: wiki-18 corpora, BM25 and faiss indexes, a Search-R1 /retrieve server, clients.

    from retrieval import default_index, open_index
    index = default_index("bm25")                  # the embedded-default corpus, built once and cached
    hits = index.search(["capital of france"], topk=3)[0]     # Hit(.id, .title, .text, .contents, .score)

Modules: corpus (Passage, Hit, jsonl I/O, the default corpus, Search-R1 passage formatting), bm25
(BM25Index), index (DenseIndex, index directories and manifests, open_index, default_index), server
(FastAPI app with micro-batching), client (Retriever, InProcessRetriever, HttpRetriever).
Encoders live in searchjax.models.encoder.
"""

from retrieval.bm25 import BM25Index
from retrieval.corpus import Hit, Passage, format_passages, read_jsonl_corpus
from retrieval.index import DenseIndex, DenseIndexConfig, IndexMismatchError, default_index, open_index, save_index

__all__ = ["BM25Index", "DenseIndex", "DenseIndexConfig", "Hit", "IndexMismatchError", "Passage", "default_index",
           "format_passages", "open_index", "read_jsonl_corpus", "save_index"]

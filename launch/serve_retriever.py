r"""Serve an index over HTTP with Search-R1's /retrieve protocol (retrieval.server).

  python -m launch.serve_retriever --index=bm25                       # embedded default corpus, BM25
  python -m launch.serve_retriever --index=dense --port=8000          # embedded default, MiniLM Flat IP
  python -m launch.serve_retriever --index=dense --index_type=hnsw    # same vectors, HNSW (built from the Flat cache)
  python -m launch.serve_retriever --index=indexes/wiki18_e5_hnsw     # a directory from launch/build_index.py

  curl -s localhost:8000/retrieve -H 'content-type: application/json' \
    -d '{"queries": ["who wrote hamlet"], "topk": 3, "return_scores": true}'

Binds 127.0.0.1 unless --host says otherwise (the server has no authentication).
Point the trainer at it with config.retrieval.url = "http://127.0.0.1:8000".
"""

from __future__ import annotations

from absl import app, flags

INDEX = flags.DEFINE_string("index", "bm25", "'bm25' | 'dense' (the embedded default) or an index directory.")
INDEX_TYPE = flags.DEFINE_enum("index_type", "flat", ["flat", "hnsw", "ivfpq"],
                               "faiss index kind for --index=dense (ignored otherwise).")
HOST = flags.DEFINE_string("host", "127.0.0.1", "Bind address; 0.0.0.0 exposes the server to the network.")
PORT = flags.DEFINE_integer("port", 8000, "Port.")
DEFAULT_TOPK = flags.DEFINE_integer("default_topk", 3, "topk when a request omits it.")
MAX_QUERIES = flags.DEFINE_integer("max_queries", 512, "Queries per request (more -> 413).")
MAX_TOPK = flags.DEFINE_integer("max_topk", 100, "Largest topk accepted (more -> 422).")
MAX_QUERY_CHARS = flags.DEFINE_integer("max_query_chars", 4096, "Longest query accepted (more -> 413).")
BATCH_WINDOW_MS = flags.DEFINE_float("batch_window_ms", 2.0, "How long to wait for concurrent requests to batch.")


def main(argv):
    del argv
    from searchjax import runtime
    runtime.enable_compilation_cache()
    from retrieval import default_index, open_index
    from retrieval.server import ServerLimits, run_server
    if INDEX.value == "bm25":
        index = default_index("bm25")
    elif INDEX.value == "dense":
        index = default_index("dense", index_type=INDEX_TYPE.value, progress=True)
    else:
        index = open_index(INDEX.value)
    limits = ServerLimits(max_queries=MAX_QUERIES.value, max_topk=MAX_TOPK.value,
                          max_query_chars=MAX_QUERY_CHARS.value, default_topk=DEFAULT_TOPK.value,
                          batch_window_ms=BATCH_WINDOW_MS.value)
    run_server(index, host=HOST.value, port=PORT.value, limits=limits)


if __name__ == "__main__":
    app.run(main)

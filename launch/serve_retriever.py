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

from retrieval.server import ServerLimits

INDEX = flags.DEFINE_string("index", "bm25", "'bm25' | 'dense' (the embedded default) or an index directory.")
INDEX_TYPE = flags.DEFINE_enum("index_type", "flat", ["flat", "hnsw", "ivfpq"],
                               "faiss index kind for --index=dense (ignored otherwise).")
HOST = flags.DEFINE_string("host", "127.0.0.1", "Bind address; 0.0.0.0 exposes the server to the network.")
PORT = flags.DEFINE_integer("port", 8000, "Port.")
_DEFAULTS = ServerLimits()
DEFAULT_TOPK = flags.DEFINE_integer("default_topk", _DEFAULTS.default_topk, "topk when a request omits it.")
MAX_QUERIES = flags.DEFINE_integer("max_queries", _DEFAULTS.max_queries,
                                   "Queries per request (more -> 413 naming the limit). Guards memory; the default "
                                   "admits a whole turn of Search-R1 (2,560) or EviBack (4,096).")
MAX_TOPK = flags.DEFINE_integer("max_topk", _DEFAULTS.max_topk, "Largest topk accepted (more -> 422).")
MAX_QUERY_CHARS = flags.DEFINE_integer("max_query_chars", _DEFAULTS.max_query_chars,
                                       "Longest query accepted (more -> 413).")
MAX_BODY_BYTES = flags.DEFINE_integer("max_body_bytes", _DEFAULTS.max_body_bytes,
                                      "Largest request body, chunked or not (more -> 413).")
MAX_BATCH_QUERIES = flags.DEFINE_integer("max_batch_queries", _DEFAULTS.max_batch_queries,
                                         "Queries per index.search call (bounds encoder memory).")
BATCH_WINDOW_MS = flags.DEFINE_float("batch_window_ms", _DEFAULTS.batch_window_ms,
                                     "How long to wait for concurrent requests to batch.")
SHUTDOWN_TIMEOUT_S = flags.DEFINE_float("shutdown_timeout_s", _DEFAULTS.shutdown_timeout_s,
                                        "At shutdown, requests still running after this long are cancelled.")

def main(argv):
    del argv
    from searchjax import runtime
    runtime.enable_compilation_cache()
    from retrieval import default_index, open_index
    from retrieval.server import run_server
    if INDEX.value == "bm25":
        index = default_index("bm25")
    elif INDEX.value == "dense":
        index = default_index("dense", index_type=INDEX_TYPE.value, progress=True)
    else:
        index = open_index(INDEX.value)
    limits = ServerLimits(max_queries=MAX_QUERIES.value, max_topk=MAX_TOPK.value,
                          max_query_chars=MAX_QUERY_CHARS.value, max_body_bytes=MAX_BODY_BYTES.value,
                          default_topk=DEFAULT_TOPK.value, max_batch_queries=MAX_BATCH_QUERIES.value,
                          batch_window_ms=BATCH_WINDOW_MS.value, shutdown_timeout_s=SHUTDOWN_TIMEOUT_S.value)
    run_server(index, host=HOST.value, port=PORT.value, limits=limits)


if __name__ == "__main__":
    app.run(main)

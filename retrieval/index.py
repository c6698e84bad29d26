"""Dense faiss indexes (Flat IP, HNSW, IVF-PQ + exact refine), index directories with a manifest, and
the cached embedded-default indexes.

Dense scores are inner products of L2-normalised embeddings, i.e. cosine similarity (Search-R1 serves
e5-base-v2 with faiss `Flat` inner product). Approximate kinds trade recall for speed on CPU:

- "flat":  IndexFlatIP, exact.
- "hnsw":  IndexHNSWFlat (M neighbours per node), searched with efSearch candidates.
- "ivfpq": IndexIVFPQ (nlist k-means cells, m sub-quantisers of nbits) probed in nprobe cells for
           k * k_factor candidates by PQ distance, then re-ranked exactly against the full vectors: by
           IndexRefineFlat in memory (refine_store "memory"), or, for corpora whose vectors do not fit in
           memory (wiki-18: 21M x 768 float32 is 64.5 GB), from refine.npy memory-mapped from disk
           (refine_store "disk", written by `retrieval.streamed.build_streamed_ivfpq`).

An index directory holds manifest.json, the index files and (unless built over an external corpus
file) corpus.jsonl. The manifest records the retriever kind, index type, encoder description, dims,
passage count and the corpus fingerprint (sha256 over ids and contents); `open_index` checks all of
them against what it loads and against the encoder / corpus the caller expects, and refuses a
mismatch with a message naming the field. The corpus file's fingerprint is cached beside the index,
keyed by the file's size and mtime (`retrieval.corpus_store`), so opening an index re-hashes the corpus
only after it changed; indexes built by the streamed builder also read passages lazily by byte offset.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pathlib
import shutil
import tempfile
from typing import Sequence

import numpy as np

from retrieval import corpus_store
from retrieval.bm25 import BM25Index
from retrieval.corpus import (Hit, Passage, atomic_write_text, corpus_fingerprint, default_corpus,
                              read_jsonl_corpus, write_jsonl_corpus)

MANIFEST = "manifest.json"
FORMAT = "searchjax-index/1"
DENSE_KINDS = ("flat", "hnsw", "ivfpq")
# Encoder fields that define the embedding space: any difference makes stored vectors meaningless.
_ENCODER_IDENTITY = ("name", "kind", "dim", "pooling", "normalize", "query_prefix", "passage_prefix", "task",
                     "append_token")


class IndexMismatchError(ValueError):
    """An index directory does not match the encoder or corpus it is being used with."""


@dataclasses.dataclass(frozen=True)
class DenseIndexConfig:
    """Which faiss index to build and how to search it."""

    kind: str = "flat"                 # "flat" | "hnsw" | "ivfpq"
    hnsw_m: int = 32                   # graph degree
    hnsw_ef_construction: int = 80     # candidate list while inserting
    hnsw_ef_search: int = 64           # candidate list while searching (>= topk)
    ivf_nlist: int = 0                 # k-means cells; 0 = min(4 sqrt(N), N / 39) (faiss wants >= 39 points/cell)
    ivf_nprobe: int = 16               # cells visited per query
    pq_m: int = 0                      # sub-quantisers; 0 = dim / 8 (8 dims each)
    pq_nbits: int = 0                  # bits per sub-quantiser code; 0 = 8, fewer below 39 * 256 vectors
                                       # (k-means wants >= 39 training points per centroid)
    refine_k_factor: int = 16          # PQ candidates re-ranked exactly: topk * refine_k_factor. Recall is
                                       # bounded by this, not by nprobe, once the true neighbours' cells are
                                       # probed: on 200k clustered vectors (searchjax/bench/retrieval.py)
                                       # x4 gave recall@10 0.78, x8 0.94, x16 0.998 at any nprobe in 4..32
    train_size: int = 65536            # vectors sampled to train IVF centroids and PQ codebooks
    seed: int = 0
    refine_store: str = "memory"       # "memory": IndexRefineFlat; "disk": refine.npy, memory-mapped (streamed builds)
    refine_dtype: str = "float32"      # refine.npy's dtype: "float16" halves the disk (scores within ~1e-3)

    def __post_init__(self):
        if self.kind not in DENSE_KINDS:
            raise ValueError(f"DenseIndexConfig.kind must be one of {DENSE_KINDS}, got {self.kind!r}")
        if self.refine_store not in ("memory", "disk"):
            raise ValueError(f"DenseIndexConfig.refine_store must be 'memory' or 'disk', got {self.refine_store!r}")
        if self.refine_dtype not in ("float32", "float16"):
            raise ValueError(f"DenseIndexConfig.refine_dtype must be 'float32' or 'float16', got {self.refine_dtype!r}")
        if self.refine_store == "disk" and self.kind != "ivfpq":
            raise ValueError("DenseIndexConfig.refine_store='disk' is for kind='ivfpq'")


def ivfpq_shape(n: int, d: int, config: DenseIndexConfig, train_n: int | None = None) -> tuple[int, int, int]:
    """(nlist, pq_m, nbits) for n vectors of dim d trained on train_n (default n) of them; zeros in the
    config mean: nlist = min(4 sqrt(n), n / 39), pq_m = d / 8, nbits = 8 or fewer when train_n < 39 * 256."""
    train_n = n if train_n is None else train_n
    nlist = config.ivf_nlist or max(1, min(int(4 * math.sqrt(n)), n // 39))
    pq_m = config.pq_m or max(1, d // 8)
    if d % pq_m:
        raise ValueError(f"pq_m={pq_m} must divide the embedding dimension {d}")
    nbits = config.pq_nbits or int(min(8, max(1, math.floor(math.log2(max(train_n, 2) / 39)))))
    return nlist, pq_m, nbits


def build_faiss(vectors: np.ndarray, config: DenseIndexConfig):
    """A faiss index over `vectors` [N, D] float32 (inner-product metric), with search parameters applied."""
    import faiss
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, d = vectors.shape
    if config.kind == "flat":
        index = faiss.IndexFlatIP(d)
    elif config.kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = config.hnsw_ef_construction
    else:
        if config.refine_store != "memory":
            raise ValueError("build_faiss keeps the refine vectors in memory; an on-disk refine store is built "
                             "by retrieval.streamed.build_streamed_ivfpq")
        nlist, pq_m, nbits = ivfpq_shape(n, d, config)
        ivf = faiss.IndexIVFPQ(faiss.IndexFlatIP(d), d, nlist, pq_m, nbits, faiss.METRIC_INNER_PRODUCT)
        index = faiss.IndexRefineFlat(ivf)
        rng = np.random.default_rng(config.seed)
        train = vectors if n <= config.train_size else vectors[rng.choice(n, config.train_size, replace=False)]
        index.train(train)
    index.add(vectors)
    apply_search_params(index, config)
    return index


def apply_search_params(index, config: DenseIndexConfig) -> None:
    """Set efSearch / nprobe / k_factor on a built or loaded index (faiss does not keep all of them on disk)."""
    import faiss
    if config.kind == "hnsw":
        index.hnsw.efSearch = config.hnsw_ef_search
    elif config.kind == "ivfpq":
        faiss.extract_index_ivf(index).nprobe = config.ivf_nprobe
        if config.refine_store == "memory":     # on disk, DenseIndex re-ranks topk * refine_k_factor itself
            index.k_factor = config.refine_k_factor


@dataclasses.dataclass
class DenseIndex:
    """Passages, their faiss index and the encoder that embeds queries into the same space."""

    passages: list[Passage]
    encoder: object                   # TextEncoder | DecoderEmbedder: .encode(texts, is_query), .describe()
    faiss_index: object
    config: DenseIndexConfig
    kind: str = "dense"
    refine: np.ndarray | None = None  # [N, D] full vectors (memory-mapped refine.npy) when refine_store is "disk"

    @classmethod
    def build(cls, passages: Sequence[Passage], encoder, config: DenseIndexConfig = DenseIndexConfig(), *,
              progress: bool = False, chunk: int = 512) -> "DenseIndex":
        """Embed every passage's `contents` (with the encoder's passage prefix) and index them."""
        passages = list(passages)
        if not passages:
            raise ValueError("DenseIndex.build: no passages to index")
        vectors = encode_passages(encoder, passages, progress=progress, chunk=chunk)
        return cls.from_vectors(passages, encoder, vectors, config)

    @classmethod
    def from_vectors(cls, passages: Sequence[Passage], encoder, vectors: np.ndarray,
                     config: DenseIndexConfig = DenseIndexConfig()) -> "DenseIndex":
        """Index precomputed passage embeddings [N, D] (rows in passage order, made by `encoder`)."""
        passages = list(passages)
        if vectors.shape != (len(passages), encoder.dim):
            raise ValueError(f"vectors have shape {vectors.shape}, expected ({len(passages)}, {encoder.dim})")
        return cls(passages, encoder, build_faiss(vectors, config), config)

    @property
    def size(self) -> int:
        return len(self.passages)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """For each query, the `topk` passages of highest inner product, best first."""
        if isinstance(queries, str):
            raise TypeError("DenseIndex.search takes a list of queries, got a single string")
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        if not queries:
            return []
        q = self.encoder.encode(list(queries), is_query=True)
        return self.search_vectors(q, topk)

    def warmup(self) -> None:
        """Compile the encoder for query batches (servers call this before accepting requests)."""
        if hasattr(self.encoder, "warmup"):
            self.encoder.warmup()

    def search_vectors(self, q: np.ndarray, topk: int) -> list[list[Hit]]:
        q = np.ascontiguousarray(q, np.float32)
        if self.refine is None:
            scores, ids = self.faiss_index.search(q, min(topk, self.size))
        else:
            scores, ids = refine_from_store(self.faiss_index, self.refine, q, min(topk, self.size),
                                            self.config.refine_k_factor)
        return [[Hit.from_passage(self.passages[int(i)], float(s)) for i, s in zip(row_i, row_s) if i >= 0]
                for row_i, row_s in zip(ids, scores)]


def refine_from_store(index, store: np.ndarray, q: np.ndarray, k: int, k_factor: int,
                      block: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """IndexRefineFlat's search with the full vectors in `store` (a memory-mapped [N, D] array): the approximate
    index proposes k * k_factor candidates per query, which are re-ranked by their exact inner products
    <q, store[id]>. Queries go `block` at a time, so the gathered rows stay at block * k * k_factor * D floats."""
    candidates = min(k * k_factor, store.shape[0])
    _, cand = index.search(q, candidates)
    scores = np.full((len(q), k), -np.inf, np.float32)
    ids = np.full((len(q), k), -1, np.int64)
    for start in range(0, len(q), block):
        c = cand[start:start + block]
        valid = c >= 0
        rows = np.asarray(store[np.where(valid, c, 0).ravel()], np.float32).reshape(*c.shape, -1)
        exact = np.einsum("qkd,qd->qk", rows, q[start:start + block])
        exact[~valid] = -np.inf
        top = np.argsort(-exact, axis=1, kind="stable")[:, :k]
        scores[start:start + block] = np.take_along_axis(exact, top, 1)
        ids[start:start + block] = np.where(np.isfinite(scores[start:start + block]), np.take_along_axis(c, top, 1), -1)
    return scores, ids


def encode_passages(encoder, passages: Sequence[Passage], *, progress: bool = False, chunk: int = 512) -> np.ndarray:
    """[N, D] float32 passage embeddings, encoded `chunk` passages at a time (tqdm bar when progress)."""
    from tqdm import tqdm
    out = np.empty((len(passages), encoder.dim), np.float32)
    with tqdm(total=len(passages), desc=f"encoding with {encoder.describe()['name']}", unit="passage",
              disable=not progress) as bar:
        for start in range(0, len(passages), chunk):
            part = passages[start:start + chunk]
            out[start:start + len(part)] = encoder.encode([p.contents for p in part], is_query=False)
            bar.update(len(part))
    return out


# --- index directories ---------------------------------------------------------------------------------


def save_index(index: BM25Index | DenseIndex, directory: str | os.PathLike, *,
               corpus_path: str | os.PathLike | None = None, overwrite: bool = False) -> pathlib.Path:
    """Write `index` to `directory` atomically (a temporary sibling renamed into place).

    The corpus is copied in as corpus.jsonl unless `corpus_path` names an existing jsonl holding
    exactly the index's passages (for a 21M-passage wiki-18, which should not be copied).
    An existing directory is replaced only with overwrite=True.
    """
    directory = pathlib.Path(directory)
    if directory.exists() and not overwrite:
        raise FileExistsError(f"{directory} exists; pass overwrite=True to replace it")
    if isinstance(index, DenseIndex) and index.refine is not None:
        raise ValueError("an index with an on-disk refine store lives in the directory it was built in "
                         "(retrieval.streamed.build_streamed_ivfpq); save_index does not copy it")
    fingerprint = corpus_fingerprint(index.passages)
    manifest = {"format": FORMAT, "retriever": index.kind, "num_passages": len(index.passages),
                "corpus_fingerprint": fingerprint}
    if corpus_path is not None:
        corpus_path = pathlib.Path(corpus_path).resolve()
        if corpus_fingerprint(read_jsonl_corpus(corpus_path)) != fingerprint:
            raise IndexMismatchError(f"corpus_path {corpus_path} does not hold the index's passages")
        manifest["corpus_file"] = str(corpus_path)
    else:
        manifest["corpus_file"] = "corpus.jsonl"
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        if corpus_path is None:
            write_jsonl_corpus(index.passages, tmp / "corpus.jsonl")
        if isinstance(index, BM25Index):
            index.save(tmp / "bm25")
            manifest.update(index_type="bm25", encoder=None, dims=None,
                            params={"k1": index.k1, "b": index.b, "stopwords": index.stopwords})
        else:
            import faiss
            faiss.write_index(index.faiss_index, str(tmp / "index.faiss"))
            manifest.update(index_type=index.config.kind, encoder=index.encoder.describe(),
                            dims=int(index.faiss_index.d), params=dataclasses.asdict(index.config))
        atomic_write_text(tmp / MANIFEST, lambda f: json.dump(manifest, f, indent=2))
        _replace_dir(tmp, directory, overwrite)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return directory


def _replace_dir(tmp: pathlib.Path, directory: pathlib.Path, overwrite: bool) -> None:
    if directory.exists():
        if not overwrite:
            raise FileExistsError(f"{directory} appeared while building; not replacing it")
        trash = directory.with_name(f".{directory.name}.old-{os.getpid()}")
        os.rename(directory, trash)
        os.rename(tmp, directory)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, directory)


def read_manifest(directory: str | os.PathLike) -> dict:
    """The manifest of an index directory, with a clear error when it is missing or malformed."""
    path = pathlib.Path(directory) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: {directory} is not a searchjax index directory "
                                "(build one with launch/build_index.py)")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg})") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    for field in ("retriever", "index_type", "num_passages", "corpus_fingerprint", "corpus_file"):
        if field not in manifest:
            raise ValueError(f"{path}: missing field {field!r}")
    return manifest


def check_encoder(manifest_encoder: dict, encoder_description: dict, where: str) -> None:
    """Refuse an encoder whose embedding space differs from the one the index was built with."""
    diffs = [f"{k}: index has {manifest_encoder.get(k)!r}, encoder has {encoder_description.get(k)!r}"
             for k in _ENCODER_IDENTITY if manifest_encoder.get(k) != encoder_description.get(k)]
    if diffs:
        raise IndexMismatchError(f"{where}: the index was built with another encoder; " + "; ".join(diffs))


def open_index(directory: str | os.PathLike, *, encoder=None, corpus: Sequence[Passage] | str | os.PathLike | None = None,
               config: DenseIndexConfig | None = None) -> BM25Index | DenseIndex:
    """Load an index directory, validating its manifest.

    Refused with IndexMismatchError: a corpus file whose fingerprint differs from the manifest's; a
    `corpus` (passages or jsonl path) other than the one indexed; an `encoder` whose description
    (name, dims, pooling, prefixes) differs from the manifest's; a faiss index whose size or dims
    disagree with the manifest. Without `encoder`, a dense index loads the encoder named in its
    manifest (from its recorded path). `config` overrides the stored search parameters
    (efSearch, nprobe, k_factor) of the same index kind.
    """
    directory = pathlib.Path(directory)
    manifest = read_manifest(directory)
    where = str(directory / MANIFEST)
    corpus_file = pathlib.Path(manifest["corpus_file"])
    corpus_file = corpus_file if corpus_file.is_absolute() else directory / corpus_file
    if not corpus_file.exists():
        raise FileNotFoundError(f"{where}: corpus file {corpus_file} not found")
    scan = corpus_store.cached_scan(corpus_file, directory)   # reads the file only if it changed since cached
    if scan.fingerprint != manifest["corpus_fingerprint"]:
        raise IndexMismatchError(f"{where}: corpus file {corpus_file} has changed since the index was built "
                                 "(corpus fingerprint differs); rebuild the index")
    if corpus is not None:
        if isinstance(corpus, (str, os.PathLike)) and pathlib.Path(corpus).resolve() == corpus_file.resolve():
            expected_fingerprint, expected_size = scan.fingerprint, scan.num_passages
        else:
            expected = read_jsonl_corpus(corpus) if isinstance(corpus, (str, os.PathLike)) else list(corpus)
            expected_fingerprint, expected_size = corpus_fingerprint(expected), len(expected)
        if expected_fingerprint != manifest["corpus_fingerprint"]:
            raise IndexMismatchError(f"{where}: the index was built over another corpus ({manifest['num_passages']} "
                                     f"passages, fingerprint {manifest['corpus_fingerprint'][:12]}) than the one "
                                     f"given ({expected_size} passages, fingerprint {expected_fingerprint[:12]})")
    if manifest.get("corpus_access") == "offsets":       # streamed builds: passages parsed when a search hits them
        passages = corpus_store.JsonlPassages(corpus_file, scan.offsets_path)
    else:
        passages = read_jsonl_corpus(corpus_file)
    if manifest["retriever"] == "bm25":
        if encoder is not None:
            raise IndexMismatchError(f"{where}: a BM25 index takes no encoder, got {encoder.describe()['name']!r}")
        return BM25Index.load(directory / "bm25", passages)
    if manifest["retriever"] != "dense" or manifest["index_type"] not in DENSE_KINDS:
        raise ValueError(f"{where}: unknown retriever/index_type {manifest['retriever']}/{manifest['index_type']}")
    if encoder is None:
        encoder = load_encoder_from_description(manifest["encoder"], where)
    check_encoder(manifest["encoder"], encoder.describe(), where)
    import faiss
    index = faiss.read_index(str(directory / "index.faiss"))
    if index.ntotal != len(passages) or index.d != manifest["dims"]:
        raise IndexMismatchError(f"{where}: index.faiss holds {index.ntotal} vectors of dim {index.d}, manifest "
                                 f"says {len(passages)} passages of dim {manifest['dims']}")
    stored = DenseIndexConfig(**manifest["params"])
    if config is not None and (config.kind, config.refine_store) != (stored.kind, stored.refine_store):
        raise IndexMismatchError(f"{where}: index is {stored.kind!r} with refine_store {stored.refine_store!r}, "
                                 f"config asks for {config.kind!r} with {config.refine_store!r}")
    config = config or stored
    refine = None
    if config.refine_store == "disk":
        refine = np.load(directory / "refine.npy", mmap_mode="r")
        if refine.shape != (index.ntotal, index.d):
            raise IndexMismatchError(f"{where}: refine.npy has shape {refine.shape}, expected "
                                     f"({index.ntotal}, {index.d})")
    apply_search_params(index, config)
    return DenseIndex(passages, encoder, index, config, refine=refine)


def load_encoder_from_description(description: dict, where: str = "manifest"):
    """Reload the encoder a manifest describes (BERT-family: from its recorded path and preset)."""
    if description.get("kind") == "synthetic":
        from retrieval.synthetic import SyntheticEncoder
        return SyntheticEncoder.from_description(description)
    from searchjax.models import encoder as enc
    if description.get("kind") == "bert":
        enc_obj = enc.load_encoder(description.get("path"), preset=description.get("preset"))
    elif description.get("kind") == "decoder":
        enc_obj = enc.load_decoder_embedder(description["path"], name=description["name"],
                                            task=description["task"], append_token=description["append_token"],
                                            max_length=description["max_length"])
    else:
        raise ValueError(f"{where}: unknown encoder kind {description.get('kind')!r}")
    return enc_obj


# --- the embedded-default indexes -----------------------------------------------------------------------

_DEFAULT_INDEXES: dict[str, BM25Index | DenseIndex] = {}


def default_index_dir(kind: str, passages: Sequence[Passage], encoder=None, index_type: str = "flat") -> pathlib.Path:
    """<cache>/indexes/<name>: the name carries what the manifest validates (retriever, index type, the
    encoder's embedding-space fields, the corpus fingerprint), so a changed corpus or encoder gets a new
    directory instead of a refused or stale one, and an unchanged one is built exactly once."""
    from searchjax.data import assets
    parts = ["default", kind, corpus_fingerprint(passages)[:12]]
    if kind == "dense":
        identity = {k: encoder.describe().get(k) for k in _ENCODER_IDENTITY}
        space = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]
        parts[2:2] = ["".join(c if c.isalnum() else "-" for c in identity["name"].lower()), space, index_type]
    return assets.cache_dir() / "indexes" / "-".join(parts)


def _open_or_build(directory: pathlib.Path, passages: list[Passage], build, *, encoder=None):
    """open_index(directory) validated against `passages` (and `encoder`); else build() and save it there."""
    if directory.exists():
        try:
            return open_index(directory, corpus=passages, encoder=encoder)
        except (IndexMismatchError, ValueError, FileNotFoundError) as e:   # damaged cache: rebuild it
            import logging
            logging.getLogger(__name__).warning("rebuilding the cached index %s: %s", directory, e)
    index = build()
    try:
        save_index(index, directory, overwrite=directory.exists())
    except FileExistsError:   # another process finished first; its index is equivalent
        pass
    return index


def default_index(kind: str = "bm25", *, index_type: str = "flat", progress: bool = False) -> BM25Index | DenseIndex:
    """The embedded-default corpus index: "bm25", or "dense" (all-MiniLM-L6-v2, faiss `index_type`).

    Built on first use and cached under <cache>/indexes/ (see `default_index_dir`; atomic, so
    concurrent builders are safe); kept in memory per process. The dense Flat build encodes the
    10,033 passages (minutes on a small CPU); "hnsw" and "ivfpq" reuse the Flat index's stored
    vectors, so the corpus is encoded once whatever kinds are asked for.
    """
    if kind not in ("bm25", "dense"):
        raise ValueError(f"default_index kind must be 'bm25' or 'dense', got {kind!r}")
    if kind == "dense" and index_type not in DENSE_KINDS:
        raise ValueError(f"default_index index_type must be one of {DENSE_KINDS}, got {index_type!r}")
    memo = kind if kind == "bm25" else f"dense-{index_type}"
    if memo in _DEFAULT_INDEXES:
        return _DEFAULT_INDEXES[memo]
    passages = default_corpus()
    if kind == "bm25":
        index = _open_or_build(default_index_dir("bm25", passages), passages, lambda: BM25Index.build(passages))
    else:
        from searchjax.models.encoder import load_encoder
        encoder = load_encoder()
        config = DenseIndexConfig(kind=index_type)
        if index_type == "flat":
            build = lambda: DenseIndex.build(passages, encoder, config, progress=progress)  # noqa: E731
        else:
            def build():
                flat = default_index("dense", index_type="flat", progress=progress).faiss_index
                return DenseIndex.from_vectors(passages, encoder, flat.reconstruct_n(0, flat.ntotal), config)
        index = _open_or_build(default_index_dir("dense", passages, encoder, index_type), passages, build,
                               encoder=encoder)
    _DEFAULT_INDEXES[memo] = index
    return index

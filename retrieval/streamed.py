"""IVF-PQ over more vectors than fit in memory, built from a stream of chunks (wiki-18: 21M x 768).

`DenseIndex.build` holds every vector ([N, D] float32: 64.5 GB for wiki-18) and an in-memory refine copy.
`build_streamed_ivfpq` never holds more than one chunk of vectors:

1. training sample: `train_n` rows drawn at random from evenly spaced chunks (one chunk in memory at a
   time). train_n = max(config.train_size, 39 * nlist), capped at N: faiss's k-means wants >= 39 points per
   cell, and IVF cells trained on fewer points are what hurts recall at scale;
2. train the IVF coarse quantizer (nlist cells, k-means on inner product) and the PQ codebooks on it;
3. stream every chunk once: `index.add(chunk)` stores pq_m bytes of code + an 8-byte id per vector, and the
   chunk is appended to refine.npy on disk (float16 by default: 2 * D bytes per vector);
4. write index.faiss (the bare IVF-PQ), the manifest, and the corpus with its cached scan.

Memory during the build: the training sample (train_n * D * 4 bytes), one chunk, and the growing PQ codes
(N * (pq_m + 8) bytes); at search time the codes plus the pages of refine.npy that searches touch (the OS
page cache, not the process heap). `open_index` serves the directory with exact re-ranking from the
memory-mapped refine store (`index.refine_from_store`).

A vector source is anything with `num_vectors`, `dim`, `chunk_size`, `num_chunks` and `chunk(i) -> float32
[rows, dim]` (chunk_size rows, fewer in the last chunk):
`retrieval.synthetic.SyntheticVectors` for rehearsals, `NpyVectors` for embeddings precomputed to a .npy.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
import resource
import shutil
import tempfile
import time
from typing import Iterable

import numpy as np

from retrieval import corpus_store
from retrieval.corpus import Passage, atomic_write_text
from retrieval.index import FORMAT, MANIFEST, DenseIndexConfig, _replace_dir, ivfpq_shape

STREAMED_DEFAULT = DenseIndexConfig(kind="ivfpq", refine_store="disk", refine_dtype="float16")


def cpu_seconds() -> float:
    """CPU time this process has used (user + system, all threads): on a shared machine, the figure to scale."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mb() -> float:
    """This process's peak resident set size so far (getrusage ru_maxrss, KiB on Linux), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _rss_split_mb() -> dict[str, float]:
    """Resident memory now, split (Linux /proc/self/status): anonymous (heap: codes, buffers) and file-backed
    (mapped refine.npy / offsets pages, which the kernel can drop and re-read). Empty where unavailable."""
    try:
        lines = pathlib.Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return {}
    fields = {line.split(":")[0]: line.split()[1] for line in lines if line.startswith(("RssAnon", "RssFile"))}
    return {f"{k.lower().replace('rss', 'rss_')}_mb": round(int(v) / 1024, 1) for k, v in fields.items()}


def directory_size_mb(directory: str | os.PathLike) -> dict[str, float]:
    """MiB per file of an index directory (sparse-safe: the bytes actually allocated on disk), and the total."""
    sizes = {p.name: p.stat().st_blocks * 512 / 2**20 for p in pathlib.Path(directory).iterdir() if p.is_file()}
    return {**sizes, "total": sum(sizes.values())}


@dataclasses.dataclass(frozen=True)
class NpyVectors:
    """Embeddings precomputed into an [N, D] .npy file (float32 or float16), read `chunk_size` rows at a time."""

    path: str
    chunk_size: int = 32768

    def _array(self) -> np.ndarray:
        return np.load(self.path, mmap_mode="r")

    @property
    def num_vectors(self) -> int:
        return int(self._array().shape[0])

    @property
    def dim(self) -> int:
        return int(self._array().shape[1])

    @property
    def num_chunks(self) -> int:
        return -(-self.num_vectors // self.chunk_size)

    def chunk(self, i: int) -> np.ndarray:
        return np.asarray(self._array()[i * self.chunk_size:(i + 1) * self.chunk_size], np.float32)


def _chunk_rows(vectors, i: int) -> int:
    return min(vectors.chunk_size, vectors.num_vectors - i * vectors.chunk_size)


def training_sample(vectors, train_n: int, seed: int, *, progress: bool = False) -> np.ndarray:
    """[train_n, D] float32: random rows of evenly spaced chunks (a corpus in title order is not uniform, so
    the sample spans it), generating one chunk at a time. Each picked chunk gives rows in proportion to its
    size, so a short last chunk never leaves the sample short."""
    from tqdm import tqdm
    train_n = min(train_n, vectors.num_vectors)
    full = vectors.num_vectors // vectors.chunk_size
    wanted = math.ceil(train_n / vectors.chunk_size)
    pool = full if full >= wanted else vectors.num_chunks      # full chunks when they suffice
    # distinct when pool >= wanted (step >= 1); otherwise every chunk, whose rows (N) are >= train_n
    picked = np.unique(np.linspace(0, pool - 1, wanted).round().astype(int))
    sizes = np.array([_chunk_rows(vectors, int(i)) for i in picked])
    assert sizes.sum() >= train_n, (sizes.sum(), train_n)
    quota = train_n * sizes // sizes.sum()
    quota[np.argsort(-(train_n * sizes % sizes.sum()))[:train_n - quota.sum()]] += 1   # largest remainders
    rng = np.random.default_rng(seed)
    sample, filled = np.empty((train_n, vectors.dim), np.float32), 0
    for i, take in tqdm(list(zip(picked, quota)), desc="training sample", unit="chunk", disable=not progress):
        chunk = vectors.chunk(int(i))
        sample[filled:filled + take] = chunk[np.sort(rng.choice(len(chunk), take, replace=False))]
        filled += take
        del chunk
    assert filled == train_n
    return sample


def build_streamed_ivfpq(vectors, directory: str | os.PathLike, *, encoder_description: dict,
                         passages: Iterable[Passage] | None = None, corpus_path: str | os.PathLike | None = None,
                         config: DenseIndexConfig = STREAMED_DEFAULT, vector_source: dict | None = None,
                         progress: bool = True, overwrite: bool = False) -> dict:
    """Build an IVF-PQ index directory from `vectors` (see the module docstring) and return a report:
    phase times (s), peak RSS after each phase (MiB), the index shape, and the directory's size on disk.

    The corpus: `passages` (streamed into corpus.jsonl, passage i for vector i) or `corpus_path` (an existing
    wiki-18 jsonl, referenced by absolute path and scanned once). `encoder_description` is what the
    encoder's describe() returns (the manifest records it; `open_index` reloads the encoder from it).
    `vector_source`, when given, is recorded as the manifest's "vector_source" (a synthetic source's
    parameters, so a benchmark can regenerate the vectors for exact search).
    """
    import faiss
    from tqdm import tqdm
    if config.kind != "ivfpq" or config.refine_store != "disk":
        raise ValueError(f"build_streamed_ivfpq builds kind='ivfpq' with refine_store='disk', got {config}")
    if (passages is None) == (corpus_path is None):
        raise ValueError("build_streamed_ivfpq needs exactly one of passages and corpus_path")
    directory = pathlib.Path(directory)
    if directory.exists() and not overwrite:
        raise FileExistsError(f"{directory} exists; pass overwrite=True to replace it")
    n, d = vectors.num_vectors, vectors.dim
    if encoder_description.get("dim") not in (None, d):
        raise ValueError(f"the encoder embeds into {encoder_description['dim']} dims, the vectors have {d}")
    nlist, pq_m, nbits = ivfpq_shape(n, d, config)
    train_n = min(n, max(config.train_size, 39 * nlist))
    nlist, pq_m, nbits = ivfpq_shape(n, d, config, train_n)
    report = {"num_vectors": n, "dim": d, "nlist": nlist, "pq_m": pq_m, "pq_nbits": nbits, "train_n": train_n,
              "refine_dtype": config.refine_dtype, "faiss_threads": faiss.omp_get_max_threads(),
              "seconds": {}, "cpu_seconds": {}, "peak_rss_mb": {"start": peak_rss_mb()}}
    cpu_mark = [cpu_seconds()]

    def phase(name, start):
        report["seconds"][name] = round(time.perf_counter() - start, 2)
        report["cpu_seconds"][name] = round(cpu_seconds() - cpu_mark[0], 2)
        cpu_mark[0] = cpu_seconds()
        report["peak_rss_mb"][name] = round(peak_rss_mb(), 1)
        logging.info("%s: %.1fs wall, %.1fs CPU, peak RSS %.0f MiB", name, report["seconds"][name],
                     report["cpu_seconds"][name], report["peak_rss_mb"][name])

    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        start = time.perf_counter()
        if passages is not None:
            scan = corpus_store.write_corpus(passages, tmp / "corpus.jsonl", tmp)
            corpus_file = "corpus.jsonl"
        else:
            corpus_file = str(pathlib.Path(corpus_path).resolve())
            scan = corpus_store.cached_scan(corpus_file, tmp, progress=progress)
        if scan.num_passages != n:
            raise ValueError(f"the corpus has {scan.num_passages} passages for {n} vectors")
        phase("corpus", start)

        start = time.perf_counter()
        sample = training_sample(vectors, train_n, config.seed, progress=progress)
        phase("sample", start)

        start = time.perf_counter()
        quantizer = faiss.IndexFlatIP(d)
        ivf = faiss.IndexIVFPQ(quantizer, d, nlist, pq_m, nbits, faiss.METRIC_INNER_PRODUCT)
        ivf.verbose = ivf.cp.verbose = progress   # faiss prints each k-means iteration: the long step without a bar
        ivf.train(sample)
        ivf.verbose = ivf.cp.verbose = False
        del sample
        phase("train", start)

        start = time.perf_counter()
        dtype = np.dtype(config.refine_dtype)
        header = np.lib.format.open_memmap(tmp / "refine.npy", mode="w+", dtype=dtype, shape=(n, d))
        offset = header.offset
        del header                    # only the header is written now: rows are appended below, unmapped
        added = 0
        with (tmp / "refine.npy").open("r+b") as f, tqdm(total=n, desc="adding", unit="vec", unit_scale=True,
                                                          disable=not progress) as bar:
            f.seek(offset)
            for i in range(vectors.num_chunks):
                chunk = vectors.chunk(i)
                if chunk.ndim != 2 or chunk.shape[1] != d or chunk.dtype != np.float32:
                    raise ValueError(f"chunk {i}: expected float32 [rows, {d}], got {chunk.dtype} {chunk.shape}")
                ivf.add(chunk)
                chunk.astype(dtype).tofile(f)
                added += len(chunk)
                bar.update(len(chunk))
                del chunk
        if added != n:
            raise ValueError(f"the vector source yielded {added} vectors, expected {n}")
        phase("add", start)

        start = time.perf_counter()
        faiss.write_index(ivf, str(tmp / "index.faiss"))
        manifest = {"format": FORMAT, "retriever": "dense", "index_type": "ivfpq", "num_passages": n,
                    "corpus_fingerprint": scan.fingerprint, "corpus_file": corpus_file, "corpus_access": "offsets",
                    "encoder": encoder_description, "dims": d,
                    "params": dataclasses.asdict(dataclasses.replace(config, ivf_nlist=nlist, pq_m=pq_m,
                                                                     pq_nbits=nbits, train_size=train_n))}
        if vector_source is not None:
            manifest["vector_source"] = vector_source
        atomic_write_text(tmp / MANIFEST, lambda f: json.dump(manifest, f, indent=2))
        del ivf, quantizer
        _replace_dir(tmp, directory, overwrite)
        phase("write", start)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    report["seconds"]["total"] = round(sum(report["seconds"].values()), 2)
    report["cpu_seconds"]["total"] = round(sum(report["cpu_seconds"].values()), 2)
    report["disk_mb"] = {k: round(v, 1) for k, v in directory_size_mb(directory).items()}
    return report


# --- measuring a built index ------------------------------------------------------------------------------------

def measure_serving(directory: str | os.PathLike, *, batch: int = 4096, requests: int = 3, topk: int = 3,
                    recall_queries: int = 256, nprobe: int | None = None, refine_k_factor: int | None = None) -> dict:
    """Open an index directory and serve it on loopback; report the open times, queries per second at `batch`
    queries per request (through the HTTP server and client, and in-process), peak RSS, and, for a synthetic
    index (manifest "vector_source"), recall@topk and recall@10 against exact search over the regenerated
    vectors. Query texts are distinct per request, so no cache of any kind can help. `nprobe` and
    `refine_k_factor` override the index's stored search parameters."""
    from retrieval.client import HttpRetriever
    from retrieval.index import open_index, read_manifest
    from retrieval.server import serve_in_thread
    directory = pathlib.Path(directory)
    manifest = read_manifest(directory)
    report = {"directory": str(directory), "num_passages": manifest["num_passages"], "batch": batch, "topk": topk}
    stored = DenseIndexConfig(**manifest["params"])
    config = dataclasses.replace(stored, ivf_nprobe=nprobe or stored.ivf_nprobe,
                                 refine_k_factor=refine_k_factor or stored.refine_k_factor)
    report.update(nprobe=config.ivf_nprobe, refine_k_factor=config.refine_k_factor)
    start = time.perf_counter()
    index = open_index(directory, config=config)
    report["open_s"] = round(time.perf_counter() - start, 3)
    corpus_file = pathlib.Path(manifest["corpus_file"])
    corpus_file = corpus_file if corpus_file.is_absolute() else directory / corpus_file
    with tempfile.TemporaryDirectory() as scratch:   # what the first open would cost without the cache
        start, cpu_start = time.perf_counter(), cpu_seconds()
        corpus_store.scan_corpus(corpus_file, pathlib.Path(scratch) / corpus_store.OFFSETS_FILE)
        report["uncached_scan_s"] = round(time.perf_counter() - start, 3)
        report["uncached_scan_cpu_s"] = round(cpu_seconds() - cpu_start, 3)
    report["peak_rss_mb_after_open"] = round(peak_rss_mb(), 1)

    def texts(r):
        return [f"measure request {r} query {i}" for i in range(batch)]
    start, cpu_start = time.perf_counter(), cpu_seconds()
    index.search(texts(-1), topk)
    report["in_process_qps"] = round(batch / (time.perf_counter() - start), 1)
    report["in_process_qps_per_cpu_second"] = round(batch / (cpu_seconds() - cpu_start), 1)
    if index.refine is not None:
        report["cpu_seconds_per_request_by_step"] = _search_steps(index, texts(-3), topk)
    server = serve_in_thread(index)
    try:
        with HttpRetriever(server.url, timeout_s=600.0) as client:
            client.search(texts(-2)[:64], topk)        # connection and first-request costs out of the timing
            seconds, cpu_start = [], cpu_seconds()    # server and client share this process: CPU covers both
            for r in range(requests):
                start = time.perf_counter()
                hits = client.search(texts(r), topk)
                seconds.append(time.perf_counter() - start)
                assert len(hits) == batch and all(len(h) == topk for h in hits)
            cpu_used = cpu_seconds() - cpu_start
    finally:
        server.stop()
    report["http_seconds_per_request"] = [round(s, 3) for s in seconds]
    report["http_cpu_seconds_per_request"] = round(cpu_used / requests, 3)
    report["http_qps_per_cpu_second"] = round(batch / (cpu_used / requests), 1)
    report["http_qps"] = round(batch / float(np.median(seconds)), 1)
    report["peak_rss_mb"] = round(peak_rss_mb(), 1)
    report.update(_rss_split_mb())
    if "vector_source" in manifest and recall_queries:
        from retrieval.synthetic import SyntheticVectors, exact_topk
        source = SyntheticVectors(**manifest["vector_source"])
        queries = [f"recall query {i}" for i in range(recall_queries)]
        _, exact = exact_topk(source.chunks(), index.encoder.encode(queries), 10)
        for k in sorted({topk, 10}):
            hits = index.search(queries, k)
            found = [len({int(h.id) for h in row} & set(exact[j, :k].tolist())) / k for j, row in enumerate(hits)]
            report[f"recall@{k}"] = round(float(np.mean(found)), 4)
    return report


def _search_steps(index, queries: list[str], topk: int) -> dict[str, float]:
    """CPU seconds of each step of one in-process search of `queries`: encoding, the coarse quantizer alone
    (nlist inner products per query), the IVF-PQ candidate search (coarse + scanning nprobe cells), and the
    exact re-ranking from the refine store. Each scales differently with N, which is what an extrapolation needs."""
    import faiss
    from retrieval.index import refine_from_store
    steps, mark = {}, cpu_seconds()

    def lap(name):
        nonlocal mark
        steps[name] = round(cpu_seconds() - mark, 3)
        mark = cpu_seconds()
    q = index.encoder.encode(queries)
    lap("encode")
    ivf = faiss.extract_index_ivf(index.faiss_index)
    ivf.quantizer.search(q, ivf.nprobe)
    lap("coarse_quantizer")
    index.faiss_index.search(q, topk * index.config.refine_k_factor)
    lap("ivfpq_candidates")
    refine_from_store(index.faiss_index, index.refine, q, topk, index.config.refine_k_factor)
    lap("candidates_and_refine")
    steps["refine"] = round(steps.pop("candidates_and_refine") - steps["ivfpq_candidates"], 3)
    return steps

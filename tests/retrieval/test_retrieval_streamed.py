"""Wiki-18-size indexes in miniature: the streamed IVF-PQ build holds one chunk of vectors at a time and finds
what exact search finds; opening it reads neither the corpus nor its hash again unless the file changed."""

import dataclasses
import os
import pathlib
import threading
import tracemalloc
import weakref

import numpy as np
import pytest

from retrieval import corpus_store
from retrieval.index import IndexMismatchError, open_index
from retrieval.streamed import STREAMED_DEFAULT, build_streamed_ivfpq
from retrieval.synthetic import SyntheticEncoder, SyntheticVectors, synthetic_passages

N, DIM, CHUNK = 20_000, 768, 2_000
# Small PQ (32 sub-quantisers of 6 bits) and 64 cells: the test checks the machinery, not PQ quality; the
# exact re-ranking from refine.npy is what makes the final top-k.
CONFIG = dataclasses.replace(STREAMED_DEFAULT, ivf_nlist=64, ivf_nprobe=16, pq_m=32, pq_nbits=6, train_size=2_496)


class WatchedVectors:
    """SyntheticVectors whose chunks are watched: how many are alive at once (weak references), and in total."""

    def __init__(self, inner: SyntheticVectors):
        self.inner = inner
        self.num_vectors, self.dim, self.num_chunks = inner.num_vectors, inner.dim, inner.num_chunks
        self.chunk_size = inner.chunk_size
        self.lock, self.alive, self.max_alive, self.made = threading.Lock(), 0, 0, 0

    def _released(self):
        with self.lock:
            self.alive -= 1

    def chunk(self, i):
        x = self.inner.chunk(i)
        with self.lock:
            self.alive += 1
            self.made += 1
            self.max_alive = max(self.max_alive, self.alive)
        weakref.finalize(x, self._released)
        return x


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import faiss
    source = WatchedVectors(SyntheticVectors(N, DIM, seed=3, clusters=256, chunk_size=CHUNK))
    encoder = SyntheticEncoder.for_vectors(source.inner)
    directory = tmp_path_factory.mktemp("streamed") / "idx"
    threads = faiss.omp_get_max_threads()
    tracemalloc.start()
    try:
        report = build_streamed_ivfpq(source, directory, encoder_description=encoder.describe(),
                                      passages=synthetic_passages(N), config=CONFIG, progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert faiss.omp_get_max_threads() == threads
    return directory, source, encoder, report, peak


def test_build_holds_one_chunk_at_a_time(built):
    directory, source, _, report, peak = built
    assert source.max_alive == 1                      # the builder dropped each chunk before asking for the next
    assert source.made == source.num_chunks + 2       # every chunk added once, plus two sampled for training
    chunk_bytes = CHUNK * DIM * 4
    all_bytes = N * DIM * 4                           # 61 MB: what holding every vector would cost
    sample_bytes = report["train_n"] * DIM * 4
    assert peak < sample_bytes + 4 * chunk_bytes + (4 << 20) < all_bytes, (peak, all_bytes)
    assert report["train_n"] == 2_496 and report["nlist"] == 64
    files = {p.name for p in directory.iterdir()}
    assert {"index.faiss", "refine.npy", "corpus.jsonl", "manifest.json", corpus_store.CACHE_FILE,
            corpus_store.OFFSETS_FILE} <= files
    # refine.npy holds every vector (float16) in order: compare a chunk in the middle to the generator.
    refine = np.load(directory / "refine.npy", mmap_mode="r")
    assert refine.shape == (N, DIM) and refine.dtype == np.float16
    np.testing.assert_allclose(refine[5 * CHUNK:6 * CHUNK], source.inner.chunk(5), atol=1e-3)


def test_recall_against_exact_search(built):
    directory, source, encoder, _, _ = built
    index = open_index(directory)
    assert index.refine is not None and isinstance(index.passages, corpus_store.JsonlPassages)
    everything = np.concatenate(list(source.inner.chunks()))          # the reference may hold them all
    queries = [f"query {i}" for i in range(200)]
    q = encoder.encode(queries)
    exact = np.argsort(-(q @ everything.T), axis=1, kind="stable")[:, :10]
    hits = index.search(queries, 10)
    recall = np.mean([len({int(h.id) for h in row} & set(exact[j].tolist())) / 10 for j, row in enumerate(hits)])
    assert recall >= 0.95, recall
    # Scores are exact inner products (from the float16 store), best first; passages are the right rows.
    for j, row in enumerate(hits[:20]):
        ids = [int(h.id) for h in row]
        np.testing.assert_allclose([h.score for h in row], everything[ids] @ q[j], atol=2e-3)
        assert [h.score for h in row] == sorted((h.score for h in row), reverse=True)
        assert [h.title for h in row] == [f"Synthetic {i}" for i in ids]


def test_open_uses_the_cached_fingerprint(built, tmp_path, monkeypatch):
    directory, _, _, _, _ = built
    scans = []
    real_scan = corpus_store.scan_corpus
    monkeypatch.setattr(corpus_store, "scan_corpus", lambda *a, **k: scans.append(a) or real_scan(*a, **k))
    open_index(directory)
    assert scans == []                               # built with its cache: nothing re-read or re-hashed
    # A copy of the directory (copy2 keeps mtimes) keeps the cache valid: the corpus is named relative to it.
    import shutil
    moved = tmp_path / "moved"
    shutil.copytree(directory, moved)
    open_index(moved)
    assert scans == []
    # Touching the corpus (same bytes, new mtime) invalidates the cache: scanned once, then cached again.
    corpus = moved / "corpus.jsonl"
    stat = corpus.stat()
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    open_index(moved)
    open_index(moved)
    assert len(scans) == 1
    # Changed bytes: the fresh scan's fingerprint differs from the manifest's and the index is refused.
    lines = corpus.read_text().splitlines()
    lines[7] = lines[7].replace("synthetic passage 7", "synthetic passage 7!")
    corpus.write_text("\n".join(lines) + "\n")
    with pytest.raises(IndexMismatchError, match="has changed since the index was built"):
        open_index(moved)


def test_lazy_passages_match_the_file(built):
    directory, _, _, _, _ = built
    scan = corpus_store.cached_scan(directory / "corpus.jsonl", directory)
    lazy = corpus_store.JsonlPassages(directory / "corpus.jsonl", scan.offsets_path)
    from retrieval.corpus import corpus_fingerprint, read_jsonl_corpus
    eager = read_jsonl_corpus(directory / "corpus.jsonl")
    assert len(lazy) == len(eager) == N
    assert [lazy[i] for i in (0, 1, 9_999, N - 1, -1)] == [eager[i] for i in (0, 1, 9_999, N - 1, -1)]
    assert scan.fingerprint == corpus_fingerprint(eager)
    with pytest.raises(IndexError):
        lazy[N]


def test_scan_handles_blank_lines_and_names_bad_rows(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "contents": "\\"A\\"\\nfirst"}\n\n{"id": "b", "contents": "\\"B\\"\\nsecond"}')
    scan = corpus_store.cached_scan(path, tmp_path)
    lazy = corpus_store.JsonlPassages(path, scan.offsets_path)
    assert [(p.id, p.title, p.text) for p in lazy] == [("a", "A", "first"), ("b", "B", "second")]
    path.write_text('{"id": "a", "contents": "x"}\n{"id": "b"}\n')
    with pytest.raises(ValueError, match=rf"{path}:2: missing field 'contents'"):
        corpus_store.cached_scan(path, tmp_path)


def test_build_refuses_a_corpus_of_another_size(tmp_path):
    source = SyntheticVectors(500, 16, clusters=4, chunk_size=100)
    with pytest.raises(ValueError, match="the corpus has 499 passages for 500 vectors"):
        build_streamed_ivfpq(source, tmp_path / "idx", encoder_description=SyntheticEncoder(16).describe(),
                             passages=synthetic_passages(499), progress=False,
                             config=dataclasses.replace(CONFIG, ivf_nlist=4, pq_m=4, train_size=156))
    assert not (tmp_path / "idx").exists() and [p.name for p in tmp_path.iterdir()] == []
    assert pathlib.Path(tmp_path).exists()


def test_build_index_streamed_entry_point(tmp_path):
    """The documented rehearsal commands, shrunk: build, then measure in a fresh process (JSON reports)."""
    import json
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parents[2]
    out = tmp_path / "synthetic"
    build = subprocess.run([sys.executable, "-m", "launch.build_index", "--kind=ivfpq", "--synthetic_vectors=6000",
                            "--dim=64", "--clusters=64", "--chunk_size=1000", "--pq_m=8", "--ivf_nlist=16",
                            "--faiss_threads=1", "--noprogress", f"--out_dir={out}"],
                           capture_output=True, text=True, timeout=300, cwd=root)
    assert build.returncode == 0, build.stderr[-2000:]
    report = json.loads(build.stdout.strip().splitlines()[-1])
    assert report["num_vectors"] == 6000 and report["nlist"] == 16 and report["train_n"] == 6000
    assert set(report["seconds"]) >= {"sample", "train", "add", "total"} and report["peak_rss_mb"]["add"] > 0
    assert report["disk_mb"]["total"] > 0
    measure = subprocess.run([sys.executable, "-m", "launch.build_index", f"--out_dir={out}", "--measure_only",
                              "--qps_batch=600", "--qps_requests=2", "--recall_queries=50", "--faiss_threads=1",
                              f"--report_json={tmp_path / 'measure.json'}"],
                             capture_output=True, text=True, timeout=300, cwd=root)
    assert measure.returncode == 0, measure.stderr[-2000:]
    figures = json.loads((tmp_path / "measure.json").read_text())
    assert figures == json.loads(measure.stdout.strip().splitlines()[-1])
    assert figures["http_qps"] > 0 and len(figures["http_seconds_per_request"]) == 2
    assert figures["recall@10"] >= 0.9 and figures["recall@3"] >= 0.9

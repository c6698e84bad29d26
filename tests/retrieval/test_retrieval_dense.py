"""Dense retrieval: recall on the default questions, ANN kinds against Flat, index directories and manifests."""

import dataclasses
import json

import numpy as np
import pytest

from retrieval.index import (DenseIndex, DenseIndexConfig, IndexMismatchError, build_faiss, open_index,
                             read_manifest, save_index)


def _recall(results, questions):
    return float(np.mean([any(h.title == q.gold_title for h in hits) for hits, q in zip(results, questions)]))


@pytest.mark.heavy
def test_dense_recall_at_3_on_sample(dense_sample_index, dense_sample, questions):
    results = dense_sample_index.search([q.question for q in questions], topk=3)
    recall = _recall(results, questions)
    rng = np.random.default_rng(0)
    random_hits = [[dense_sample[i] for i in rng.choice(len(dense_sample), 3, replace=False)] for _ in questions]
    baseline = _recall(random_hits, questions)
    assert recall >= 0.9, recall
    assert recall - baseline >= 0.8, (recall, baseline)
    # Scores are cosine similarities of unit vectors, best first.
    for hits in results:
        assert len(hits) == 3 and all(1.0001 >= a.score >= b.score for a, b in zip(hits, hits[1:]))


def test_flat_scores_are_inner_products_of_the_encoder(dense_sample_index, minilm):
    query = "What is the capital of China?"
    hits = dense_sample_index.search([query], topk=5)[0]
    q = minilm.encode([query], is_query=True)[0]
    p = minilm.encode([h.contents for h in hits])
    # In bfloat16 a passage's embedding depends on the shape of the batch it was encoded in (XLA:CPU picks the
    # products' kernels by shape): 4.7e-4 apart here, within bf16's 2^-9.
    np.testing.assert_allclose([h.score for h in hits], p @ q, atol={"float32": 1e-5, "bfloat16": 2e-3}[
        minilm.config.dtype])


@pytest.mark.parametrize("kind", ["hnsw", "ivfpq"])
def test_approximate_indexes_recall_against_flat(dense_sample_index, questions, minilm, kind):
    flat = dense_sample_index.faiss_index
    vectors = flat.reconstruct_n(0, flat.ntotal)
    queries = np.concatenate([minilm.encode([q.question for q in questions], is_query=True), vectors[::20] + 0.0])
    _, truth = flat.search(queries, 10)
    approx = build_faiss(vectors, DenseIndexConfig(kind=kind, ivf_nprobe=16, refine_k_factor=8))
    _, found = approx.search(queries, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, truth)])
    assert recall >= 0.9, (kind, recall)


@pytest.fixture(scope="module")
def small_dense_dir(tmp_path_factory, dense_sample_index, dense_sample, minilm):
    flat = dense_sample_index.faiss_index      # reuse the sample's embeddings: no second encoding pass
    index = DenseIndex.from_vectors(dense_sample[:64], minilm, flat.reconstruct_n(0, 64),
                                    DenseIndexConfig(kind="hnsw", hnsw_ef_search=32))
    directory = save_index(index, tmp_path_factory.mktemp("dense") / "idx")
    return directory, index


def test_dense_index_round_trip(small_dense_dir, minilm, dense_sample):
    directory, index = small_dense_dir
    manifest = read_manifest(directory)
    assert manifest["index_type"] == "hnsw" and manifest["dims"] == 384 and manifest["num_passages"] == 64
    assert manifest["encoder"]["name"] == "all-MiniLM-L6-v2" and manifest["params"]["hnsw_ef_search"] == 32
    queries = ["a famous scientist", "a city in asia"]
    loaded = open_index(directory, encoder=minilm, corpus=dense_sample[:64])
    assert loaded.faiss_index.hnsw.efSearch == 32
    assert loaded.search(queries, 4) == index.search(queries, 4)
    reloaded = open_index(directory)            # encoder reloaded from the path the manifest records
    assert [[h.id for h in r] for r in reloaded.search(queries, 4)] == [[h.id for h in r] for r in index.search(queries, 4)]


def test_manifest_mismatch_is_refused(small_dense_dir, minilm, dense_sample, tmp_path):
    directory, _ = small_dense_dir
    other_encoder = dataclasses.replace(minilm, config=dataclasses.replace(
        minilm.config, name="e5-small-v2", query_prefix="query: ", passage_prefix="passage: "))
    with pytest.raises(IndexMismatchError, match="another encoder.*name: index has 'all-MiniLM-L6-v2'"):
        open_index(directory, encoder=other_encoder)
    with pytest.raises(IndexMismatchError, match="another corpus"):
        open_index(directory, encoder=minilm, corpus=dense_sample[1:65])
    # A corpus file edited after the build no longer matches the fingerprint.
    import shutil
    edited = tmp_path / "edited"
    shutil.copytree(directory, edited)
    lines = (edited / "corpus.jsonl").read_text().splitlines()
    record = json.loads(lines[3])
    record["contents"] += " (edited)"
    lines[3] = json.dumps(record)
    (edited / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(IndexMismatchError, match="has changed since the index was built"):
        open_index(edited, encoder=minilm)
    (edited / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError, match="not a searchjax index directory"):
        open_index(edited)


class _CountingEncoder:
    """Wraps an encoder and counts the passages it embeds (queries are not counted)."""

    def __init__(self, inner):
        self.inner, self.passages_encoded = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, texts, *, is_query=False):
        self.passages_encoded += 0 if is_query else len(texts)
        return self.inner.encode(texts, is_query=is_query)


def test_default_index_is_built_once_and_keyed_by_corpus(monkeypatch, tmp_path, dense_sample, minilm):
    """default_index caches under <cache>/indexes in a directory named by what the manifest validates: a
    second process (fresh memo) opens it without encoding; HNSW reuses the Flat vectors; another corpus
    gets its own directory instead of a refused or stale index."""
    import retrieval.index as index_module
    import searchjax.models.encoder as encoder_module
    from retrieval.bm25 import BM25Index
    encoder = _CountingEncoder(minilm)
    passages = dense_sample[:48]
    monkeypatch.setenv("SEARCHJAX_CACHE", str(tmp_path))
    monkeypatch.setattr(index_module, "default_corpus", lambda: passages)
    monkeypatch.setattr(encoder_module, "load_encoder", lambda *a, **k: encoder)
    monkeypatch.setattr(index_module, "_DEFAULT_INDEXES", {})
    flat = index_module.default_index("dense")
    assert encoder.passages_encoded == 48
    hnsw = index_module.default_index("dense", index_type="hnsw")
    assert encoder.passages_encoded == 48 and hnsw.config.kind == "hnsw"      # built from Flat's stored vectors
    bm25 = index_module.default_index("bm25")
    names = sorted(p.name for p in (tmp_path / "indexes").iterdir())
    fingerprint = index_module.corpus_fingerprint(passages)[:12]
    assert len(names) == 3 and all(n.endswith(fingerprint) for n in names), names
    assert {read_manifest(tmp_path / "indexes" / n)["index_type"] for n in names} == {"flat", "hnsw", "bm25"}

    monkeypatch.setattr(index_module, "_DEFAULT_INDEXES", {})                 # as a new process would start
    monkeypatch.setattr(BM25Index, "build", classmethod(lambda *a, **k: pytest.fail("BM25 rebuilt")))
    queries = ["a famous scientist", "a city in asia"]
    assert index_module.default_index("dense").search(queries, 3) == flat.search(queries, 3)
    assert index_module.default_index("dense", index_type="hnsw").search(queries, 3) == hnsw.search(queries, 3)
    assert index_module.default_index("bm25").search(queries, 3) == bm25.search(queries, 3)
    assert encoder.passages_encoded == 48

    monkeypatch.setattr(index_module, "_DEFAULT_INDEXES", {})
    monkeypatch.setattr(index_module, "default_corpus", lambda: passages[:40])
    assert index_module.default_index("dense").size == 40 and encoder.passages_encoded == 88
    assert len(list((tmp_path / "indexes").iterdir())) == 4

"""BM25: scores against the Lucene formula by hand, recall on the default question set, persistence."""

import math
import pathlib

import numpy as np
import pytest

from retrieval.bm25 import BM25Index, tokenize
from retrieval.corpus import Passage


def recall_at_k(results, questions):
    """Fraction of questions whose gold article is among the hits."""
    return float(np.mean([any(h.title == q.gold_title for h in hits) for hits, q in zip(results, questions)]))


def random_recall_at_k(passages, questions, k, seed=0):
    """Recall of a retriever that returns k passages uniformly at random."""
    rng = np.random.default_rng(seed)
    hits = [[passages[i] for i in rng.choice(len(passages), k, replace=False)] for _ in questions]
    return recall_at_k(hits, questions)


def test_scores_match_lucene_bm25_by_hand():
    passages = [Passage("0", "Alpha", "alpha beta beta gamma"), Passage("1", "Beta", "gamma delta"),
                Passage("2", "Gamma", "alpha alpha alpha epsilon zeta the and of")]
    k1, b = 0.9, 0.4
    index = BM25Index.build(passages, k1=k1, b=b)
    docs = tokenize([p.contents for p in passages])
    assert docs[2] == ["gamma", "alpha", "alpha", "alpha", "epsilon", "zeta"]   # lowercased, stop words gone
    avgdl = sum(map(len, docs)) / len(docs)

    def lucene(query_terms, doc):
        score = 0.0
        for t in query_terms:
            df = sum(t in d for d in docs)
            tf = doc.count(t)
            idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
            score += idf * tf / (tf + k1 * (1 - b + b * len(doc) / avgdl))
        return score

    hits = index.search(["Alpha GAMMA?"], topk=3)[0]
    expected = sorted(((lucene(["alpha", "gamma"], d), str(i)) for i, d in enumerate(docs)), reverse=True)
    assert [h.id for h in hits] == [i for _, i in expected]
    np.testing.assert_allclose([h.score for h in hits], [s for s, _ in expected], rtol=1e-5)
    # No shared term -> no hit; topk beyond the corpus is clamped.
    assert index.search(["the of and", "unknownword", "delta"], topk=10) == [[], [], index.search(["delta"], 1)[0]]
    assert [h.id for h in index.search(["delta"], topk=10)[0]] == ["1"]


def test_bm25_recall_at_3_on_default_questions(bm25_full, corpus, questions):
    results = bm25_full.search([q.question for q in questions], topk=3)
    recall = recall_at_k(results, questions)
    baseline = random_recall_at_k(corpus, questions, 3)
    assert recall >= 0.6, recall
    assert recall - baseline >= 0.5, (recall, baseline)
    assert all(len(hits) <= 3 and all(a.score >= b.score for a, b in zip(hits, hits[1:])) for hits in results)


def test_bm25_round_trip_through_index_dir(tmp_path, bm25_full, corpus):
    from retrieval.index import open_index, read_manifest, save_index
    small = BM25Index.build(corpus[:500])
    save_index(small, tmp_path / "bm25")
    manifest = read_manifest(tmp_path / "bm25")
    assert manifest["index_type"] == "bm25" and manifest["num_passages"] == 500 and manifest["encoder"] is None
    loaded = open_index(tmp_path / "bm25", corpus=corpus[:500])
    queries = ["capital city of a country", "famous painting", "river in europe"]
    assert loaded.search(queries, 5) == small.search(queries, 5)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_index(small, tmp_path / "bm25")


def test_default_bm25_index_is_cached_on_disk(corpus, monkeypatch, tmp_path, caplog):
    """The cache directory is the one `default_index` itself uses (`default_index_dir`); a second call in a
    new process (the in-memory memo cleared) opens it without building, and a damaged cache is rebuilt."""
    import logging
    from retrieval import default_index, open_index
    from retrieval import index as index_lib
    from retrieval.index import default_index_dir, read_manifest
    monkeypatch.setenv("SEARCHJAX_CACHE", str(tmp_path))          # a cache of this test's own
    monkeypatch.setattr(index_lib, "_DEFAULT_INDEXES", {})
    index = default_index("bm25")
    assert default_index("bm25") is index and index.size == len(corpus) == 10033
    directory = default_index_dir("bm25", corpus)
    assert directory.parent == tmp_path / "indexes" and directory.is_dir()
    assert [p.name for p in (tmp_path / "indexes").iterdir()] == [directory.name]
    assert read_manifest(directory)["num_passages"] == 10033
    queries = ["tallest mountain on earth", "inventor of the telephone"]
    expected = index.search(queries, 3)
    assert open_index(directory, corpus=corpus).search(queries, 3) == expected

    def refuse_build(*args, **kwargs):
        raise AssertionError("the cached index was rebuilt instead of reused")
    monkeypatch.setattr(index_lib, "_DEFAULT_INDEXES", {})          # as in a new process
    with monkeypatch.context() as m:
        m.setattr(index_lib.BM25Index, "build", refuse_build)
        assert default_index("bm25").search(queries, 3) == expected

    (directory / "manifest.json").write_text("{ torn")              # a damaged cache
    monkeypatch.setattr(index_lib, "_DEFAULT_INDEXES", {})
    with caplog.at_level(logging.WARNING, logger=index_lib.__name__):
        rebuilt = default_index("bm25")
    assert "rebuilding the cached index" in caplog.text
    assert rebuilt.search(queries, 3) == expected
    assert read_manifest(directory)["num_passages"] == 10033        # written back whole


def test_build_index_entry_point(tmp_path, corpus):
    """launch/build_index.py end to end (a subprocess: absl flags are process-global)."""
    import subprocess
    import sys
    from retrieval.corpus import write_jsonl_corpus
    from retrieval.index import open_index
    source = write_jsonl_corpus(corpus[:300], tmp_path / "small.jsonl")
    out = tmp_path / "idx"
    done = subprocess.run([sys.executable, "-m", "launch.build_index", f"--out_dir={out}", "--kind=bm25",
                           f"--corpus={source}", "--reference_corpus"], capture_output=True, text=True, timeout=300,
                          cwd=pathlib.Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "built bm25 index over 300 passages" in done.stdout
    index = open_index(out, corpus=source)
    assert index.search(["music"], 2) == BM25Index.build(corpus[:300]).search(["music"], 2)
    assert not (out / "corpus.jsonl").exists()        # referenced, not copied

"""Session fixtures for the retrieval tests: the default corpus and questions, the full BM25 index,
MiniLM, and a dense index over the gold articles plus a fixed sample of 2,000 other extracts
(encoding all 10,033 extracts takes minutes on 2 cores; the full-corpus figure is a benchmark)."""

import numpy as np
import pytest

DENSE_SAMPLE_OTHERS = 2000
DENSE_SAMPLE_SEED = 0


@pytest.fixture(scope="session", autouse=True)
def _faiss_single_thread():
    """faiss's OpenMP threads spin-wait: on a shared 2-core machine 2 threads built an IVF-PQ index 9x slower
    than 1. The tests check results, not speed, so they run faiss on one thread."""
    import faiss
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(previous)


@pytest.fixture(scope="session")
def corpus():
    from retrieval.corpus import default_corpus
    return default_corpus()


@pytest.fixture(scope="session")
def questions():
    from searchjax.data.default_questions import default_questions
    return default_questions()


@pytest.fixture(scope="session")
def bm25_full(corpus):
    from retrieval.bm25 import BM25Index
    return BM25Index.build(corpus)


@pytest.fixture(scope="session")
def minilm(minilm_dir):
    from searchjax.models.encoder import load_encoder
    return load_encoder(minilm_dir, preset="all-minilm-l6-v2")


@pytest.fixture(scope="session")
def dense_sample(corpus, questions):
    """Passages: every gold article plus 2,000 others drawn with a fixed seed, in corpus order."""
    gold = {q.gold_title for q in questions}
    others = [i for i, p in enumerate(corpus) if p.title not in gold]
    picked = set(np.random.default_rng(DENSE_SAMPLE_SEED).choice(others, DENSE_SAMPLE_OTHERS, replace=False).tolist())
    return [p for i, p in enumerate(corpus) if p.title in gold or i in picked]


@pytest.fixture(scope="session")
def dense_sample_index(dense_sample, minilm):
    """Flat inner-product index over the sample, built once per session."""
    from retrieval.index import DenseIndex, DenseIndexConfig
    return DenseIndex.build(dense_sample, minilm, DenseIndexConfig(kind="flat"))

"""Fixtures for the CCS tests: the spaCy NER, the MiniLM embedder, the BM25 default index (one each, session
scoped); the SmolLM2 tokenizer comes from the lead's `smollm2` fixture. Trajectory builders live in
ccs_helpers.py."""

import pytest


@pytest.fixture(scope="session")
def spacy_ner():
    from searchjax.rewards.ner import SpacyNer
    return SpacyNer()


@pytest.fixture(scope="session")
def minilm(minilm_dir):
    from searchjax.models.encoder import load_encoder
    return load_encoder(dtype="float32")  # the rewards are compared with sentence-transformers' at 1e-4


@pytest.fixture(scope="session")
def bm25():
    from retrieval import default_index
    return default_index("bm25")


@pytest.fixture(scope="session")
def tokenizer(smollm2):
    return smollm2[2]

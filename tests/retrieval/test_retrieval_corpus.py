"""Corpus files, the default corpus and question set, and Search-R1's passage format."""

import hashlib
import json
import pathlib

import pytest

from retrieval.corpus import (Hit, Passage, corpus_fingerprint, default_corpus_path, format_passages,
                              read_jsonl_corpus, write_jsonl_corpus)


def _search_r1_passages2string(retrieval_result):
    """Search-R1's formatting, as in its inference script (reference, written out independently)."""
    format_reference = ""
    for idx, doc_item in enumerate(retrieval_result):
        content = doc_item["document"]["contents"]
        title = content.split("\n")[0]
        text = "\n".join(content.split("\n")[1:])
        format_reference += f"Doc {idx+1}(Title: {title}) {text}\n"
    return format_reference


def test_default_corpus_is_wiki18_jsonl_of_every_extract(corpus):
    from searchjax.data import assets
    raw = json.loads(assets.wiki_summaries_json().read_text())
    assert len(corpus) == len(raw) == 10033
    path = default_corpus_path()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 10033
    first = json.loads(lines[0])
    assert set(first) == {"id", "contents"}
    entry = next(iter(raw.values()))
    assert first["contents"] == f'"{entry["title"]}"\n{entry["extract"].strip()}'
    assert len({p.id for p in corpus}) == len(corpus)
    assert {p.title for p in corpus} == {v["title"] for v in raw.values()}
    assert not list(path.parent.glob(".*.tmp"))   # atomic write left no temporary file


def test_jsonl_round_trip_and_fingerprint(tmp_path):
    passages = [Passage("a", "Title One", "text one\nsecond line"), Passage("7", 'Quote "x"', "ü text")]
    path = write_jsonl_corpus(passages, tmp_path / "c.jsonl")
    assert read_jsonl_corpus(path) == passages
    h = hashlib.sha256()
    for p in passages:
        h.update(f"{p.id}\0{p.contents}\0".encode())
    assert corpus_fingerprint(passages) == h.hexdigest()
    assert corpus_fingerprint(passages[::-1]) != corpus_fingerprint(passages)


def test_bad_jsonl_lines_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "1", "contents": "\\"T\\"\\nx"}\n{"id": 2}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: missing field 'contents'"):
        read_jsonl_corpus(path)
    path.write_text('{"id": "1", "contents": "x"}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not valid JSON"):
        read_jsonl_corpus(path)
    path.write_text('{"id": "1", "contents": "x"}\n{"id": "1", "contents": "y"}\n')
    with pytest.raises(ValueError, match="duplicate passage id '1'"):
        read_jsonl_corpus(path)


def test_format_passages_matches_search_r1():
    hits = [Hit("3", "Paris", "Paris is the capital of France.", 0.9),
            Hit("8", "Multi line", "first\nsecond", 0.5)]
    reference = _search_r1_passages2string([{"document": {"id": h.id, "contents": h.contents}} for h in hits])
    assert format_passages(hits) == reference
    assert format_passages(hits) == ('Doc 1(Title: "Paris") Paris is the capital of France.\n'
                                     'Doc 2(Title: "Multi line") first\nsecond\n')


def test_default_question_set_rule(corpus, questions):
    from searchjax.data.default_questions import default_questions
    assert len(questions) == 75
    assert len(default_questions(deduplicate=False)) == 83
    assert len({q.id for q in questions}) == 75
    extracts = {p.title: p.text for p in corpus}
    for q in questions:
        assert q.gold_title in extracts
        assert len(q.golden_answers) == 1 and q.golden_answers[0].lower() in extracts[q.gold_title].lower()
    by_question = {q.question: q for q in questions}
    assert by_question["What is the capital of China?"].golden_answers == ("Beijing",)
    assert by_question["What is the headquarter of Apple?"].gold_title == "Apple Inc."


def test_package_import_is_lazy():
    """`import retrieval` must not pull in bm25s / jax / faiss (seconds); the public names still resolve."""
    import subprocess
    import sys
    code = ("import sys, retrieval\n"
            "heavy = sorted(m for m in ('bm25s', 'jax', 'faiss', 'scipy', 'torch') if m in sys.modules)\n"
            "assert not heavy, heavy\n"
            "from retrieval import open_index, default_index, BM25Index, Hit, Passage, format_passages\n"
            "import retrieval.bm25, retrieval.index, retrieval.client\n"
            "assert not [m for m in ('bm25s', 'jax') if m in sys.modules]\n"
            "assert retrieval.open_index is retrieval.index.open_index and 'default_index' in dir(retrieval)\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=pathlib.Path(__file__).resolve().parents[2])
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    import retrieval
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        retrieval.not_a_name

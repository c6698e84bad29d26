"""Wikidata5M and wiki-18 readers, alias normalisation, grounding, and the CSR relation graph for Dr.Free.

Dr.Free's proposer is given a relational chain e0 -r1-> e1 ... -rh-> eh sampled from Wikidata5M, each
entity aligned to a wiki-18 article. This module turns the upstream files into the arrays the chain
sampler (`searchjax.drfree.chains`) walks over; it holds no sampling policy.

Upstream layouts (Wikidata5M, Wang et al. 2021; wiki-18, the DPR dump Search-R1 serves):

    wikidata5m_transductive_train.txt, wikidata5m_all_triplet.txt   Q29387131<TAB>P31<TAB>Q5
    wikidata5m_entity.txt                                           Q5<TAB>human<TAB>humans<TAB>...
    wikidata5m_relation.txt                                         P31<TAB>instance of<TAB>is a<TAB>...
    wiki-18 jsonl (retrieval.corpus)                  {"id": "0", "contents": "\\"Aaron\\"\\nAaron is ..."}

A malformed line raises `MalformedLineError` naming the file and the 1-based line number. Blank lines
are skipped; empty alias fields are ignored; an id line with no alias at all is malformed.

Memory stays flat on Wikidata5M-sized inputs (20M triples, 4.8M entities, 21M passages): files are
streamed once; nothing holds a Python object per triple, alias or passage. What is kept:

- passages: one dict title -> index (the only per-title Python objects) and, per passage, an int64 byte
  offset into the jsonl file, grouped by title (CSR); passage text is re-read from disk on demand.
- aliases: per alias a 64-bit hash of its normalised form and its line index (12 bytes), joined against
  the normalised titles with numpy; per groundable entity the byte offset of its alias line, from which
  `entity_aliases` re-reads the strings on demand.
- triples: only those of the whitelisted relations whose head is groundable, as int arrays (CSR).

Hashes are Python's `hash(str)`, consistent within one process, which is all they are used for (none
is written out). A 64-bit collision among ~2e7 alias and title keys (probability ~1e-5 on Wikidata5M)
would mark an alias ambiguous or match a wrong title.
"""

from __future__ import annotations

import array
import dataclasses
import functools
import json
import os
import pathlib
import re
import unicodedata
from typing import Iterator, Sequence

import numpy as np
from tqdm import tqdm

from retrieval.corpus import Passage, passage_from_record

PathLike = str | os.PathLike


class MalformedLineError(ValueError):
    """A line of an upstream file that does not follow its layout; the message is `path:line: reason`."""

    def __init__(self, path: PathLike, line_no: int, reason: str):
        super().__init__(f"{path}:{line_no}: {reason}")
        self.path, self.line_no, self.reason = str(path), line_no, reason


# --- normalisation and mentions ----------------------------------------------------------------------

_TRAILING_PARENS = re.compile(r"(?:\s*\([^()]*\))+\s*$")
_TRIPLE_LINE = re.compile(rb"Q([0-9]+)\tP([0-9]+)\tQ([0-9]+)\r?\n?")


def normalize_text(text: str) -> str:
    """NFKD, combining marks dropped, lowercased, whitespace runs collapsed to one space, stripped.

    Dropping combining marks folds accents ("Zürich" == "Zurich"): Wikidata labels and Wikipedia text
    disagree on diacritics, and a combining mark left in place would put a spurious word boundary inside
    a word. Punctuation is kept, so aliases such as "AC/DC" or "C++" stay distinct. ASCII text (most
    aliases) is unchanged by NFKD and skips it.
    """
    if not text.isascii():
        decomposed = unicodedata.normalize("NFKD", text)
        text = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " ".join(text.lower().split())


def normalize_alias(alias: str) -> str:
    """An alias or title as a lookup key: trailing parenthetical disambiguation stripped, then `normalize_text`.

    "Paris (mythology)" -> "paris"; "Mercury (planet)" and "Mercury (element)" share the key "mercury",
    which is how disambiguated homonyms become ambiguous. Only trailing groups are stripped: a
    parenthesis inside a name ("The (International) Noise Conspiracy") is part of it.
    """
    if ")" in alias:
        alias = _TRAILING_PARENS.sub("", alias)
    return normalize_text(alias)


@functools.lru_cache(maxsize=65536)
def _word_pattern(key: str) -> re.Pattern:
    return re.compile(r"(?<!\w)" + re.escape(key) + r"(?!\w)")


def mentions_alias(normalized_text: str, keys: Sequence[str]) -> bool:
    """Whether any normalised alias key occurs in `normalized_text` on word boundaries.

    Both sides must already be normalised (`normalize_text` for the text, `normalize_alias` for keys).
    A word boundary means the characters just outside the match are not word characters (`\\w`), so
    "ash" is found in "the ash tree" and "ash, oak" but not in "ashford".
    """
    return any(key and _word_pattern(key).search(normalized_text) for key in keys)


# --- streaming readers -------------------------------------------------------------------------------

def _iter_raw_lines(path: PathLike, desc: str, progress: bool) -> Iterator[tuple[int, int, bytes]]:
    """(1-based line number, byte offset, raw line) for every line of `path`, with a byte progress bar."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file ({desc})")
    with path.open("rb") as f, tqdm(total=path.stat().st_size, unit="B", unit_scale=True, desc=desc,
                                     disable=not progress, leave=False) as bar:
        offset, pending = 0, 0
        for line_no, raw in enumerate(f, start=1):
            yield line_no, offset, raw
            offset += len(raw)
            pending += len(raw)
            if pending >= 1 << 22:
                bar.update(pending)
                pending = 0
        bar.update(pending)


def _decode(raw: bytes, path: PathLike, line_no: int) -> str:
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
        raise MalformedLineError(path, line_no, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None


def _parse_id(token: str, prefix: str, path: PathLike, line_no: int, field: str) -> int:
    """'Q42' -> 42 (prefix 'Q') or 'P31' -> 31 (prefix 'P'); anything else is malformed."""
    digits = token[1:]
    if token[:1] != prefix or not digits or not digits.isascii() or not digits.isdigit():
        raise MalformedLineError(path, line_no, f"{field} {token!r} is not a Wikidata id of the form {prefix}<digits>")
    return int(digits)


def iter_triples(path: PathLike, *, progress: bool = False) -> Iterator[tuple[int, int, int]]:
    """(head, relation, tail) as Wikidata numbers (Q42 -> 42, P31 -> 31) from a `head<TAB>relation<TAB>tail` file.

    Well-formed lines take one bytes-regex match (the 20M lines of Wikidata5M are the hot loop); any
    other line goes through the field-by-field parser, which names what is wrong.
    """
    for line_no, _, raw in _iter_raw_lines(path, f"triples {pathlib.Path(path).name}", progress):
        match = _TRIPLE_LINE.fullmatch(raw)
        if match:
            yield int(match[1]), int(match[2]), int(match[3])
            continue
        text = _decode(raw, path, line_no)
        if not text.strip():
            continue
        fields = text.split("\t")
        if len(fields) != 3:
            raise MalformedLineError(path, line_no, f"expected 3 tab-separated fields (head, relation, tail), "
                                                    f"got {len(fields)}")
        yield (_parse_id(fields[0], "Q", path, line_no, "head"), _parse_id(fields[1], "P", path, line_no, "relation"),
               _parse_id(fields[2], "Q", path, line_no, "tail"))


@dataclasses.dataclass(frozen=True)
class AliasLine:
    """One line of wikidata5m_entity.txt / wikidata5m_relation.txt: the id's number, its aliases (first = label)."""

    number: int
    aliases: tuple[str, ...]
    line_no: int
    offset: int


def _parse_alias_line(text: str, prefix: str, path: PathLike, line_no: int, offset: int) -> AliasLine:
    fields = text.split("\t")
    number = _parse_id(fields[0], prefix, path, line_no, "id")
    aliases = tuple(a.strip() for a in fields[1:] if a.strip())
    if not aliases:
        raise MalformedLineError(path, line_no, f"id {fields[0]!r} has no alias (expected id<TAB>alias1<TAB>...)")
    return AliasLine(number, aliases, line_no, offset)


def iter_alias_lines(path: PathLike, prefix: str, *, progress: bool = False) -> Iterator[AliasLine]:
    """Stream an alias file: prefix 'Q' for wikidata5m_entity.txt, 'P' for wikidata5m_relation.txt."""
    if prefix not in ("Q", "P"):
        raise ValueError(f"prefix must be 'Q' (entities) or 'P' (relations), got {prefix!r}")
    for line_no, offset, raw in _iter_raw_lines(path, f"aliases {pathlib.Path(path).name}", progress):
        text = _decode(raw, path, line_no)
        if text.strip():
            yield _parse_alias_line(text, prefix, path, line_no, offset)


def read_alias_line_at(path: PathLike, offset: int, prefix: str) -> AliasLine:
    """Re-read the alias line starting at byte `offset` (as recorded by `iter_alias_lines`)."""
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.readline()
    return _parse_alias_line(_decode(raw, path, -1), prefix, path, -1, offset)


def read_relation_labels(path: PathLike) -> dict[int, str]:
    """Relation number -> label (the first alias) from wikidata5m_relation.txt (822 lines upstream)."""
    labels: dict[int, str] = {}
    for line in iter_alias_lines(path, "P"):
        labels.setdefault(line.number, line.aliases[0])
    return labels


# --- wiki-18 title -> passages ------------------------------------------------------------------------

@dataclasses.dataclass
class PassageMap:
    """wiki-18 titles and, per title, the byte offsets of its passages in the jsonl file (CSR).

    titles[i] is the i-th distinct title in file order; passages of title i are at
    offsets[indptr[i]:indptr[i + 1]], in file order.
    """

    path: pathlib.Path
    titles: list[str]
    title_index: dict[str, int]
    indptr: np.ndarray   # [n_titles + 1] int64
    offsets: np.ndarray  # [n_passages] int64

    def passages_of(self, title: int) -> list[Passage]:
        """The passages of title index `title`, read from disk."""
        out = []
        with open(self.path, "rb") as f:
            for offset in self.offsets[self.indptr[title]:self.indptr[title + 1]]:
                f.seek(int(offset))
                raw = f.readline()
                out.append(passage_from_record(json.loads(raw), f"{self.path}@{int(offset)}"))
        return out


def read_passage_map(path: PathLike, *, progress: bool = False) -> PassageMap:
    """Stream a wiki-18 jsonl corpus into a `PassageMap` (records parsed by `retrieval.corpus`)."""
    path = pathlib.Path(path)
    title_index: dict[str, int] = {}
    titles: list[str] = []
    passage_title, passage_offset = array.array("i"), array.array("q")
    for line_no, offset, raw in _iter_raw_lines(path, f"corpus {path.name}", progress):
        if not raw.strip():
            continue
        where = f"{path}:{line_no}"
        try:
            record = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise MalformedLineError(path, line_no, f"not valid JSON ({e})") from None
        try:
            title = passage_from_record(record, where).title
        except ValueError as e:
            raise MalformedLineError(path, line_no, str(e).removeprefix(where + ": ")) from None
        index = title_index.get(title)
        if index is None:
            index = title_index[title] = len(titles)
            titles.append(title)
        passage_title.append(index)
        passage_offset.append(offset)
    owner = np.frombuffer(passage_title, dtype=np.int32)
    order = np.argsort(owner, kind="stable")
    indptr = np.zeros(len(titles) + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=len(titles)), out=indptr[1:])
    return PassageMap(path, titles, title_index, indptr, np.frombuffer(passage_offset, dtype=np.int64)[order])


# --- grounding: entities <-> articles ------------------------------------------------------------------

def _group_sizes(sorted_keys: np.ndarray) -> np.ndarray:
    """For each element of a sorted array, the size of its run of equal values."""
    if sorted_keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    sizes = np.diff(np.r_[starts, sorted_keys.size])
    return np.repeat(sizes, sizes)


def _sorted_member(sorted_values: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(found mask, position) of each query in a sorted array."""
    pos = np.searchsorted(sorted_values, queries)
    pos_c = np.minimum(pos, max(sorted_values.size - 1, 0))
    found = (pos < sorted_values.size) & (sorted_values[pos_c] == queries) if sorted_values.size else \
        np.zeros(queries.shape, dtype=bool)
    return found, pos_c


@dataclasses.dataclass
class Grounding:
    """Entities aligned to exactly one article. Arrays are indexed by grounded index g, sorted by Q-number."""

    entity_path: pathlib.Path
    qnums: np.ndarray             # [G] int64, sorted
    title: np.ndarray             # [G] int32 title index in the PassageMap
    alias_offset: np.ndarray      # [G] int64 byte offset of the entity's alias line
    ambiguous_hashes: np.ndarray  # sorted int64 hashes of alias keys shared by several entities
    stats: dict

    def index_of(self, qnums: np.ndarray) -> np.ndarray:
        """Grounded index of each Q-number, -1 where the entity is not grounded."""
        found, pos = _sorted_member(self.qnums, np.asarray(qnums, dtype=np.int64))
        return np.where(found, pos, -1)

    def is_ambiguous_key(self, key: str) -> bool:
        return bool(_sorted_member(self.ambiguous_hashes, np.array([hash(key)], dtype=np.int64))[0][0])


def ground_entities(entity_path: PathLike, passages: PassageMap, *, progress: bool = False) -> Grounding:
    """Align Wikidata5M entities to wiki-18 titles through their unambiguous normalised aliases.

    An alias key (normalize_alias) shared by several entities is ambiguous and ignored everywhere; a title
    whose key is shared by several titles cannot be told apart and is ignored. An entity is grounded when its
    unambiguous keys match exactly one usable title; matching two or more titles makes it ungrounded
    ("several_titles"). A title is then matched by at most one entity, since its key is unambiguous.
    """
    entity_path = pathlib.Path(entity_path)
    title_hash = np.fromiter((hash(normalize_alias(t)) for t in passages.titles), dtype=np.int64,
                             count=len(passages.titles))
    title_order = np.argsort(title_hash, kind="stable")
    title_hash_sorted = title_hash[title_order]
    unique_title = _group_sizes(title_hash_sorted) == 1
    usable_hash, usable_title = title_hash_sorted[unique_title], title_order[unique_title].astype(np.int32)

    line_qnum, line_offset = array.array("q"), array.array("q")
    alias_hash, alias_line = array.array("q"), array.array("i")
    for line in iter_alias_lines(entity_path, "Q", progress=progress):
        index = len(line_qnum)
        line_qnum.append(line.number)
        line_offset.append(line.offset)
        for key in {normalize_alias(a) for a in line.aliases}:
            if key:
                alias_hash.append(hash(key))
                alias_line.append(index)
    qnum = np.frombuffer(line_qnum, dtype=np.int64)
    offset = np.frombuffer(line_offset, dtype=np.int64)
    sorted_q = np.sort(qnum)
    repeated = sorted_q[1:][sorted_q[1:] == sorted_q[:-1]]
    if repeated.size:
        raise ValueError(f"{entity_path}: entity Q{int(repeated[0])} appears on more than one line")

    hashes, lines = np.frombuffer(alias_hash, dtype=np.int64), np.frombuffer(alias_line, dtype=np.int32)
    order = np.argsort(hashes, kind="stable")
    hashes, lines = hashes[order], lines[order]
    shared = _group_sizes(hashes) > 1
    ambiguous_hashes = np.unique(hashes[shared])
    hashes, lines = hashes[~shared], lines[~shared]
    found, pos = _sorted_member(usable_hash, hashes)
    pairs = np.unique(np.stack([lines[found].astype(np.int64), usable_title[pos[found]].astype(np.int64)], 1), axis=0)
    titles_per_line = _group_sizes(pairs[:, 0]) if pairs.size else np.zeros(0, dtype=np.int64)
    grounded = pairs[titles_per_line == 1]
    by_qnum = np.argsort(qnum[grounded[:, 0]])
    grounded = grounded[by_qnum]
    stats = {
        "entities": int(qnum.size), "alias_keys": int(hashes.size + shared.sum()),
        "ambiguous_alias_keys": int(ambiguous_hashes.size), "titles": len(passages.titles),
        "ambiguous_title_keys": int(np.unique(title_hash_sorted[~unique_title]).size),
        "grounded": int(grounded.shape[0]),
        "several_titles": int(np.unique(pairs[titles_per_line > 1, 0]).size) if pairs.size else 0,
    }
    stats["no_title"] = stats["entities"] - stats["grounded"] - stats["several_titles"]
    return Grounding(entity_path, qnum[grounded[:, 0]].copy(), grounded[:, 1].astype(np.int32),
                     offset[grounded[:, 0]].copy(), ambiguous_hashes, stats)


# --- the relation graph over grounded entities ----------------------------------------------------------

@dataclasses.dataclass
class RelationGraph:
    """Edges h -r-> t of whitelisted relations between grounded entities, as CSR over the head.

    Edges of head g are edge_*[indptr[g]:indptr[g + 1]], sorted by (relation, tail). `edge_tails_of_head`
    counts every tail of (head, relation) in the triples, grounded or not: 1 means the relation determines
    the tail uniquely for this head.
    """

    relations: np.ndarray          # [R] int64 relation numbers (P-number), relation index -> number
    indptr: np.ndarray             # [G + 1] int64
    edge_relation: np.ndarray      # [E] int16 relation index
    edge_tail: np.ndarray          # [E] int32 grounded index of the tail
    edge_tails_of_head: np.ndarray  # [E] int32
    stats: dict


def _flush(heads, rels, tails, grounding: Grounding, parts: list) -> None:
    if not len(heads):
        return
    g = grounding.index_of(np.frombuffer(heads, dtype=np.int64))
    keep = g >= 0
    parts.append((g[keep].astype(np.int32), np.frombuffer(rels, dtype=np.int16)[keep].copy(),
                  np.frombuffer(tails, dtype=np.int64)[keep].copy()))
    del heads[:], rels[:], tails[:]


def build_relation_graph(triple_paths: Sequence[PathLike], grounding: Grounding, relations: Sequence[int], *,
                         progress: bool = False, chunk: int = 1 << 21) -> RelationGraph:
    """Stream triple files (duplicates across files are merged) into the whitelisted grounded graph."""
    relations = np.asarray(sorted(set(int(r) for r in relations)), dtype=np.int64)
    relation_index = {int(r): i for i, r in enumerate(relations)}
    heads, rels, tails = array.array("q"), array.array("h"), array.array("q")
    parts: list = []
    read = whitelisted = 0
    for path in triple_paths:
        for h, r, t in iter_triples(path, progress=progress):
            read += 1
            index = relation_index.get(r)
            if index is None:
                continue
            whitelisted += 1
            heads.append(h)
            rels.append(index)
            tails.append(t)
            if len(heads) >= chunk:
                _flush(heads, rels, tails, grounding, parts)
    _flush(heads, rels, tails, grounding, parts)
    head = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int32)
    rel = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int16)
    tail = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, np.int64)
    order = np.lexsort((tail, rel, head))
    head, rel, tail = head[order], rel[order], tail[order]
    fresh = np.r_[True, (head[1:] != head[:-1]) | (rel[1:] != rel[:-1]) | (tail[1:] != tail[:-1])] if head.size \
        else np.zeros(0, bool)
    head, rel, tail = head[fresh], rel[fresh], tail[fresh]
    tails_of_head = _group_sizes(head.astype(np.int64) * len(relations) + rel)
    tail_g = grounding.index_of(tail)
    walkable = tail_g >= 0
    head, rel, tail_g, tails_of_head = head[walkable], rel[walkable], tail_g[walkable], tails_of_head[walkable]
    indptr = np.zeros(grounding.qnums.size + 1, dtype=np.int64)
    np.cumsum(np.bincount(head, minlength=grounding.qnums.size), out=indptr[1:])
    stats = {"triples_read": read, "whitelisted": whitelisted, "with_grounded_head": int(fresh.sum()),
             "edges": int(head.size), "functional_edges": int((tails_of_head == 1).sum()),
             "heads_with_edges": int((np.diff(indptr) > 0).sum()),
             "edges_by_relation": {f"P{int(relations[i])}": int(n)
                                   for i, n in enumerate(np.bincount(rel, minlength=len(relations))) if n}}
    return RelationGraph(relations, indptr, rel.astype(np.int16), tail_g.astype(np.int32),
                         tails_of_head.astype(np.int32), stats)


# --- everything together --------------------------------------------------------------------------------

@dataclasses.dataclass
class KnowledgeBase:
    """The grounded graph plus what verification and the chain records need to read back."""

    passages: PassageMap
    grounding: Grounding
    graph: RelationGraph
    relation_labels: dict[int, str]

    def qid(self, g: int) -> str:
        return f"Q{int(self.grounding.qnums[g])}"

    def title(self, g: int) -> str:
        """The article title of grounded entity g."""
        return self.passages.titles[int(self.grounding.title[g])]

    def aliases(self, g: int) -> tuple[str, ...]:
        """All aliases of grounded entity g as written in the entity file (the first is its label)."""
        return _aliases_at(self.grounding.entity_path, int(self.grounding.alias_offset[g]))

    def mention_keys(self, g: int) -> list[str]:
        """The normalised aliases of g that no other entity shares: the keys a mention may use."""
        keys = {normalize_alias(a) for a in self.aliases(g)}
        return sorted(k for k in keys if k and not self.grounding.is_ambiguous_key(k))

    def entity_passages(self, g: int) -> list[Passage]:
        return self.passages.passages_of(int(self.grounding.title[g]))

    def relation_label(self, r: int) -> str:
        """Label of relation index r (the P-number when the relation file lacks it)."""
        number = int(self.graph.relations[r])
        return self.relation_labels.get(number, f"P{number}")


@functools.lru_cache(maxsize=1 << 16)
def _aliases_at(path: pathlib.Path, offset: int) -> tuple[str, ...]:
    return read_alias_line_at(path, offset, "Q").aliases


def load_knowledge_base(triple_paths: Sequence[PathLike], entity_path: PathLike, relation_path: PathLike,
                        corpus_path: PathLike, relations: Sequence[int], *, progress: bool = True) -> KnowledgeBase:
    """Read the corpus, ground the entities, and build the graph of the given relation numbers."""
    passages = read_passage_map(corpus_path, progress=progress)
    grounding = ground_entities(entity_path, passages, progress=progress)
    graph = build_relation_graph(triple_paths, grounding, relations, progress=progress)
    return KnowledgeBase(passages, grounding, graph, read_relation_labels(relation_path))

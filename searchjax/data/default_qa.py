"""The default QA set: template questions over the 10,033 default Wikipedia leads, without any LLM.

How questions are made. Each lead (`retrieval.corpus.default_corpus()`, with the package's `topic` field) is
split into sentences, its first sentence into subject, copula (is / was / are / were) and predicate. Each
template (searchjax/data/default_qa_templates.py) is one regular pattern over those sentences; a match gives a
question about the article, the gold answers (substrings of the lead) and, when the answer names an entity, a
*bridge* phrase ("the author of {s}"). The article is named by its title, without a trailing "(...)" unless two
titles would then read the same, and as "the pig" when the lead begins "The pig" or "A pig". Templates (lead
pattern -> question):

  nationality      "X was a Danish botanist ..." (topic People)         -> What nationality was X?
  occupation       same sentence, the listed roles (each one a gold)    -> What was the profession of X?
  located_in       "X is an ancient city in Mali"                       -> In which country is the city X?
  capital_of       "X is the capital and largest city of Iran"          -> X is the capital of which country?
  capital_is       "Its capital and largest city is Vilnius"            -> What is the capital of X?
  largest_city     "Its largest city is Y"                              -> What is the largest city of X?
  also_known_as    "X, also known as Y or Z, ..."                       -> What is another name for X?
  official_name    "X, officially the Grand Duchy of X, ..."            -> What is the official name of X?
  abbreviation     "Occupational safety and health (OSH) ..."           -> What is the abbreviation of X?
  element_symbol   "...; it has symbol Zn and atomic number 30"         -> What is the chemical symbol of X?
  element_number   same sentence                                        -> What is the atomic number of X?
  creator          "X is a 1927 novel by Virginia Woolf"                -> Who wrote (painted, composed, ...) X?
  year_event       "It was founded in 1764"                             -> In what year was X founded?
  discovered_by    "It was discovered in 1803 by Smithson Tennant"      -> Who discovered X?
  ruler_of         "X was King of England from 1189 until ..." (People) -> X was the king of which country?
  reign_start/_end same sentence                                        -> In what year did X become king of
                                                                           England? / Until what year was ...?
  period_start/_end "X was a Tatar state ... from 1438 until 1552"      -> In what year did X begin? / end?
  death_year       "... until his death in 1316" (People)               -> In what year did X die?
  born_in          "He was born in Auxerre" (People)                    -> Where was X born?
  taxon            "... in the genus Megaptera" (Biology; one name per rank in the lead)
                                                                        -> To which taxonomic genus does X belong?
  language_family  "X is a Dravidian language"                          -> To which language family does X belong?
  population       "with a population of around 9 million" (Geography; one figure in the lead)
                                                                        -> What is the population of X?
  named_after      "It is named after Y"                                -> Who or what is X named after?

Two-hop questions bridge two leads: when the answer of a bridging question about article A equals (after SQuAD
normalisation) the title of article B, each accepted single-hop question about B is asked again with B's name
replaced by A's bridge phrase ("What nationality was the author of Metamorphoses?"); the gold answers are B's,
the gold articles [A, B].

What is checked (a failing item is dropped and counted by reason; launch/build_default_qa.py prints the counts):
  answer_empty, answer_too_long    a gold answer normalises to nothing / to more than MAX_ANSWER_WORDS words
  answer_not_in_lead               a gold answer is not a whole-word substring of its lead, both under
                                   `searchjax.rewards.qa.normalize_answer`
  answer_in_question               a gold answer occurs (whole words, normalised) in the question
  duplicate_title                  two articles share a normalised title: a question about either is ambiguous
  duplicate_question               the same normalised question arises twice (every copy is dropped)
  two_hop_bridge_in_question       B's name is in the two-hop question (it would be one hop)
  two_hop_answer_in_question       B's answer is in the two-hop question
  two_hop_shortcut                 B's answer is already in A's lead (one retrieval would do)
  two_hop_self / _duplicate_question / _target_cap   A is B / a repeated question / more than TWO_HOP_PER_TARGET
                                   questions through one (B, template): a country many cities lie in would
                                   otherwise repeat one answer hundreds of times
  two_hop_split_crossing           A and B fall in different splits

Splits are disjoint by article: an article's split comes from sha256 of its title (test below TEST_FRACTION,
dev below TEST_FRACTION + DEV_FRACTION, train above); the gold articles of the 75 FanOutQA default questions
(searchjax.data.default_questions) never go to train (they move to dev); test keeps whole articles in hash
order, each only while the test questions stay <= TEST_CAP (the others move to dev). Rows are FlashRAG jsonl
(`searchjax.data.qa_datasets.read_flashrag_jsonl` reads them; `read_qa_file` also checks the gold articles):

  {"id", "question", "golden_answers": [...], "hops": 1 | 2, "data_source": "default_qa",
   "metadata": {"template", "gold_ids", "gold_titles"[, "bridge"]}}

with, for two-hop rows, bridge = {"question": A's own question, "answer": its answer, "title": B's title,
"second_question": the question about B by name} (what demonstrations search for, hop by hop).

The set is built once into <cache>/qa/default_qa-<fingerprint>/ ({train,dev,test}.jsonl and manifest.json with
the counts and rejections); the fingerprint covers the corpus, the FanOutQA gold titles and the generator's
source (this file and default_qa_templates.py), so a changed corpus or generator gets a new directory.
`default_qa_split(split)` returns a split's rows; `python -m launch.build_default_qa` rebuilds the set.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import tempfile
from typing import Iterable, Optional, Sequence

from searchjax.data import default_qa_templates as templates_module
from searchjax.data.default_qa_templates import (Article, Candidate, render, contains,
                                                display_names, generate_candidates, place_kinds)
from searchjax.data.jsonl import iter_jsonl
from searchjax.rewards.qa import normalize_answer

DATA_SOURCE = "default_qa"
SPLITS = ("train", "dev", "test")
TEST_FRACTION, DEV_FRACTION = 0.05, 0.10  # of articles, by title hash (before the test cap)
TEST_CAP = 100  # test questions at most, so evaluations stay short
MAX_ANSWER_WORDS = 6
TWO_HOP_PER_TARGET = 3  # two-hop questions per (second article, template): one popular bridge target
                        # (a country many cities lie in) would otherwise repeat the same answer hundreds of times


@dataclasses.dataclass
class Built:
    """The generator's output: rows per split, and rejection counts per reason."""

    splits: dict[str, list[dict]]
    rejections: collections.Counter
    moved: collections.Counter  # articles moved out of their hash split: "fanoutqa->dev", "test_cap->dev"


def _check(question: str, answers: Sequence[str], lead_norm: str) -> Optional[str]:
    """The rejection reason of one (question, answers) on its lead, or None when it passes."""
    if any(not normalize_answer(a) for a in answers):
        return "answer_empty"
    if any(len(normalize_answer(a).split()) > MAX_ANSWER_WORDS for a in answers):
        return "answer_too_long"
    if not all(contains(lead_norm, a) for a in answers):
        return "answer_not_in_lead"
    question_norm = normalize_answer(question)
    if any(contains(question_norm, a) for a in answers):
        return "answer_in_question"
    return None


def title_split(title: str) -> str:
    """train / dev / test from sha256(title): u = its first 60 bits / 2^60; test below 0.05, dev below 0.15."""
    u = int(hashlib.sha256(title.encode("utf-8")).hexdigest()[:15], 16) / 16 ** 15
    return "test" if u < TEST_FRACTION else "dev" if u < TEST_FRACTION + DEV_FRACTION else "train"


def _row(qid, question, answers, template, articles, bridge=None) -> dict:
    metadata = {"template": template, "gold_ids": [a.id for a in articles], "gold_titles": [a.title for a in articles]}
    if bridge is not None:
        metadata["bridge"] = bridge
    return {"id": qid, "question": question, "golden_answers": list(answers), "hops": len(articles),
            "data_source": DATA_SOURCE, "metadata": metadata}


class _LazyNormalized(dict):
    """id -> normalize_answer(text), computed on first access."""

    def __init__(self, texts: dict):
        super().__init__()
        self.texts = texts

    def __missing__(self, key):
        self[key] = value = normalize_answer(self.texts[key])
        return value


def make_questions(articles: Sequence[Article]) -> tuple[list[dict], collections.Counter]:
    """Every accepted single- and two-hop question of `articles` as rows (sorted by id), and the rejection counts."""
    rejections: collections.Counter = collections.Counter()
    title_counts = collections.Counter(normalize_answer(a.title) for a in articles)
    names = display_names([a.title for a in articles])
    for a in articles:  # "A medical doctor is ..." -> questions say "the medical doctor", not "Medical doctor"
        name = names[a.title]
        for art in ("The ", "A ", "An "):
            lead_name = a.text[len(art):len(art) + len(name)]
            if a.text.startswith(art) and lead_name.lower() == name.lower() \
                    and not a.text[len(art) + len(name):][:1].isalnum():
                names[a.title] = "the " + lead_name
                break
    kind_of = place_kinds(articles, names)
    leads = _LazyNormalized({a.id: a.text for a in articles})  # normalising all 10k leads costs seconds

    accepted: list[Candidate] = []
    for a in articles:
        for c in generate_candidates(a, names[a.title], kind_of):
            reason = "duplicate_title" if title_counts[normalize_answer(a.title)] > 1 else \
                _check(c.question, c.answers, leads[a.id])
            if reason:
                rejections[reason] += 1
            else:
                accepted.append(c)
    by_question = collections.Counter(normalize_answer(c.question) for c in accepted)
    rejections["duplicate_question"] += sum(n for n in by_question.values() if n > 1)
    accepted = [c for c in accepted if by_question[normalize_answer(c.question)] == 1]

    by_title = {}
    for a in articles:
        if title_counts[normalize_answer(a.title)] == 1:
            by_title.setdefault(normalize_answer(a.title), a)
            by_title.setdefault(normalize_answer(names[a.title]), a)
    questions_of = collections.defaultdict(list)
    for c in accepted:
        questions_of[c.article.id].append(c)
    rows = [_row(f"{c.article.id}-{c.template}" + (f"-{c.suffix}" if c.suffix else ""), c.question, c.answers,
                 c.template, (c.article,)) for c in accepted]
    doubles, per_target = [], collections.Counter()
    for first in accepted:
        target = by_title.get(normalize_answer(first.answers[0])) if first.bridge else None
        if target is None:
            continue
        if target.id == first.article.id:
            rejections["two_hop_self"] += 1
            continue
        phrase = first.bridge.replace("{s}", first.subject)
        for second in questions_of[target.id]:
            question = render(second.ask, phrase)
            question_norm = normalize_answer(question)
            key = (target.id, second.template, second.suffix)
            if contains(question_norm, target.title) or contains(question_norm, names[target.title]):
                rejections["two_hop_bridge_in_question"] += 1
            elif any(contains(question_norm, a) for a in second.answers):
                rejections["two_hop_answer_in_question"] += 1
            elif any(contains(leads[first.article.id], a) for a in second.answers):
                rejections["two_hop_shortcut"] += 1
            elif per_target[key] >= TWO_HOP_PER_TARGET:
                rejections["two_hop_target_cap"] += 1
            else:
                per_target[key] += 1
                bridge = {"question": first.question, "answer": first.answers[0], "title": target.title,
                          "second_question": second.question}
                doubles.append(_row(f"{first.article.id}-{target.id}-{first.template}+{second.template}"
                                    + (f"-{second.suffix}" if second.suffix else ""), question, second.answers,
                                    f"{first.template}+{second.template}", (first.article, target), bridge))
    by_question = collections.Counter(normalize_answer(d["question"]) for d in doubles)
    rejections["two_hop_duplicate_question"] += sum(n for n in by_question.values() if n > 1)
    rows += [d for d in doubles if by_question[normalize_answer(d["question"])] == 1]
    return sorted(rows, key=lambda r: r["id"]), rejections


def assign_splits(rows: Sequence[dict], excluded_from_train: Iterable[str] = ()) -> tuple[dict, collections.Counter,
                                                                                          collections.Counter]:
    """(rows per split, rejections, moved-article counts): splits by article (module docstring)."""
    excluded, rejections, moved = set(excluded_from_train), collections.Counter(), collections.Counter()
    golds = [list(zip(r["metadata"]["gold_ids"], r["metadata"]["gold_titles"])) for r in rows]
    split_of, title_of = {}, {}
    for pairs in golds:
        for a_id, title in pairs:
            if a_id not in split_of:
                title_of[a_id] = title
                split_of[a_id] = title_split(title)
                if split_of[a_id] == "train" and title in excluded:
                    split_of[a_id] = "dev"
                    moved["fanoutqa->dev"] += 1
    # test: whole articles in hash order, each kept while the questions lying wholly in test stay <= TEST_CAP
    questions_of = collections.defaultdict(list)
    for pairs in golds:
        for a_id, _ in pairs:
            questions_of[a_id].append({i for i, _ in pairs})
    kept, count = set(), 0
    for a_id in sorted((i for i in split_of if split_of[i] == "test"),
                       key=lambda i: hashlib.sha256(title_of[i].encode("utf-8")).hexdigest()):
        completed = sum(ids <= kept | {a_id} for ids in questions_of[a_id])
        if count + completed <= TEST_CAP:
            kept.add(a_id)
            count += completed
        else:
            split_of[a_id] = "dev"
            moved["test_cap->dev"] += 1
    splits = {s: [] for s in SPLITS}
    for row, pairs in zip(rows, golds):
        found = {split_of[a_id] for a_id, _ in pairs}
        if len(found) > 1:
            rejections["two_hop_split_crossing"] += 1
        else:
            splits[found.pop()].append(row)
    return splits, rejections, moved


def generate(articles: Sequence[Article], *, excluded_from_train: Iterable[str] = ()) -> Built:
    """The QA set of `articles` (module docstring); `excluded_from_train`: titles whose questions never go to train."""
    rows, rejections = make_questions(articles)
    splits, crossing, moved = assign_splits(rows, excluded_from_train)
    return Built(splits, rejections + crossing, moved)


# ------------------------------------------------------------------------------------------------ the default set

def default_articles(summaries_json: str | os.PathLike | None = None) -> list[Article]:
    """The default corpus's passages (`retrieval.corpus`: ids "0".."N-1", as the default index holds them) with the
    package's topic field, which the passages do not carry."""
    from retrieval.corpus import default_corpus, wiki_summaries_passages
    from searchjax.data import assets
    path = pathlib.Path(summaries_json) if summaries_json is not None else assets.wiki_summaries_json()
    passages = default_corpus() if summaries_json is None else wiki_summaries_passages(path)
    with path.open(encoding="utf-8") as f:
        entries = list(json.load(f).values())
    if len(entries) != len(passages):
        raise ValueError(f"{path}: {len(entries)} entries but the corpus has {len(passages)} passages; "
                         "rebuild the corpus cache")
    return [Article(p.id, p.title, p.text, str(e.get("topic") or "")) for p, e in zip(passages, entries)]


def fingerprint(articles: Sequence[Article], excluded_from_train: Iterable[str]) -> str:
    """sha256 over every article (id, title, topic, text), the titles kept out of train and the generator's source
(this file and default_qa_templates.py)."""
    h = hashlib.sha256()
    for a in articles:
        for field in (a.id, a.title, a.topic, a.text):
            h.update(field.encode("utf-8") + b"\0")
    for title in sorted(set(excluded_from_train)):
        h.update(b"excluded\0" + title.encode("utf-8") + b"\0")
    for module in (__file__, templates_module.__file__):
        h.update(pathlib.Path(module).read_bytes())
    return h.hexdigest()


def summary(built: Built) -> dict:
    """Counts per split and template, hop counts, rejections and moved articles (what manifest.json holds)."""
    return {"questions": {s: len(rows) for s, rows in built.splits.items()},
            "hops": {s: dict(sorted(collections.Counter(r["hops"] for r in rows).items()))
                     for s, rows in built.splits.items()},
            "templates": {s: dict(sorted(collections.Counter(r["metadata"]["template"] for r in rows).items()))
                          for s, rows in built.splits.items()},
            "rejections": dict(sorted(built.rejections.items())), "moved_articles": dict(sorted(built.moved.items()))}


def write(built: Built, directory: str | os.PathLike, *, fingerprint_hex: str = "",
          replace: bool = True) -> pathlib.Path:
    """{train,dev,test}.jsonl and manifest.json into `directory`, atomically: a temporary sibling renamed into
    place. replace=False keeps a complete directory already there (another process built the same set first)."""
    directory = pathlib.Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        for split, rows in built.splits.items():
            with (tmp / f"{split}.jsonl").open("w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
        manifest = {"format": "searchjax-default-qa/1", "fingerprint": fingerprint_hex, **summary(built)}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
        if replace and directory.exists():  # swap, so a reader sees the old set or the new one, never neither
            old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
            os.rename(directory, old)
            os.rename(tmp, directory)
            shutil.rmtree(old, ignore_errors=True)
        else:
            try:
                os.rename(tmp, directory)
            except OSError:
                if not (directory / "manifest.json").exists():
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def build_default(directory: str | os.PathLike | None = None, *, replace: bool = True) -> tuple[pathlib.Path, Built]:
    """Generate the default set from the default corpus and write it (to the cache directory unless given)."""
    from searchjax.data.default_questions import default_questions
    articles = default_articles()
    excluded = {q.gold_title for q in default_questions()}
    fp = fingerprint(articles, excluded)
    built = generate(articles, excluded_from_train=excluded)
    return write(built, directory or _cache_dir(fp), fingerprint_hex=fp, replace=replace), built


def _cache_dir(fp: str) -> pathlib.Path:
    from searchjax.data import assets
    return assets.cache_dir() / "qa" / f"default_qa-{fp[:12]}"


_DEFAULT_DIR: Optional[pathlib.Path] = None


def default_qa_dir() -> pathlib.Path:
    """<cache>/qa/default_qa-<fingerprint>/, built on first use (seconds) and reused while nothing it depends on
    changes (module docstring)."""
    global _DEFAULT_DIR
    if _DEFAULT_DIR is None or not (_DEFAULT_DIR / "manifest.json").exists():
        from searchjax.data.default_questions import default_questions
        fp = fingerprint(default_articles(), {q.gold_title for q in default_questions()})
        directory = _cache_dir(fp)
        if not (directory / "manifest.json").exists():
            directory, _ = build_default(directory, replace=False)
        _DEFAULT_DIR = directory
    return _DEFAULT_DIR


def default_qa_path(split: str) -> pathlib.Path:
    """The jsonl file of one split ("train", "dev" or "test"), for readers that take a path."""
    if split not in SPLITS:
        raise ValueError(f"default QA split must be one of {SPLITS}, got {split!r}")
    return default_qa_dir() / f"{split}.jsonl"


def default_qa_split(split: str) -> list[dict]:
    """The rows of one split of the default QA set (module docstring), checked by `read_qa_file`."""
    return read_qa_file(default_qa_path(split))


def read_qa_file(path: str | os.PathLike) -> list[dict]:
    """Rows of a QA jsonl file in this module's format; a malformed row raises naming the file and line, an empty
    file raises naming the file."""
    path = pathlib.Path(path)
    rows = []
    for where, row in iter_jsonl(path):
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
        for field in ("id", "question", "golden_answers", "hops", "metadata"):
            if field not in row:
                raise ValueError(f"{where}: missing field {field!r}")
        if not isinstance(row["question"], str) or not row["question"].strip():
            raise ValueError(f"{where}: field 'question' must be a non-empty string")
        answers = row["golden_answers"]
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a for a in answers):
            raise ValueError(f"{where}: field 'golden_answers' must be a non-empty list of non-empty strings")
        meta = row["metadata"]
        ids = meta.get("gold_ids") if isinstance(meta, dict) else None
        titles = meta.get("gold_titles") if isinstance(meta, dict) else None
        if not ids or not isinstance(ids, list) or not isinstance(titles, list) or len(titles) != len(ids):
            raise ValueError(f"{where}: question {row['id']!r} has no gold article (metadata.gold_ids and "
                             "metadata.gold_titles must be equal-length non-empty lists)")
        if row["hops"] not in (1, 2) or row["hops"] != len(ids):
            raise ValueError(f"{where}: field 'hops' is {row['hops']!r} but the question has {len(ids)} gold "
                             "article(s)")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: empty split (no questions); rebuild it with `python -m launch.build_default_qa`")
    return rows

"""A deterministic synthetic world in the Wikidata5M and wiki-18 file formats, for offline chain building.

The real inputs of Dr.Free's chain sampler are Wikidata5M (20M triples, 4.8M entities) and the wiki-18
corpus (21M passages); neither can be downloaded here. `write_world` builds a small typed world from a
seed and writes it in exactly those layouts, so `searchjax.drfree` runs end to end offline and tests
know the ground truth (`World`):

    wikidata5m_transductive_train.txt, wikidata5m_transductive_valid.txt   Q<n>\\tP<n>\\tQ<n> per line
    wikidata5m_entity.txt, wikidata5m_relation.txt                          id\\talias1\\talias2...
    wiki18.jsonl                                                            {"id", "contents": "\\"Title\\"\\ntext"}

What the world contains, and which part of the pipeline each feature exercises:
- typed entities (persons, films, books, companies, universities, cities, regions, countries, continents,
  awards, occupations, genres, languages) and class items (P31 targets) that have no article;
- functional relations (P19 place of birth, P57 director, P50 author, ...) and non-functional ones (P161
  cast member, P47 shares border with, P150 contains ...), plus multi-valued instances of near-functional
  whitelisted relations (a second occupation, school, award or citizenship): ambiguous hops and targets;
- geographic nesting: city -P131-> region -P17-> country -P30-> continent, country -P36-> capital;
- ambiguity: person aliases "B. Surname" and "Surname" shared within a family name; homonym persons with
  one label and disambiguated titles ("X (painter)", "X (actor)"); a person given another entity's label
  as an alias; an entity with an alias equal to an orphan article's title (it matches two titles);
- articles that mention their out-neighbours (sometimes by a non-label, possibly ambiguous alias), some
  facts left out (no mention), a few in-neighbours named, long articles split into several passages;
- entities with no article (not groundable), entities whose only edges are to ungroundable entities, and
  dead ends (continents, occupations, genres, languages have no whitelisted out-edges).

`scaled_config(target_triples)` sizes the same world for a memory/time check at millions of triples.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import random

import numpy as np

from retrieval.corpus import Passage, write_jsonl_corpus

_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


@dataclasses.dataclass(frozen=True)
class WorldConfig:
    n_persons: int = 240
    n_films: int = 60
    n_books: int = 30
    n_companies: int = 16
    n_universities: int = 8
    n_cities: int = 20
    n_regions: int = 8
    n_countries: int = 4
    n_continents: int = 2
    n_awards: int = 6
    n_occupations: int = 6
    n_genres: int = 5
    n_languages: int = 3
    article_fraction: float = 0.85   # persons, films and books with an article (all other kinds have one)
    homonym_pairs: int = 3           # pairs of persons sharing one label, titled "X (occupation)"
    alias_clashes: int = 2           # persons given a city's label as an extra alias (the city becomes ambiguous)
    several_title_entities: int = 1  # companies given an orphan article's title as an extra alias
    omit_fact_prob: float = 0.15     # a fact left out of its article (the tail is not mentioned)
    alt_alias_prob: float = 0.3      # a mention written with a non-label alias (ambiguous ones do not count)
    multi_value_prob: float = 0.25   # a second value of a near-functional relation
    inbound_mentions: int = 6        # in-neighbours an article names, at most
    words_per_passage: int = 60      # articles longer than this are split at sentence ends
    valid_fraction: float = 0.05     # triples written to the valid file instead of the train file
    seed: int = 0


def scaled_config(target_triples: int, seed: int = 0) -> WorldConfig:
    """A world of about `target_triples` triples: the default world (about 2,500 triples) with every count
    scaled linearly, except countries, occupations, genres and languages (square root), and articles for
    only 10% of the persons, films and books, like Wikipedia's coverage of Wikidata's long tail."""
    s = target_triples / 2500.0
    n = lambda base, lo=2: max(lo, int(round(base * s)))  # noqa: E731
    return WorldConfig(n_persons=n(240), n_films=n(60), n_books=n(30), n_companies=n(16), n_universities=n(8),
                       n_cities=n(20), n_regions=n(8), n_countries=max(4, int(4 * math.sqrt(s))),
                       n_continents=6, n_awards=n(6), n_occupations=max(6, int(6 * math.sqrt(s))),
                       n_genres=max(5, int(5 * math.sqrt(s))), n_languages=max(3, int(3 * math.sqrt(s))),
                       article_fraction=0.1, homonym_pairs=n(3), alias_clashes=n(2),
                       several_title_entities=n(1, 1), seed=seed)


@dataclasses.dataclass
class Entity:
    qnum: int
    kind: str
    aliases: list[str]        # first = label
    title: str | None = None  # wiki-18 article title; None: no article

    @property
    def label(self) -> str:
        return self.aliases[0]


@dataclasses.dataclass
class World:
    """Ground truth of a written world. triples: [N, 3] int64 (head Q-number, P-number, tail Q-number)."""

    config: WorldConfig
    entities: list[Entity]
    triples: np.ndarray
    passages: list[Passage]
    relation_aliases: dict[int, list[str]]
    paths: dict[str, pathlib.Path]

    def entity(self, qnum: int) -> Entity:
        return self.entities[qnum - _FIRST_QNUM]

    def tails(self, head: int, relation: int) -> set[int]:
        rows = self.triples[(self.triples[:, 0] == head) & (self.triples[:, 1] == relation)]
        return set(int(t) for t in rows[:, 2])

    def passages_of(self, title: str) -> list[Passage]:
        return [p for p in self.passages if p.title == title]


_FIRST_QNUM = 1001

# Relations of the world: P-number -> aliases (first = the Wikidata label).
RELATION_ALIASES = {
    31: ["instance of", "is a"], 17: ["country", "sovereign state"], 19: ["place of birth", "birthplace"],
    20: ["place of death", "deathplace"], 22: ["father"], 27: ["country of citizenship", "citizenship"],
    30: ["continent"], 36: ["capital"], 47: ["shares border with", "borders"],
    50: ["author", "writer"], 57: ["director", "directed by"], 58: ["screenwriter", "written by"],
    69: ["educated at", "alma mater"], 106: ["occupation", "profession"], 108: ["employer", "works for"],
    112: ["founded by", "founder"], 123: ["publisher"], 127: ["owned by", "owner"],
    131: ["located in the administrative territorial entity", "located in"], 136: ["genre"],
    150: ["contains administrative territorial entity"], 159: ["headquarters location", "headquarters"],
    161: ["cast member", "starring"], 166: ["award received", "awards"], 272: ["production company"],
    364: ["original language of film or TV show", "original language"], 495: ["country of origin"],
    740: ["location of formation"], 800: ["notable work"],
}

# How an article states its out-edges ({t} = the tail's mention). P31 and P150 are not stated.
_FACTS = {
    17: "It lies in {t}.", 19: "{h} was born in {t}.", 20: "{h} died in {t}.", 22: "The father of {h} was {t}.",
    27: "{h} is a citizen of {t}.", 30: "It is part of the continent of {t}.", 36: "Its capital is {t}.",
    47: "It borders {t}.", 50: "It was written by {t}.", 57: "It was directed by {t}.",
    58: "The screenplay is by {t}.", 69: "{h} studied at {t}.", 106: "{h} worked as a {t}.",
    108: "{h} was employed by {t}.", 112: "It was founded by {t}.", 123: "It was published by {t}.",
    127: "It is owned by {t}.", 131: "It is located in {t}.", 136: "Its genre is {t}.",
    159: "Its headquarters are in {t}.", 161: "It stars {t}.", 166: "{h} received the {t}.",
    272: "It was produced by {t}.", 364: "It was made in the {t} language.", 495: "It comes from {t}.",
    740: "It was formed in {t}.", 800: "{h} is known for {t}.",
}

_KIND_NOUN = {"person": "person", "film": "film", "book": "book", "company": "company",
              "university": "university", "city": "city", "region": "region", "country": "country",
              "continent": "continent", "award": "award", "occupation": "occupation", "genre": "genre",
              "language": "language", "orphan": "list"}
_CLASSES = ["human", "film", "literary work", "business", "university", "city", "region", "country",
            "continent", "award", "occupation", "genre", "language"]


def _word(code: int) -> str:
    """A pronounceable capitalised word of 4 CV syllables, distinct for each code < 70**4.

    code -> code * 1000003 mod 70**4 is a bijection (1000003 is prime, so coprime to 70) that scatters
    consecutive codes, so neighbouring entities do not share their first syllables.
    """
    space = len(_SYLLABLES) ** 4
    if not 0 <= code < space:
        raise ValueError(f"word code {code} outside [0, {space})")
    code = code * 1000003 % space
    out = []
    for _ in range(4):
        code, digit = divmod(code, len(_SYLLABLES))
        out.append(_SYLLABLES[digit])
    return "".join(out).capitalize()


class _Builder:
    """Mutable state while generating: entities by kind, triples, random source."""

    def __init__(self, cfg: WorldConfig):
        self.cfg, self.rng = cfg, random.Random(cfg.seed)
        self.entities: list[Entity] = []
        self.kinds: dict[str, list[int]] = {}
        self.triples: list[tuple[int, int, int]] = []
        self.next_word = 0
        self.classes: dict[str, int] = {}

    def word(self) -> str:
        self.next_word += 1
        return _word(self.next_word)

    def add(self, kind: str, aliases: list[str], article: bool = True) -> int:
        qnum = _FIRST_QNUM + len(self.entities)
        self.entities.append(Entity(qnum, kind, aliases, aliases[0] if article else None))
        self.kinds.setdefault(kind, []).append(qnum)
        return qnum

    def pick(self, kind: str, skew: bool = False) -> int:
        """A random entity of a kind; skew favours the first ones (popular entities, as in Wikipedia)."""
        pool = self.kinds[kind]
        u = self.rng.random()
        return pool[int(len(pool) * (u * u if skew else u))]

    def link(self, head: int, relation: int, tail: int) -> None:
        self.triples.append((head, relation, tail))


def _make_entities(b: _Builder) -> None:
    cfg, rng = b.cfg, b.rng
    b.classes = {name: b.add("class", [name], article=False) for name in _CLASSES}
    for _ in range(cfg.n_continents):
        b.add("continent", [b.word()])
    for _ in range(cfg.n_countries):
        w = b.word() + "ia"
        b.add("country", [w, f"Republic of {w}"])
    for _ in range(cfg.n_regions):
        w = b.word()
        b.add("region", [f"{w} Province", w])
    for _ in range(cfg.n_cities):
        w = b.word()
        b.add("city", [w, f"City of {w}"])
    for kind, n, fmt in (("occupation", cfg.n_occupations, "{}er"), ("genre", cfg.n_genres, "{} fiction"),
                         ("language", cfg.n_languages, "{}ish")):
        for _ in range(n):
            b.add(kind, [fmt.format(b.word().lower() if kind == "occupation" else b.word())])
    for _ in range(cfg.n_universities):
        w = b.word()
        b.add("university", [f"{w} University", f"University of {w}"])
    for i in range(cfg.n_companies):
        w = b.word()
        b.add("company", [f"{w} {('Pictures', 'Press', 'Group')[i % 3]}", w])
    for _ in range(cfg.n_awards):
        w = b.word()
        b.add("award", [f"{w} Prize", f"{w} Award"])
    n_first = max(8, int(math.sqrt(cfg.n_persons)))
    first = [b.word() for _ in range(n_first)]
    last = [b.word() for _ in range(-(-cfg.n_persons // n_first))]
    for i in range(cfg.n_persons):
        f, s = first[i % n_first], last[i // n_first]
        b.add("person", [f"{f} {s}", f"{f[0]}. {s}", s], article=rng.random() < cfg.article_fraction)
    for _ in range(cfg.n_films):
        w1, w2 = b.word(), b.word()
        b.add("film", [f"The {w1} {w2}", f"{w1} {w2}"], article=rng.random() < cfg.article_fraction)
    for _ in range(cfg.n_books):
        w1, w2 = b.word(), b.word()
        b.add("book", [f"{w1} of {w2}"], article=rng.random() < cfg.article_fraction)


def _make_triples(b: _Builder) -> None:
    cfg, rng, link, pick = b.cfg, b.rng, b.link, b.pick
    country_of: dict[int, int] = {}
    instance = {"person": "human", "film": "film", "book": "literary work", "company": "business"}
    for e in b.entities:
        if e.kind != "class":
            link(e.qnum, 31, b.classes[instance.get(e.kind, e.kind)])
    for c in b.kinds["country"]:
        link(c, 30, pick("continent"))
        for other in rng.sample(b.kinds["country"], min(2, len(b.kinds["country"]))):
            if other != c:
                link(c, 47, other)
    for r in b.kinds["region"]:
        country_of[r] = pick("country")
        link(r, 17, country_of[r])
        link(country_of[r], 150, r)
    for city in b.kinds["city"]:
        region = pick("region")
        country_of[city] = country_of[region]
        link(city, 131, region)
        link(city, 17, country_of[city])
    for c in b.kinds["country"]:
        cities = [x for x in b.kinds["city"] if country_of[x] == c]
        if cities:
            link(c, 36, cities[0])
    for u in b.kinds["university"]:
        city = pick("city", skew=True)
        link(u, 131, city)
        link(u, 17, country_of[city])
    for a in b.kinds["award"]:
        link(a, 17, pick("country"))
    companies = b.kinds["company"]
    for i, co in enumerate(companies):
        city = pick("city", skew=True)
        link(co, 159, city)
        link(co, 17, country_of[city])
        if rng.random() < 0.5:
            link(co, 740, pick("city"))
        if rng.random() < 0.7:
            link(co, 112, pick("person", skew=True))
        if i and rng.random() < 0.2:
            link(co, 127, companies[rng.randrange(i)])
    more = lambda: rng.random() < cfg.multi_value_prob  # noqa: E731
    persons = b.kinds["person"]
    for i, p in enumerate(persons):
        birth = pick("city", skew=True)
        link(p, 19, birth)
        for country in {country_of[birth], pick("country")} if more() else {country_of[birth]}:
            link(p, 27, country)
        if rng.random() < 0.3:
            link(p, 20, pick("city", skew=True))
        for occupation in {pick("occupation"), pick("occupation")} if more() else {pick("occupation")}:
            link(p, 106, occupation)
        if rng.random() < 0.6:
            for school in {pick("university"), pick("university")} if more() else {pick("university")}:
                link(p, 69, school)
        if rng.random() < 0.4:
            link(p, 108, pick("company", skew=True))
        if rng.random() < 0.3:
            for award in {pick("award"), pick("award")} if more() else {pick("award")}:
                link(p, 166, award)
        if i and rng.random() < 0.15:
            link(p, 22, persons[rng.randrange(i)])
    works: dict[int, list[int]] = {}
    for f in b.kinds["film"]:
        director = pick("person", skew=True)
        works.setdefault(director, []).append(f)
        link(f, 57, director)
        if rng.random() < 0.6:
            link(f, 58, pick("person", skew=True))
        for actor in {pick("person") for _ in range(3)}:
            link(f, 161, actor)
        link(f, 495, pick("country"))
        link(f, 272, pick("company", skew=True))
        link(f, 364, pick("language"))
        for genre in {pick("genre"), pick("genre")} if more() else {pick("genre")}:
            link(f, 136, genre)
    for bk in b.kinds["book"]:
        author = pick("person", skew=True)
        works.setdefault(author, []).append(bk)
        link(bk, 50, author)
        link(bk, 123, pick("company", skew=True))
        if rng.random() < 0.5:
            link(bk, 495, pick("country"))
        link(bk, 136, pick("genre"))
    for person, made in works.items():
        if rng.random() < 0.6:
            link(person, 800, made[0])


def _make_ambiguity(b: _Builder) -> list[str]:
    """Homonyms, alias clashes and several-title entities; returns the orphan article titles."""
    cfg, rng = b.cfg, b.rng
    persons = b.kinds["person"]
    ent = lambda q: b.entities[q - _FIRST_QNUM]  # noqa: E731
    occupation_of = {h: t for h, r, t in b.triples if r == 106}
    for k in range(cfg.homonym_pairs):
        first, second = ent(persons[2 * k + 1]), ent(persons[len(persons) - 1 - 2 * k])
        second.aliases = [first.label] + second.aliases[1:]
        first.title = f"{first.label} ({ent(occupation_of[first.qnum]).label})"
        second.title = f"{second.label} ({ent(occupation_of[second.qnum]).label}, born {k + 1})"
    for k in range(cfg.alias_clashes):
        city = ent(b.kinds["city"][-1 - k])
        ent(persons[len(persons) // 2 + k]).aliases.append(city.label)
    orphans = []
    for k in range(cfg.several_title_entities):
        company = ent(b.kinds["company"][-1 - k])
        orphans.append(f"{b.word()} Festival")
        company.aliases.append(orphans[-1])
    rng.shuffle(b.triples)
    return orphans


def _mention(b: _Builder, qnum: int) -> str:
    e = b.entities[qnum - _FIRST_QNUM]
    if len(e.aliases) > 1 and b.rng.random() < b.cfg.alt_alias_prob:
        return b.rng.choice(e.aliases[1:])
    return e.label


def _articles(b: _Builder, orphans: list[str]) -> list[Passage]:
    cfg, rng = b.cfg, b.rng
    out_edges: dict[int, list[tuple[int, int]]] = {}
    in_edges: dict[int, list[int]] = {}
    for h, r, t in sorted(b.triples):
        out_edges.setdefault(h, []).append((r, t))
        if r != 31:
            in_edges.setdefault(t, []).append(h)
    passages: list[Passage] = []

    def emit(title: str, sentences: list[str]) -> None:
        chunk: list[str] = []
        for sentence in sentences + [None]:
            if sentence is None or (chunk and len(" ".join(chunk + [sentence]).split()) > cfg.words_per_passage):
                passages.append(Passage(str(len(passages)), title, " ".join(chunk)))
                chunk = []
            if sentence is not None:
                chunk.append(sentence)

    for e in b.entities:
        if e.title is None:
            continue
        sentences = [f"{e.label} is a {_KIND_NOUN[e.kind]}."]
        for r, t in out_edges.get(e.qnum, []):
            if r in _FACTS and rng.random() >= cfg.omit_fact_prob:
                sentences.append(_FACTS[r].format(h=e.label, t=_mention(b, t)))
        inbound = in_edges.get(e.qnum, [])
        if inbound:
            named = rng.sample(inbound, min(cfg.inbound_mentions, len(inbound)))
            sentences.append(f"{e.label} is associated with {', '.join(_mention(b, h) for h in named)}.")
        emit(e.title, sentences)
    for title in orphans:
        emit(title, [f"{title} is an annual event.", "It has no other article."])
    return passages


def _write_alias_file(path: pathlib.Path, rows) -> None:
    with path.open("w", encoding="utf-8") as f:
        for ident, aliases in rows:
            f.write("\t".join([ident] + list(aliases)) + "\n")


def write_world(out_dir: str | os.PathLike, cfg: WorldConfig = WorldConfig()) -> World:
    """Generate the world of `cfg` (deterministic in cfg.seed) and write its files into out_dir."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    b = _Builder(cfg)
    _make_entities(b)
    _make_triples(b)
    orphans = _make_ambiguity(b)
    passages = _articles(b, orphans)
    triples = np.asarray(b.triples, dtype=np.int64).reshape(-1, 3)
    paths = {"train": out_dir / "wikidata5m_transductive_train.txt",
             "valid": out_dir / "wikidata5m_transductive_valid.txt",
             "entities": out_dir / "wikidata5m_entity.txt", "relations": out_dir / "wikidata5m_relation.txt",
             "corpus": out_dir / "wiki18.jsonl"}
    n_valid = int(len(triples) * cfg.valid_fraction)
    for name, rows in (("valid", triples[:n_valid]), ("train", triples[n_valid:])):
        with paths[name].open("w", encoding="utf-8") as f:
            f.writelines(f"Q{h}\tP{r}\tQ{t}\n" for h, r, t in rows.tolist())
    _write_alias_file(paths["entities"], ((f"Q{e.qnum}", e.aliases) for e in b.entities))
    _write_alias_file(paths["relations"], ((f"P{p}", a) for p, a in RELATION_ALIASES.items()))
    write_jsonl_corpus(passages, paths["corpus"])
    return World(cfg, b.entities, triples, passages, dict(RELATION_ALIASES), paths)

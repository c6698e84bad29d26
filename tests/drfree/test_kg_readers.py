"""Readers, normalisation, grounding and the CSR graph of searchjax.drfree.kg on small files in the exact
upstream layouts (Wikidata5M triples and alias files, wiki-18 jsonl); expected values are hand-computed
or recomputed here by brute force."""

import json

import numpy as np
import pytest

from searchjax.drfree import kg


def _write(path, text, mode="w"):
    if mode == "wb":
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# --- normalisation ------------------------------------------------------------------------------------

@pytest.mark.parametrize("alias, key", [
    ("Paris (mythology)", "paris"),
    ("Mercury (planet)", "mercury"),
    ("Foo (a) (b)", "foo"),
    ("The (International) Noise Conspiracy", "the (international) noise conspiracy"),
    ("Zürich", "zurich"),
    ("  New \t  York  ", "new york"),
    ("\ufb01sh", "fish"),          # NFKD expands the "fi" ligature
    ("AC/DC", "ac/dc"),
    ("Ångström (unit)", "angstrom"),
])
def test_kg_normalize_alias(alias, key):
    assert kg.normalize_alias(alias) == key


def test_kg_normalize_text_keeps_parentheses():
    assert kg.normalize_text("Born in Paris (France)  in 1900.") == "born in paris (france) in 1900."


@pytest.mark.parametrize("text, keys, found", [
    ("The ash tree", ["ash"], True),
    ("ash, oak and elm", ["ash"], True),
    ("He lives in Ashford", ["ash"], False),
    ("Rehash it", ["ash"], False),
    ("a Zürich bank", ["zurich"], True),
    ("Played by AC/DC live", ["ac/dc"], True),
    ("nothing here", ["ash", "oak"], False),
    ("an oak", ["ash", "oak"], True),
    ("empty key", [""], False),
])
def test_kg_mentions_alias_word_boundaries(text, keys, found):
    assert kg.mentions_alias(kg.normalize_text(text), keys) is found


# --- triples ------------------------------------------------------------------------------------------

def test_kg_iter_triples_upstream_layout(tmp_path):
    path = _write(tmp_path / "wikidata5m_transductive_train.txt",
                  "Q29387131\tP31\tQ5\nQ326660\tP1412\tQ652\r\n\nQ7339549\tP57\tQ1365729\n")
    assert list(kg.iter_triples(path)) == [(29387131, 31, 5), (326660, 1412, 652), (7339549, 57, 1365729)]


@pytest.mark.parametrize("bad_line, reason", [
    ("Q1\tP31", "expected 3 tab-separated fields"),
    ("Q1\tP31\tQ5\tQ6", "expected 3 tab-separated fields"),
    ("Q1 P31 Q5", "expected 3 tab-separated fields"),
    ("X1\tP31\tQ5", "head 'X1'"),
    ("Q1\tQ31\tQ5", "relation 'Q31'"),
    ("Q1\tP31\tQ5a", "tail 'Q5a'"),
    ("Q\tP31\tQ5", "head 'Q'"),
    ("Q١\tP31\tQ5", "head 'Q١'"),  # a non-ASCII digit
])
def test_kg_iter_triples_malformed_names_file_and_line(tmp_path, bad_line, reason):
    path = _write(tmp_path / "triples.txt", f"Q1\tP31\tQ5\nQ2\tP31\tQ5\n{bad_line}\n")
    with pytest.raises(kg.MalformedLineError, match=reason) as err:
        list(kg.iter_triples(path))
    assert str(err.value).startswith(f"{path}:3: ")
    assert err.value.line_no == 3


def test_kg_invalid_utf8_names_line(tmp_path):
    path = _write(tmp_path / "triples.txt", b"Q1\tP31\tQ5\nQ2\tP31\tQ\xff5\n", mode="wb")
    with pytest.raises(kg.MalformedLineError, match=r":2: not valid UTF-8"):
        list(kg.iter_triples(path))


def test_kg_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        list(kg.iter_triples(tmp_path / "nope.txt"))


# --- alias files --------------------------------------------------------------------------------------

def test_kg_alias_lines_upstream_layout(tmp_path):
    entity = "Q5\thuman\thumans\tperson\nQ90\tParis\tCity of Light\t\tParis, France\n"
    path = _write(tmp_path / "wikidata5m_entity.txt", entity)
    lines = list(kg.iter_alias_lines(path, "Q"))
    assert [(x.number, x.aliases, x.line_no) for x in lines] == [
        (5, ("human", "humans", "person"), 1), (90, ("Paris", "City of Light", "Paris, France"), 2)]
    assert lines[1].offset == len("Q5\thuman\thumans\tperson\n".encode())
    assert kg.read_alias_line_at(path, lines[1].offset, "Q").aliases == lines[1].aliases
    rel = _write(tmp_path / "wikidata5m_relation.txt", "P31\tinstance of\tis a\tis an\nP57\tdirector\tdirected by\n")
    assert kg.read_relation_labels(rel) == {31: "instance of", 57: "director"}


@pytest.mark.parametrize("bad_line, prefix, reason", [
    ("Q7", "Q", "has no alias"),
    ("Q7\t\t ", "Q", "has no alias"),
    ("P7\tfoo", "Q", "id 'P7'"),
    ("Q7\tfoo", "P", "id 'Q7'"),
    ("q7\tfoo", "Q", "id 'q7'"),
])
def test_kg_alias_malformed_names_file_and_line(tmp_path, bad_line, prefix, reason):
    path = _write(tmp_path / "aliases.txt", f"{prefix}1\tone\n{bad_line}\n")
    with pytest.raises(kg.MalformedLineError, match=reason) as err:
        list(kg.iter_alias_lines(path, prefix))
    assert str(err.value).startswith(f"{path}:2: ")


# --- wiki-18 passage map --------------------------------------------------------------------------------

def _corpus(path, rows):
    return _write(path, "".join(json.dumps({"id": i, "contents": f'"{t}"\n{x}'}) + "\n" for i, t, x in rows))


def test_kg_passage_map_groups_passages_by_title(tmp_path):
    rows = [("0", "Aaron", "Aaron is a prophet."), ("1", "Paris (mythology)", "Paris of Troy."),
            ("2", "Aaron", "His brother was Moses."), ("3", "Zürich", "A city.")]
    pm = kg.read_passage_map(_corpus(tmp_path / "wiki18.jsonl", rows))
    assert pm.titles == ["Aaron", "Paris (mythology)", "Zürich"]
    assert [p.id for p in pm.passages_of(pm.title_index["Aaron"])] == ["0", "2"]
    assert [(p.title, p.text) for p in pm.passages_of(2)] == [("Zürich", "A city.")]
    assert pm.indptr.tolist() == [0, 2, 3, 4]


@pytest.mark.parametrize("bad, reason", [
    ("{not json", "not valid JSON"),
    ('{"id": "9"}', "missing field 'contents'"),
    ('{"id": "9", "contents": 5}', "'contents' must be a string"),
])
def test_kg_passage_map_malformed_names_line(tmp_path, bad, reason):
    path = _corpus(tmp_path / "wiki18.jsonl", [("0", "A", "a")])
    path.write_text(path.read_text() + bad + "\n")
    with pytest.raises(kg.MalformedLineError, match=reason) as err:
        kg.read_passage_map(path)
    assert str(err.value).startswith(f"{path}:2: ")


# --- grounding ------------------------------------------------------------------------------------------

def test_kg_grounding_hand_example(tmp_path):
    titles = ["Mercury (planet)", "Mercury (element)", "Paris", "Troy", "Zürich", "Festival", "Lone"]
    corpus = _corpus(tmp_path / "c.jsonl", [(str(i), t, "text") for i, t in enumerate(titles)])
    entities = _write(tmp_path / "e.txt", "\n".join([
        "Q1\tMercury\tplanet Mercury",   # "mercury" is also Q2's alias -> ambiguous; title keys clash too
        "Q2\tmercury\tHg",
        "Q3\tParis\tCity of Light",      # grounded to Paris
        "Q4\tTroy\tIlion",               # grounded to Troy ...
        "Q5\tHelen\tIlion",              # ... although "ilion" is ambiguous between Q4 and Q5
        "Q6\tZurich",                    # grounded to Zürich through accent folding
        "Q7\tSome Band\tFestival\tLone",  # two titles -> several_titles
        "Q8\tNobody",                    # no title
    ]) + "\n")
    pm = kg.read_passage_map(corpus)
    g = kg.ground_entities(entities, pm)
    assert g.qnums.tolist() == [3, 4, 6]
    assert [pm.titles[t] for t in g.title] == ["Paris", "Troy", "Zürich"]
    assert g.stats["several_titles"] == 1 and g.stats["grounded"] == 3 and g.stats["entities"] == 8
    assert g.stats["ambiguous_alias_keys"] == 2           # "mercury", "ilion"
    assert g.stats["ambiguous_title_keys"] == 1           # "mercury"
    assert g.is_ambiguous_key("ilion") and not g.is_ambiguous_key("troy")
    assert g.index_of(np.array([4, 5, 6, 99])).tolist() == [1, -1, 2, -1]


def test_kg_duplicate_entity_line_rejected(tmp_path):
    corpus = _corpus(tmp_path / "c.jsonl", [("0", "A", "a")])
    entities = _write(tmp_path / "e.txt", "Q1\tA\nQ2\tB\nQ1\tC\n")
    with pytest.raises(ValueError, match="Q1 appears on more than one line"):
        kg.ground_entities(entities, kg.read_passage_map(corpus))


# --- the relation graph ------------------------------------------------------------------------------------

def test_kg_relation_graph_matches_brute_force(tmp_path):
    rng = np.random.default_rng(0)
    n = 30
    titles = [f"E{i}" for i in range(n) if i % 4]  # entities 0, 4, 8, ... have no article
    corpus = _corpus(tmp_path / "c.jsonl", [(str(i), t, "x") for i, t in enumerate(titles)])
    entities = _write(tmp_path / "e.txt", "".join(f"Q{i}\tE{i}\n" for i in range(n)))
    relations = [17, 50, 131]
    triples = [(int(h), int(r), int(t)) for h, r, t in zip(rng.integers(0, n, 400), rng.choice([17, 50, 131, 31], 400),
                                                           rng.integers(0, n, 400))]
    a = _write(tmp_path / "train.txt", "".join(f"Q{h}\tP{r}\tQ{t}\n" for h, r, t in triples[:300]))
    b = _write(tmp_path / "valid.txt", "".join(f"Q{h}\tP{r}\tQ{t}\n" for h, r, t in triples[250:]))  # overlaps
    g = kg.ground_entities(entities, kg.read_passage_map(corpus))
    graph = kg.build_relation_graph([a, b], g, relations, chunk=37)
    grounded = {i for i in range(n) if i % 4}
    unique = set(triples)
    expected = {}
    for h, r, t in unique:
        if r in relations and h in grounded and t in grounded:
            tails = {tt for hh, rr, tt in unique if hh == h and rr == r}
            expected.setdefault(h, set()).add((r, t, len(tails)))
    got = {}
    for gi, q in enumerate(g.qnums.tolist()):
        for e in range(graph.indptr[gi], graph.indptr[gi + 1]):
            got.setdefault(q, set()).add((int(graph.relations[graph.edge_relation[e]]),
                                          int(g.qnums[graph.edge_tail[e]]), int(graph.edge_tails_of_head[e])))
    assert got == expected
    assert graph.stats["triples_read"] == 400 + 50
    assert graph.stats["edges"] == sum(len(v) for v in expected.values())

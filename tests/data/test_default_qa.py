"""The default QA set (searchjax.data.default_qa): the built set's guarantees, each template on hand-written leads
with hand-computed questions and answers, determinism, and errors on bad files.

The built-set checks recompute everything from the corpus itself (the lead text of each gold id, the SQuAD
normalisation of searchjax.rewards.qa, the FanOutQA gold titles), not from the generator's own bookkeeping.
"""

import json

import pytest

from searchjax.data import default_qa
from searchjax.data.default_qa_templates import Article
from searchjax.rewards.qa import normalize_answer


def _contains(haystack: str, needle: str) -> bool:
    return f" {normalize_answer(needle)} " in f" {normalize_answer(haystack)} "


@pytest.fixture(scope="module")
def built_dir(tmp_path_factory):
    directory, _ = default_qa.build_default(tmp_path_factory.mktemp("qa") / "set")
    return directory


@pytest.fixture(scope="module")
def splits(built_dir):
    return {s: default_qa.read_qa_file(built_dir / f"{s}.jsonl") for s in default_qa.SPLITS}


@pytest.fixture(scope="module")
def corpus():
    from retrieval.corpus import default_corpus
    return {p.id: p for p in default_corpus()}


def test_counts_and_test_cap(splits):
    rows = [r for s in splits.values() for r in s]
    assert sum(r["hops"] == 1 for r in rows) >= 2000
    assert sum(r["hops"] == 2 for r in rows) >= 200
    assert 0 < len(splits["test"]) <= 100
    assert len(splits["dev"]) > 0 and len(splits["train"]) > 0
    assert len({r["id"] for r in rows}) == len(rows)


def test_every_answer_occurs_in_its_gold_lead(splits, corpus):
    for row in (r for s in splits.values() for r in s):
        gold_id = row["metadata"]["gold_ids"][-1]  # the answer's article: the second one of a two-hop question
        passage = corpus[gold_id]
        assert passage.title == row["metadata"]["gold_titles"][-1], row["id"]
        for answer in row["golden_answers"]:
            assert _contains(passage.text, answer), (row["id"], answer)
            assert not _contains(row["question"], answer), (row["id"], answer)


def test_two_hop_bridges(splits, corpus):
    doubles = [r for s in splits.values() for r in s if r["hops"] == 2]
    for row in doubles:
        first, second = (corpus[i] for i in row["metadata"]["gold_ids"])
        bridge = row["metadata"]["bridge"]
        assert first.id != second.id
        # the first hop's answer is in the first lead and names the second article
        assert _contains(first.text, bridge["answer"]), row["id"]
        names = {normalize_answer(second.title), normalize_answer(second.title.split(" (")[0])}
        assert normalize_answer(bridge["answer"]) in names, row["id"]
        assert bridge["title"] == second.title
        # the second article's name is not in the question: it has to be found through the first hop
        assert not _contains(row["question"], second.title.split(" (")[0]), row["id"]


def test_splits_are_disjoint_by_article_and_fanoutqa_is_not_in_train(splits):
    from searchjax.data.default_questions import default_questions
    articles = {s: {i for r in rows for i in r["metadata"]["gold_ids"]} for s, rows in splits.items()}
    assert not articles["train"] & articles["dev"]
    assert not articles["train"] & articles["test"]
    assert not articles["dev"] & articles["test"]
    fanout = {q.gold_title for q in default_questions()}
    train_titles = {t for r in splits["train"] for t in r["metadata"]["gold_titles"]}
    assert len(fanout) > 30 and not fanout & train_titles
    # the FanOutQA articles are in the corpus and many have questions: the exclusion did something
    other_titles = {t for s in ("dev", "test") for r in splits[s] for t in r["metadata"]["gold_titles"]}
    assert len(fanout & other_titles) >= 10


def test_build_is_deterministic_and_the_cached_split_is_the_same_file(built_dir, tmp_path):
    again, _ = default_qa.build_default(tmp_path / "again")
    for name in ("train.jsonl", "dev.jsonl", "test.jsonl", "manifest.json"):
        assert (again / name).read_bytes() == (built_dir / name).read_bytes(), name
    cached = default_qa.default_qa_path("test")  # the suite's own empty cache: built here, on first use
    assert cached.read_bytes() == (built_dir / "test.jsonl").read_bytes()
    assert default_qa.default_qa_split("dev") == default_qa.read_qa_file(built_dir / "dev.jsonl")


def test_the_rows_read_as_flashrag_prompts(built_dir):
    from searchjax.data.qa_datasets import read_flashrag_jsonl
    prompts = read_flashrag_jsonl(built_dir / "test.jsonl")
    rows = default_qa.read_qa_file(built_dir / "test.jsonl")
    assert [p.question for p in prompts] == [r["question"] for r in rows]
    assert prompts[0].data_source == "default_qa" and prompts[0].uid == f"default_qa/{rows[0]['id']}"
    assert prompts[0].metadata["gold_ids"] == rows[0]["metadata"]["gold_ids"]


# --------------------------------------------------------------------------------- templates on hand-written leads

HAND_WRITTEN = [
    Article("1", "Jane Doe", "Jane Doe was an English novelist, poet and critic. She was born in Bristol. "
            "She wrote until her death in 1901.", "People"),
    Article("2", "Bristol", "Bristol is a city in England. It has a population of 472,400.", "Geography"),
    Article("3", "The Long Road", "The Long Road is a 1920 novel by English author Jane Doe.", "Arts"),
    Article("4", "Freedonia", "Freedonia, officially the Republic of Freedonia, is a landlocked country in Central "
            "Europe. Its capital and largest city is Fredville.", "Geography"),
    Article("5", "Fredville", "Fredville is the capital and largest city of Freedonia. It was founded in 1204.",
            "Geography"),
    Article("6", "Zinc", "Zinc is a chemical element; it has symbol Zn and atomic number 30.", "Physical sciences"),
    Article("7", "World Trade Organization", "The World Trade Organization (WTO) is an intergovernmental "
            "organization.", "Society and social sciences"),
    Article("8", "Pig", "The pig, also called the hog or domestic pig, is an animal.", "Everyday life"),
    Article("9", "Olaf the Bold", "Olaf the Bold was King of Norway from 1015 to 1028.", "People"),
    Article("10", "Great Northern War", "The Great Northern War was a conflict fought from 1700 to 1721.", "History"),
    Article("11", "Aardwolf", "The aardwolf is a small mammal of the family Hyaenidae.", "Biology and health sciences"),
    Article("12", "Kannada", "Kannada is a Dravidian language spoken in India.", "Society and social sciences"),
    Article("13", "Hertz", "The hertz is the unit of frequency. It is named after Heinrich Hertz.",
            "Physical sciences"),
    # rejected: the answer is in the question; two titles that normalise alike; a 7-word answer
    Article("14", "Mexico City", "Mexico City is the capital and largest city of Mexico.", "Geography"),
    Article("15", "Mercury", "Mercury is a chemical element; it has symbol Hg and atomic number 80.", "Chemistry"),
    Article("16", "mercury", "mercury is a chemical element; it has symbol Hg and atomic number 80.", "Chemistry"),
    Article("17", "Widget", "Widget, also known as Very Long Alternative Name For A Small Device, is a tool.",
            "Technology"),
]

# (template, question, answers), worked out by hand from the leads above and the docstring's templates
EXPECTED_SINGLE = {
    ("nationality", "What nationality was Jane Doe?", ("English",)),
    ("occupation", "What was the profession of Jane Doe?", ("novelist", "poet", "critic")),
    ("born_in", "Where was Jane Doe born?", ("Bristol",)),
    ("death_year", "In what year did Jane Doe die?", ("1901",)),
    ("located_in", "In which region is the city Bristol?", ("England",)),
    ("population", "What is the population of Bristol?", ("472,400",)),
    ("creator", "Who wrote The Long Road?", ("Jane Doe",)),
    ("official_name", "What is the official name of Freedonia?", ("Republic of Freedonia",)),
    ("located_in", "In which region is the country Freedonia?", ("Central Europe",)),
    ("capital_is", "What is the capital of Freedonia?", ("Fredville",)),
    ("capital_of", "Fredville is the capital of which country?", ("Freedonia",)),
    ("year_event", "In what year was Fredville founded?", ("1204",)),
    ("element_symbol", "What is the chemical symbol of Zinc?", ("Zn",)),
    ("element_number", "What is the atomic number of Zinc?", ("30",)),
    ("abbreviation", "What is the abbreviation of the World Trade Organization?", ("WTO",)),
    ("also_known_as", "What is another name for the pig?", ("hog", "domestic pig")),
    ("ruler_of", "Olaf the Bold was the king of which country?", ("Norway",)),
    ("reign_start", "In what year did Olaf the Bold become king of Norway?", ("1015",)),
    ("reign_end", "Until what year was Olaf the Bold king of Norway?", ("1028",)),
    ("period_start", "In what year did the Great Northern War begin?", ("1700",)),
    ("period_end", "In what year did the Great Northern War end?", ("1721",)),
    ("taxon", "To which taxonomic family does the aardwolf belong?", ("Hyaenidae",)),
    ("language_family", "To which language family does Kannada belong?", ("Dravidian",)),
    ("named_after", "Who or what is the hertz named after?", ("Heinrich Hertz",)),
}
EXPECTED_DOUBLE = {
    ("born_in+located_in", "In which region is the birthplace of Jane Doe?", ("England",), ("1", "2")),
    ("born_in+population", "What is the population of the birthplace of Jane Doe?", ("472,400",), ("1", "2")),
    # creator+nationality is rejected: "English" is already in The Long Road's lead (one hop would do)
    ("creator+occupation", "What was the profession of the author of The Long Road?", ("novelist", "poet", "critic"),
     ("3", "1")),
    ("creator+born_in", "Where was the author of The Long Road born?", ("Bristol",), ("3", "1")),
    ("creator+death_year", "In what year did the author of The Long Road die?", ("1901",), ("3", "1")),
    ("capital_is+year_event", "In what year was the capital of Freedonia founded?", ("1204",), ("4", "5")),
    ("capital_of+official_name", "What is the official name of the country whose capital is Fredville?",
     ("Republic of Freedonia",), ("5", "4")),
    ("capital_of+located_in", "In which region is the country whose capital is Fredville?", ("Central Europe",),
     ("5", "4")),
    # capital_is+capital_of and capital_of+capital_is are rejected: the answer is in the question
}


def test_templates_on_hand_written_leads():
    rows, rejections = default_qa.make_questions(HAND_WRITTEN)
    single = {(r["metadata"]["template"], r["question"], tuple(r["golden_answers"])) for r in rows if r["hops"] == 1}
    double = {(r["metadata"]["template"], r["question"], tuple(r["golden_answers"]), tuple(r["metadata"]["gold_ids"]))
              for r in rows if r["hops"] == 2}
    assert single == EXPECTED_SINGLE
    assert double == EXPECTED_DOUBLE
    assert {k: v for k, v in rejections.items() if v} == {
        "answer_in_question": 1, "duplicate_title": 4, "answer_too_long": 1, "two_hop_shortcut": 1,
        "two_hop_answer_in_question": 2}
    bridge = next(r for r in rows if r["metadata"]["template"] == "creator+born_in")["metadata"]["bridge"]
    assert bridge == {"question": "Who wrote The Long Road?", "answer": "Jane Doe", "title": "Jane Doe",
                      "second_question": "Where was Jane Doe born?"}


def test_split_assignment_rules():
    rows, _ = default_qa.make_questions(HAND_WRITTEN)
    titles = {a.title for a in HAND_WRITTEN}
    by_hash = {t: default_qa.title_split(t) for t in titles}
    excluded = {t for t, s in by_hash.items() if s == "train"}
    splits, crossing, moved = default_qa.assign_splits(rows, excluded_from_train=excluded)
    assert not splits["train"] and moved["fanoutqa->dev"] == len({t for r in rows for t in r["metadata"]["gold_titles"]}
                                                                  & excluded)
    kept = sum(len(v) for v in splits.values())
    assert kept + crossing["two_hop_split_crossing"] == len(rows)


def test_test_split_is_capped_by_whole_articles(monkeypatch):
    monkeypatch.setattr(default_qa, "TEST_CAP", 3)
    monkeypatch.setattr(default_qa, "title_split", lambda title: "test")
    rows = [{"id": f"{a}-{k}", "metadata": {"gold_ids": [a], "gold_titles": [f"T{a}"]}} for a in "abcd"
            for k in range(2)]  # 4 articles x 2 questions, all hashed to test, cap 3: one article (2) fits
    splits, _, moved = default_qa.assign_splits(rows)
    assert len(splits["test"]) == 2 and len(splits["dev"]) == 6 and moved["test_cap->dev"] == 3
    assert len({r["metadata"]["gold_ids"][0] for r in splits["test"]}) == 1


# ------------------------------------------------------------------------------------------------------ bad input

def _row(i, **overrides):
    row = {"id": f"q{i}", "question": "What is X?", "golden_answers": ["x"], "hops": 1,
           "metadata": {"template": "t", "gold_ids": ["7"], "gold_titles": ["X"]}}
    row.update(overrides)
    return json.dumps(row)


def test_empty_split_names_the_file(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text("\n")
    with pytest.raises(ValueError, match=rf"{path}: empty split"):
        default_qa.read_qa_file(path)


def test_question_without_gold_article_names_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(_row(1) + "\n" + _row(2, metadata={"template": "t", "gold_ids": [], "gold_titles": []}) + "\n")
    with pytest.raises(ValueError, match=rf"{path}:2: question 'q2' has no gold article"):
        default_qa.read_qa_file(path)
    path.write_text(_row(1, metadata={"template": "t"}) + "\n")
    with pytest.raises(ValueError, match=rf"{path}:1: question 'q1' has no gold article"):
        default_qa.read_qa_file(path)
    path.write_text(_row(1, hops=2) + "\n")
    with pytest.raises(ValueError, match=rf"{path}:1: field 'hops' is 2 but the question has 1 gold article"):
        default_qa.read_qa_file(path)

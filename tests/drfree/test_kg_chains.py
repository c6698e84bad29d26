"""Chain sampling and two-phase verification (searchjax.drfree.chains) on the synthetic world and on
micro-worlds built to trigger one rejection reason each. Every emitted chain is re-checked here against
the world's ground truth (triples, aliases, articles) with independent code, and phase 2 by re-running
the retriever."""

import collections
import json
import re

import numpy as np
import pytest

from retrieval.bm25 import BM25Index
from retrieval.corpus import iter_jsonl_corpus
from searchjax.data import synthetic
from searchjax.drfree import chains, kg

N_PER_HOP = 6
WHITELIST_NUMBERS = chains.relation_numbers(chains.WHITELIST)


def _load(paths, relations=WHITELIST_NUMBERS):
    return kg.load_knowledge_base([paths["train"], paths["valid"]], paths["entities"], paths["relations"],
                                  paths["corpus"], relations, progress=False)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return synthetic.write_world(tmp_path_factory.mktemp("world"))


@pytest.fixture(scope="module")
def kb(world):
    return _load(world.paths)


@pytest.fixture(scope="module")
def index(world):
    return BM25Index.build(list(iter_jsonl_corpus(world.paths["corpus"])))


@pytest.fixture(scope="module")
def pool(kb, index):
    cfg = chains.ChainConfig(n_per_hop=N_PER_HOP, max_attempts_per_chain=2000, seed=3)
    return chains.build_chain_pool(kb, index, cfg, progress=False)


# --- independent ground truth (the synthetic world is ASCII: a key is the lowercased alias, parens cut) ---

def _key(alias):
    return re.sub(r"( \([^()]*\))+$", "", alias).lower()


def _truth_grounding(world):
    """qnum -> title of every entity that has exactly one title through aliases no other entity shares."""
    owners = collections.defaultdict(set)
    for e in world.entities:
        for a in e.aliases:
            owners[_key(a)].add(e.qnum)
    titles_by_key = collections.defaultdict(set)
    for p in world.passages:
        titles_by_key[_key(p.title)].add(p.title)
    grounded = {}
    for e in world.entities:
        matches = {next(iter(titles_by_key[_key(a)])) for a in e.aliases
                   if len(owners[_key(a)]) == 1 and len(titles_by_key.get(_key(a), ())) == 1}
        if len(matches) == 1:
            grounded[e.qnum] = matches.pop()
    return grounded, owners


def _mentions(text, alias):
    return re.search(r"(?<![A-Za-z0-9_])" + re.escape(alias.lower()) + r"(?![A-Za-z0-9_])", text.lower()) is not None


def test_kg_grounding_matches_ground_truth(world, kb):
    grounded, _ = _truth_grounding(world)
    assert kb.grounding.qnums.tolist() == sorted(grounded)
    assert [kb.title(g) for g in range(kb.grounding.qnums.size)] == [grounded[q] for q in sorted(grounded)]
    assert kb.grounding.stats["several_titles"] == world.config.several_title_entities


def test_kg_graph_matches_ground_truth(world, kb):
    grounded, _ = _truth_grounding(world)
    allowed = set(WHITELIST_NUMBERS)
    truth = collections.defaultdict(set)
    for h, r, t in world.triples.tolist():
        if r in allowed and h in grounded and t in grounded:
            truth[h].add((r, t, len(world.tails(h, r))))
    g = kb.graph
    got = collections.defaultdict(set)
    for gi, q in enumerate(kb.grounding.qnums.tolist()):
        for e in range(g.indptr[gi], g.indptr[gi + 1]):
            got[q].add((int(g.relations[g.edge_relation[e]]), int(kb.grounding.qnums[g.edge_tail[e]]),
                        int(g.edge_tails_of_head[e])))
    assert got == truth


def test_kg_pool_hop_counts_exactly_balanced(pool):
    records, stats = pool
    assert collections.Counter(r["hops"] for r in records) == {1: N_PER_HOP, 2: N_PER_HOP, 3: N_PER_HOP}
    assert stats["per_hop_emitted"] == N_PER_HOP
    assert all(len(r["entities"]) == r["hops"] + 1 == len(r["relations"]) + 1 == len(r["passages"]) for r in records)


def test_kg_every_chain_valid_against_ground_truth(world, pool, index):
    records, _ = pool
    grounded, owners = _truth_grounding(world)
    geo = {int(p[1:]) for p in chains.GEO_NESTING}
    for rec in records:
        q = [int(e["id"][1:]) for e in rec["entities"]]
        p = [int(r["id"][1:]) for r in rec["relations"]]
        assert len(set(q)) == len(q), rec["id"]                                    # acyclic
        assert all(r["id"] in chains.WHITELIST for r in rec["relations"]), rec["id"]
        assert not any(a in geo and b in geo for a, b in zip(p, p[1:])), rec["id"]
        for k in range(len(p)):
            assert world.tails(q[k], p[k]) == {q[k + 1]}, rec["id"]               # true and unique
        for e, qq in zip(rec["entities"], q):                                      # unambiguously grounded
            assert grounded.get(qq) == e["title"], rec["id"]
        assert rec["answer"] == world.entity(q[-1]).label
        # phase 1: the seed passage is e0's and names e1 by an alias no other entity has
        seed = rec["passages"][0]
        assert seed in [{"id": x.id, "title": x.title, "text": x.text} for x in world.passages_of(grounded[q[0]])]
        assert any(_mentions(seed["text"], a) for a in world.entity(q[1]).aliases if len(owners[_key(a)]) == 1)
        for passage, qq in zip(rec["passages"], q):
            assert passage["title"] == grounded[qq], rec["id"]
        # phase 2: top-3 for e_k's title holds an article of e_k+1, re-run on the index
        for k in range(1, len(p)):
            hits = index.search([grounded[q[k]]], 3)[0]
            assert grounded[q[k + 1]] in [h.title for h in hits], rec["id"]
        assert len(rec["hop_evidence"]) == len(p) - 1


def test_kg_every_rejection_reason_counted(pool):
    _, stats = pool
    assert set(stats["rejections"]) == set(chains.REJECTION_REASONS)
    assert all(n > 0 for n in stats["rejections"].values()), stats["rejections"]
    for hop in stats["per_hop"].values():
        assert hop["attempts"] == hop["accepted"] + sum(hop["rejections"].values())


def test_kg_pool_deterministic_and_round_trips(kb, index, pool, tmp_path):
    cfg = chains.ChainConfig(n_per_hop=N_PER_HOP, max_attempts_per_chain=2000, seed=3)
    again, stats = chains.build_chain_pool(kb, index, cfg, progress=False)
    assert again == pool[0]
    chains_path, stats_path = chains.write_chain_pool(tmp_path, again, stats)
    assert chains.read_chain_pool(chains_path) == again
    assert json.loads(stats_path.read_text())["rejections"] == stats["rejections"]


def test_kg_short_budget_still_balanced(kb, index):
    cfg = chains.ChainConfig(n_per_hop=5, max_attempts_per_chain=40, seed=1)
    records, stats = chains.build_chain_pool(kb, index, cfg, progress=False)
    accepted = [stats["per_hop"][str(h)]["accepted"] for h in cfg.hops]
    assert 0 < min(accepted) < max(accepted)  # the budget bites for some hop count, not for all
    assert collections.Counter(r["hops"] for r in records) == {h: min(accepted) for h in cfg.hops}
    assert all(stats["per_hop"][str(h)]["emitted"] == min(accepted) for h in cfg.hops)


def test_kg_config_must_match_graph(kb, index):
    with pytest.raises(ValueError, match="cfg.relations differs"):
        chains.build_chain_pool(kb, index, chains.ChainConfig(relations=("P50",)), progress=False)


# --- micro-worlds: one rejection reason each ------------------------------------------------------------

def _micro(tmp_path, entities, articles, triples):
    """entities: {qnum: [aliases]}; articles: {title: text}; triples: [(h, 'P..', t)]."""
    (tmp_path / "train.txt").write_text("".join(f"Q{h}\t{r}\tQ{t}\n" for h, r, t in triples))
    (tmp_path / "valid.txt").write_text("")
    (tmp_path / "e.txt").write_text("".join(f"Q{q}\t" + "\t".join(a) + "\n" for q, a in entities.items()))
    (tmp_path / "r.txt").write_text("P50\tauthor\nP17\tcountry\nP131\tlocated in\nP69\teducated at\n")
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n"
                                              for i, (t, x) in enumerate(articles.items())))
    paths = {"train": tmp_path / "train.txt", "valid": tmp_path / "valid.txt", "entities": tmp_path / "e.txt",
             "relations": tmp_path / "r.txt", "corpus": tmp_path / "c.jsonl"}
    kb = _load(paths)
    return kb, BM25Index.build(list(iter_jsonl_corpus(paths["corpus"])))


def _run(kb, index, hops, n=3, attempts=10):
    cfg = chains.ChainConfig(n_per_hop=n, hops=hops, max_attempts_per_chain=attempts)
    records, stats = chains.build_chain_pool(kb, index, cfg, progress=False)
    return records, {k: v for k, v in stats["rejections"].items() if v}


ENTS = {1: ["Alba"], 2: ["Bram"], 3: ["Corin"], 4: ["Dova"]}
ARTS = {"Alba": "Alba knows Bram.", "Bram": "Bram knows Alba and Corin.", "Corin": "Corin is here.",
        "Dova": "Dova."}


@pytest.mark.parametrize("triples, hops, expected", [
    ([(1, "P50", 2)], (2,), {"dead_end"}),
    ([(1, "P50", 2), (2, "P50", 1)], (2,), {"cycle"}),
    ([(1, "P131", 2), (2, "P17", 3)], (2,), {"geo_nesting", "dead_end"}),
    ([(1, "P69", 2), (1, "P69", 3)], (1,), {"ambiguous_target"}),
    ([(1, "P69", 2), (1, "P69", 99), (2, "P50", 3)], (2,), {"ambiguous_hop", "dead_end"}),  # Q99: no article
    ([(3, "P50", 4)], (1,), {"no_mention", "duplicate"}),  # one walk: rejected once, then seen again
])
def test_kg_micro_world_rejection(tmp_path, triples, hops, expected):
    kb, index = _micro(tmp_path, {**ENTS, 99: ["Zed"]}, ARTS, triples)
    records, counts = _run(kb, index, hops)
    assert records == [] and set(counts) == expected
    assert counts.get("no_mention", 1) == 1


def test_kg_micro_world_duplicate(tmp_path):
    kb, index = _micro(tmp_path, ENTS, ARTS, [(1, "P50", 2)])
    records, counts = _run(kb, index, (1,), n=2)
    assert len(records) == 1 and counts == {"duplicate": 2 * 10 - 1}


def test_kg_micro_world_phase1_needs_word_boundary_and_unambiguous_alias(tmp_path):
    ents = {1: ["Alba"], 2: ["Bram Ash", "Ash"], 3: ["Ashford"], 4: ["Dova", "Ash"]}
    arts = {"Alba": "Alba lives in Ashford near an Ash tree.", "Bram Ash": "x", "Ashford": "y", "Dova": "z"}
    kb, index = _micro(tmp_path, ents, arts, [(1, "P50", 2), (1, "P17", 3)])
    records, counts = _run(kb, index, (1,), n=1, attempts=40)
    # "ash" belongs to Q2 and Q4 (ambiguous), so only the P17 edge to Ashford can pass phase 1
    assert [r["entities"][1]["title"] for r in records] == ["Ashford"]
    assert counts["no_mention"] > 0


def test_kg_micro_world_phase2(tmp_path):
    # Corin's article does not name Bram: the hop Bram -> Corin is unreachable by searching "Bram"
    kb, index = _micro(tmp_path, ENTS, {**ARTS, "Corin": "Corin is here."}, [(1, "P50", 2), (2, "P50", 3)])
    records, counts = _run(kb, index, (2,), n=1)
    assert records == [] and counts.get("unreachable", 0) > 0
    # once Corin's article names Bram, a search for "Bram" reaches it
    kb, index = _micro(tmp_path, ENTS, {**ARTS, "Corin": "Corin met Bram."}, [(1, "P50", 2), (2, "P50", 3)])
    records, counts = _run(kb, index, (2,), n=1)
    assert [[e["title"] for e in r["entities"]] for r in records] == [["Alba", "Bram", "Corin"]]
    assert records[0]["hop_evidence"][0]["query"] == "Bram"


def test_kg_hop_accepts_mention_option(tmp_path):
    # Corin's article is not retrieved for "Bram", but Bram's own article names Corin
    kb, index = _micro(tmp_path, ENTS, ARTS, [(1, "P50", 2), (2, "P50", 3)])
    cfg = chains.ChainConfig(n_per_hop=1, hops=(2,), max_attempts_per_chain=10, hop_accepts_mention=True)
    records, _ = chains.build_chain_pool(kb, index, cfg, progress=False)
    assert len(records) == 1 and records[0]["hop_evidence"][0]["reached_ids"] == ["1"]


def test_kg_whitelist_documented():
    assert len(chains.WHITELIST) == 40
    paper = {"P50", "P170", "P86", "P57", "P58", "P175", "P17", "P159", "P495", "P740", "P106", "P69", "P108",
             "P39", "P176", "P264", "P123", "P272", "P800", "P166", "P101", "P136"}
    assert set(chains.PAPER_RELATIONS) == paper
    assert all(label and why for label, why in chains.ADDED_RELATIONS.values())
    assert not set(chains.ADDED_RELATIONS) & paper
    assert np.all([p in chains.GEO_NESTING for p in ("P131", "P17", "P30", "P150")])

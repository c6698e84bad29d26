"""The synthetic world (searchjax.data.synthetic): deterministic, written in the exact Wikidata5M and
wiki-18 layouts, read back unchanged by the kg readers, and containing every feature the chain
sampler's checks need (checked here from the files and the ground truth, not through the sampler)."""

import collections
import json
import re
import subprocess
import sys

import pytest

from retrieval.corpus import parse_contents
from searchjax.data import synthetic
from searchjax.drfree import chains, kg


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return synthetic.write_world(tmp_path_factory.mktemp("world"))


def _files(world):
    return {name: path.read_bytes() for name, path in world.paths.items()}


def test_synthetic_world_deterministic(world, tmp_path):
    assert _files(synthetic.write_world(tmp_path / "same")) == _files(world)
    other = synthetic.write_world(tmp_path / "other", synthetic.WorldConfig(seed=1))
    assert _files(other)["train"] != _files(world)["train"]


def test_synthetic_world_exact_layouts(world):
    for name in ("train", "valid"):
        lines = world.paths[name].read_text(encoding="utf-8").splitlines()
        assert lines and all(re.fullmatch(r"Q\d+\tP\d+\tQ\d+", line) for line in lines)
    for name, prefix in (("entities", "Q"), ("relations", "P")):
        lines = world.paths[name].read_text(encoding="utf-8").splitlines()
        assert all(re.fullmatch(prefix + r"\d+(\t[^\t\n]+)+", line) for line in lines)
    for line in world.paths["corpus"].read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        assert set(record) == {"id", "contents"}
        assert re.match(r'"[^"\n]+"\n', record["contents"])


def test_synthetic_world_read_back_by_kg_readers(world):
    read = [t for name in ("train", "valid") for t in kg.iter_triples(world.paths[name])]
    assert sorted(read) == sorted(map(tuple, world.triples.tolist()))
    assert len(read) == len(set(read))
    lines = list(kg.iter_alias_lines(world.paths["entities"], "Q"))
    assert {x.number: list(x.aliases) for x in lines} == {e.qnum: e.aliases for e in world.entities}
    labels = kg.read_relation_labels(world.paths["relations"])
    assert {int(r) for r in world.triples[:, 1]} <= set(labels)
    assert all(labels[int(p[1:])] == label for p, label in chains.WHITELIST.items() if int(p[1:]) in labels)
    pm = kg.read_passage_map(world.paths["corpus"])
    assert sorted(pm.titles) == sorted({p.title for p in world.passages})


def test_synthetic_world_has_every_feature(world):
    ents = {e.qnum: e for e in world.entities}
    owners = collections.defaultdict(set)
    for e in world.entities:
        for a in e.aliases:
            owners[a.lower()].add(e.qnum)
    assert any(len(q) > 1 for q in owners.values())                              # ambiguous aliases
    assert any(e.title and e.title != e.label and "(" in e.title for e in world.entities)  # homonyms
    assert any(e.title is None for e in world.entities if e.kind == "person")    # no article
    orphan = {p.title for p in world.passages} - {e.title for e in world.entities}
    assert orphan and any(t in e.aliases for e in world.entities for t in orphan)  # several titles
    pairs = collections.Counter((h, r) for h, r, _ in world.triples.tolist())
    whitelisted = {int(p[1:]) for p in chains.WHITELIST}
    assert any(n > 1 and r in whitelisted for (_, r), n in pairs.items())        # multi-valued instances
    assert any(r not in whitelisted for _, r in pairs)                            # non-whitelisted relations
    rel = collections.defaultdict(dict)
    for h, r, t in world.triples.tolist():
        rel[r][h] = t
    assert any(region in rel[17] for region in rel[131].values())                # city -P131-> region -P17->
    assert {e.kind for e in world.entities} >= {"person", "film", "book", "company", "city", "country"}
    per_title = collections.Counter(p.title for p in world.passages)
    assert max(per_title.values()) > 1                                            # multi-passage articles
    # an article that leaves out one of its out-neighbours (no alias of the tail in any of its passages)
    omitted = 0
    for h, r, t in world.triples.tolist():
        if r in (19, 57, 50) and ents[h].title:
            text = " ".join(p.text for p in world.passages_of(ents[h].title))
            omitted += not any(a in text for a in ents[t].aliases)
    assert omitted > 0
    assert all(parse_contents(f'"{p.title}"\n{p.text}') == (p.title, p.text) for p in world.passages)


def test_synthetic_scaled_config_size(tmp_path):
    target = 20000
    world = synthetic.write_world(tmp_path, synthetic.scaled_config(target))
    assert 0.7 * target < len(world.triples) < 1.3 * target


def test_synthetic_build_chains_entry_point(tmp_path):
    out = subprocess.run([sys.executable, "-m", "launch.build_chains", f"--out_dir={tmp_path}", "--synthetic_world",
                          "--n_per_hop=3", "--max_attempts_per_chain=2000", "--noprogress"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    records = chains.read_chain_pool(tmp_path / "chains.jsonl")
    assert collections.Counter(r["hops"] for r in records) == {1: 3, 2: 3, 3: 3}
    stats = json.loads((tmp_path / "chain_stats.json").read_text())
    assert stats["chains"] == 9 and set(stats["rejections"]) == set(chains.REJECTION_REASONS)

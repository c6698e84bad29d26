"""Dr.Free chain sampling: acyclic walks over whitelisted relations, filtered and verified by retrieval.

A chain is e0 -r1-> e1 ... -rh-> eh over grounded entities (`searchjax.drfree.kg`), h in {1, 2, 3}. One
candidate is drawn as a random walk: e0 uniform over grounded entities with an out-edge, then at each
step one out-edge uniform over the current entity's whitelisted edges. It is rejected, and the reason
counted, at the first failing check:

    dead_end          the walk reached an entity without out-edges before h hops
    cycle             the next entity is already on the chain (chains are acyclic)
    geo_nesting       two consecutive geographic-nesting relations (city -P131-> region -P17-> country)
    ambiguous_hop     an intermediate (e_k, r_k+1) has several tails in the triples: "the r of e_k" is unclear
    ambiguous_target  the last (e_h-1, r_h) has several tails: the answer is not unique
    duplicate         the same chain was already drawn (whether it was then accepted or rejected)
    no_mention        phase 1: no passage of e0 mentions e1 (any unambiguous alias, on word boundaries)
    unreachable       phase 2: for some intermediate hop k (1 <= k < h), the top-`hop_topk` retrieval for
                      e_k's name does not reach an article of e_k+1

Phase 1 checks that the first hop is readable off the seed passage the proposer starts from; phase 2
that a solver who has found e_k can reach e_k+1 with one search. Uniqueness is required of every hop,
not only the last: if e0 had two r1-tails, the question "the r2 of the r1 of e0" would have two answers.

Sampling is stratified by hop count: each h gets the same quota and the same attempt budget, and the
pool keeps min_h(accepted_h) chains per h, so hop counts are exactly balanced (1:1:1).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import random
import time
from typing import Protocol, Sequence

import numpy as np
from tqdm import tqdm

from retrieval.corpus import Passage
from searchjax.data.jsonl import iter_jsonl
from searchjax.drfree.kg import KnowledgeBase, mentions_alias, normalize_text

# The paper's relations: functional (one value: P50 author of most books, P57 director, P17 country,
# P159 headquarters) or near-functional (usually one value: P106 occupation, P69 educated at, P166 award
# received). Multi-valued instances are removed per (head, relation) by the uniqueness checks.
PAPER_RELATIONS = {
    "P50": "author", "P170": "creator", "P86": "composer", "P57": "director", "P58": "screenwriter",
    "P175": "performer", "P17": "country", "P159": "headquarters location", "P495": "country of origin",
    "P740": "location of formation", "P106": "occupation", "P69": "educated at", "P108": "employer",
    "P39": "position held", "P176": "manufacturer", "P264": "record label", "P123": "publisher",
    "P272": "production company", "P800": "notable work", "P166": "award received", "P101": "field of work",
    "P136": "genre",
}

# Our additions, each (label, why it has one value for most heads). All are Wikidata5M relations between
# items (no literals); multi-valued heads are filtered per chain as for the paper's relations.
ADDED_RELATIONS = {
    "P19": ("place of birth", "a person is born in one place"),
    "P20": ("place of death", "a person dies in one place"),
    "P27": ("country of citizenship", "one country for most people; dual citizens are filtered"),
    "P36": ("capital", "a country or region has one capital (a few, e.g. Bolivia, have two)"),
    "P131": ("located in the administrative territorial entity", "the one smallest enclosing unit"),
    "P276": ("location", "where an object, event or collection is: usually one place"),
    "P706": ("located in/on physical feature", "usually one mountain range, island or lake"),
    "P30": ("continent", "one continent except transcontinental countries"),
    "P22": ("father", "exactly one"),
    "P25": ("mother", "exactly one"),
    "P112": ("founded by", "one founder for most organisations"),
    "P127": ("owned by", "one owner at a time for most companies and buildings"),
    "P449": ("original broadcaster", "a TV series premieres on one network"),
    "P364": ("original language of film or TV show", "one original language for most films"),
    "P178": ("developer", "one developer for most software and video games"),
    "P84": ("architect", "one architect or firm for most buildings"),
    "P155": ("follows", "the one preceding item of a series"),
    "P156": ("followed by", "the one next item of a series"),
}

WHITELIST = {**PAPER_RELATIONS, **{p: label for p, (label, _) in ADDED_RELATIONS.items()}}

# Geographic nesting: relations between two places stating that one contains the other. Two in a row
# make a trivial "climb the map" chain (city -P131-> region -P17-> country), so they are not allowed
# consecutively. P17 counts even from a non-place (a company's country) since its tail is a container;
# P150 (contains administrative territorial entity) is the inverse of P131 and P36/P1376 (capital,
# capital of) link a territory and the place inside it. P159, P740, P19, P20 lead from a non-place to a
# place and are not nesting: "the country (P17) of X's birthplace (P19)" is a real two-step question.
GEO_NESTING = frozenset({"P131", "P17", "P30", "P276", "P706", "P150", "P36", "P1376"})

REJECTION_REASONS = ("dead_end", "cycle", "geo_nesting", "ambiguous_hop", "ambiguous_target", "duplicate",
                     "no_mention", "unreachable")


class Searcher(Protocol):
    """What verification needs of a retriever (retrieval.bm25.BM25Index, retrieval.client.*): hits with .title,
    .text and .id, best first."""

    def search(self, queries: list[str], topk: int) -> list[list]: ...


@dataclasses.dataclass(frozen=True)
class ChainConfig:
    n_per_hop: int = 1000            # chains wanted per hop count; the pool keeps min over hops of what was found
    hops: tuple[int, ...] = (1, 2, 3)
    max_attempts_per_chain: int = 200  # attempt budget of one hop count = n_per_hop * this
    hop_topk: int = 3                # phase 2: retrieval depth that must reach e_k+1's article
    hop_query: str = "{entity}"      # phase 2 query; {entity} = e_k's article title, {relation} = r_k+1's label
    hop_accepts_mention: bool = False  # phase 2: also accept a hit that mentions e_k+1 (not only its article)
    retrieval_batch: int = 64        # chains verified per retriever call (queries are batched)
    relations: tuple[str, ...] = tuple(WHITELIST)
    geo_nesting: tuple[str, ...] = tuple(sorted(GEO_NESTING))
    seed: int = 0


def relation_numbers(pids: Sequence[str]) -> list[int]:
    """['P50', 'P17'] -> [50, 17]; a malformed id raises naming it."""
    out = []
    for pid in pids:
        if not (pid[:1] == "P" and pid[1:].isdigit()):
            raise ValueError(f"relation id {pid!r} is not of the form P<digits>")
        out.append(int(pid[1:]))
    return out


@dataclasses.dataclass
class _Walker:
    kb: KnowledgeBase
    geo: np.ndarray     # [R] bool, relation index is geographic nesting
    starts: np.ndarray  # grounded indices with at least one edge


def _walker(kb: KnowledgeBase, cfg: ChainConfig) -> _Walker:
    geo_numbers = set(relation_numbers(cfg.geo_nesting))
    geo = np.array([int(r) in geo_numbers for r in kb.graph.relations], dtype=bool)
    return _Walker(kb, geo, np.flatnonzero(np.diff(kb.graph.indptr) > 0))


def sample_walk(walker: _Walker, hops: int, rng: random.Random) -> tuple[list[int], list[int]] | str:
    """(entities e0..eh, relation indices r1..rh) of one random walk, or the rejection reason."""
    g = walker.kb.graph
    entity = int(walker.starts[rng.randrange(len(walker.starts))])
    entities, relations = [entity], []
    for k in range(hops):
        lo, hi = int(g.indptr[entity]), int(g.indptr[entity + 1])
        if lo == hi:
            return "dead_end"
        edge = rng.randrange(lo, hi)
        tail, relation = int(g.edge_tail[edge]), int(g.edge_relation[edge])
        if tail in entities:
            return "cycle"
        if relations and walker.geo[relation] and walker.geo[relations[-1]]:
            return "geo_nesting"
        if g.edge_tails_of_head[edge] > 1:
            return "ambiguous_target" if k == hops - 1 else "ambiguous_hop"
        entities.append(tail)
        relations.append(relation)
        entity = tail
    return entities, relations


def mentioning_passage(kb: KnowledgeBase, source: int, target: int) -> Passage | None:
    """Phase 1: the first passage of `source`'s article that mentions `target` by an unambiguous alias."""
    keys = kb.mention_keys(target)
    for passage in kb.entity_passages(source):
        if mentions_alias(normalize_text(passage.text), keys):
            return passage
    return None


def hop_query(kb: KnowledgeBase, entities: Sequence[int], relations: Sequence[int], k: int, cfg: ChainConfig) -> str:
    """The phase 2 query for hop k (1-based entity index): e_k's title, optionally with r_k+1's label."""
    return cfg.hop_query.format(entity=kb.title(entities[k]), relation=kb.relation_label(relations[k]))


def hit_reaches(kb: KnowledgeBase, hit, target: int, cfg: ChainConfig) -> bool:
    """Whether a retrieved hit is an article of `target` (or, with hop_accepts_mention, mentions it)."""
    if kb.passages.title_index.get(hit.title, -1) == int(kb.grounding.title[target]):
        return True
    return cfg.hop_accepts_mention and mentions_alias(normalize_text(hit.text), kb.mention_keys(target))


def _verify_hops(kb: KnowledgeBase, retriever: Searcher, candidates: list, cfg: ChainConfig, cache: dict) -> list:
    """Phase 2 for a batch of (entities, relations): per candidate, the list of reaching hit ids or None."""
    queries = {hop_query(kb, e, r, k, cfg) for e, r in candidates for k in range(1, len(r))}
    missing = sorted(q for q in queries if q not in cache)
    if missing:
        for query, hits in zip(missing, retriever.search(missing, cfg.hop_topk)):
            cache[query] = list(hits)[:cfg.hop_topk]
    results = []
    for entities, relations in candidates:
        evidence = []
        for k in range(1, len(relations)):
            hits = cache[hop_query(kb, entities, relations, k, cfg)]
            reached = [h.id for h in hits if hit_reaches(kb, h, entities[k + 1], cfg)]
            if not reached:
                evidence = None
                break
            evidence.append({"query": hop_query(kb, entities, relations, k, cfg), "hit_ids": [h.id for h in hits],
                             "reached_ids": reached})
        results.append(evidence)
    return results


def _passage_json(p: Passage) -> dict:
    return {"id": p.id, "title": p.title, "text": p.text}


def chain_record(kb: KnowledgeBase, entities: list[int], relations: list[int], seed: Passage, evidence: list,
                 chain_id: str) -> dict:
    """The jsonl record of an accepted chain.

    passages[k] is a passage about e_k: the seed passage (which mentions e1) for k = 0, for 0 < k < h the
    first passage of e_k's article that mentions e_k+1 (else its first passage), for k = h the first.
    """
    passages = [seed]
    for k in range(1, len(entities)):
        nxt = mentioning_passage(kb, entities[k], entities[k + 1]) if k < len(relations) else None
        passages.append(nxt or kb.entity_passages(entities[k])[0])
    answer_aliases = kb.aliases(entities[-1])
    return {
        "id": chain_id, "hops": len(relations),
        "entities": [{"id": kb.qid(e), "title": kb.title(e), "label": kb.aliases(e)[0]} for e in entities],
        "relations": [{"id": f"P{int(kb.graph.relations[r])}", "label": kb.relation_label(r)} for r in relations],
        "triples": [[kb.qid(entities[k]), f"P{int(kb.graph.relations[relations[k]])}", kb.qid(entities[k + 1])]
                    for k in range(len(relations))],
        "answer": answer_aliases[0], "answer_aliases": list(answer_aliases),
        "passages": [_passage_json(p) for p in passages], "hop_evidence": evidence,
    }


def _sample_hop_count(kb, walker, retriever, hops, cfg, rng, cache, progress) -> tuple[list, dict]:
    counts = {reason: 0 for reason in REJECTION_REASONS}
    accepted: list[tuple] = []
    seen: set = set()
    attempts, budget = 0, cfg.n_per_hop * cfg.max_attempts_per_chain
    bar = tqdm(total=cfg.n_per_hop, desc=f"{hops}-hop chains", disable=not progress, leave=False)
    while len(accepted) < cfg.n_per_hop and attempts < budget:
        pending = []
        wanted = min(cfg.retrieval_batch, cfg.n_per_hop - len(accepted))
        while len(pending) < wanted and attempts < budget:
            attempts += 1
            walk = sample_walk(walker, hops, rng)
            if isinstance(walk, str):
                counts[walk] += 1
                continue
            key = (tuple(walk[0]), tuple(walk[1]))
            if key in seen:
                counts["duplicate"] += 1
                continue
            seen.add(key)
            seed = mentioning_passage(kb, walk[0][0], walk[0][1])
            if seed is None:
                counts["no_mention"] += 1
                continue
            pending.append((walk, seed))
        verdicts = _verify_hops(kb, retriever, [w for w, _ in pending], cfg, cache) if pending else []
        for (walk, seed), evidence in zip(pending, verdicts):
            if evidence is None:
                counts["unreachable"] += 1
            else:
                accepted.append((walk, seed, evidence))
                bar.update(1)
        bar.set_postfix(attempts=attempts, **{k: v for k, v in counts.items() if v})
    bar.close()
    return accepted, {"attempts": attempts, "accepted": len(accepted), "rejections": counts}


def build_chain_pool(kb: KnowledgeBase, retriever: Searcher, cfg: ChainConfig, *,
                     progress: bool = True) -> tuple[list[dict], dict]:
    """Sample, filter and verify chains for every hop count in cfg.hops; (records, statistics).

    Records are ordered by hop count then acceptance order; exactly min_h(accepted_h) per hop count.
    """
    start = time.perf_counter()
    if set(relation_numbers(cfg.relations)) != {int(r) for r in kb.graph.relations}:
        raise ValueError("cfg.relations differs from the relations the knowledge base's graph was built with "
                         "(load_knowledge_base(..., relations=relation_numbers(cfg.relations)))")
    walker = _walker(kb, cfg)
    if walker.starts.size == 0:
        raise ValueError("the grounded graph has no edge: no chain can be sampled (check grounding and relations)")
    rng = random.Random(cfg.seed)
    cache: dict = {}
    found, per_hop = {}, {}
    for hops in cfg.hops:
        found[hops], per_hop[hops] = _sample_hop_count(kb, walker, retriever, hops, cfg, rng, cache, progress)
    balanced = min(len(v) for v in found.values())
    records = []
    for hops in cfg.hops:
        per_hop[hops]["emitted"] = balanced
        for i, ((entities, relations), seed, evidence) in enumerate(found[hops][:balanced]):
            records.append(chain_record(kb, entities, relations, seed, evidence, f"h{hops}-{i:06d}"))
    totals = {reason: sum(s["rejections"][reason] for s in per_hop.values()) for reason in REJECTION_REASONS}
    relation_use: dict[str, int] = {}
    for record in records:
        for relation in record["relations"]:
            relation_use[relation["id"]] = relation_use.get(relation["id"], 0) + 1
    stats = {"config": dataclasses.asdict(cfg), "per_hop_emitted": balanced, "chains": len(records),
             "per_hop": {str(h): s for h, s in per_hop.items()}, "rejections": totals,
             "relations_in_chains": dict(sorted(relation_use.items(), key=lambda kv: -kv[1])),
             "grounding": kb.grounding.stats, "graph": kb.graph.stats, "retrieval_queries": len(cache),
             "seconds": round(time.perf_counter() - start, 3)}
    return records, stats


def write_chain_pool(out_dir: str | os.PathLike, records: list[dict], stats: dict) -> tuple[pathlib.Path, pathlib.Path]:
    """chains.jsonl (one record per line) and chain_stats.json in out_dir."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    chains, stats_path = out_dir / "chains.jsonl", out_dir / "chain_stats.json"
    with chains.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    stats_path.write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return chains, stats_path


def read_chain_pool(path: str | os.PathLike) -> list[dict]:
    """The records of a chains.jsonl file."""
    return [record for _, record in iter_jsonl(path)]

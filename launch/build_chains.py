r"""Build a Dr.Free chain pool: Wikidata5M + wiki-18 -> chains.jsonl + chain_stats.json.

Real data (a prebuilt index over the same wiki-18 file, see launch/build_index.py):

  python -m launch.build_chains --out_dir=chains/ \
    --triples=wikidata5m_transductive_train.txt,wikidata5m_transductive_valid.txt \
    --entities=wikidata5m_entity.txt --relations=wikidata5m_relation.txt \
    --corpus=wiki-18.jsonl --index_dir=indexes/wiki18_e5 --n_per_hop=20000

Offline, on the synthetic world (searchjax.data.synthetic) with an in-memory BM25 index:

  python -m launch.build_chains --out_dir=/tmp/chains --synthetic_world --n_per_hop=8

Scale check (memory and time at millions of triples; the world is written by a child process so the
peak RSS reported is that of chain building alone; see chains/scale_check.json):

  python -m launch.build_chains --out_dir=/tmp/chains_scale --scale_check_triples=3000000 --n_per_hop=50

Without --index_dir the retriever is BM25 (retrieval.bm25) built in memory over --corpus: fine for the
synthetic worlds, not for the 21M passages of wiki-18.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import resource
import subprocess
import sys
import time

from absl import app, flags

OUT_DIR = flags.DEFINE_string("out_dir", None, "Where chains.jsonl and chain_stats.json go.", required=True)
TRIPLES = flags.DEFINE_list("triples", [], "Wikidata5M triple files (head<TAB>relation<TAB>tail).")
ENTITIES = flags.DEFINE_string("entities", None, "wikidata5m_entity.txt (id<TAB>alias<TAB>...).")
RELATIONS = flags.DEFINE_string("relations", None, "wikidata5m_relation.txt (id<TAB>alias<TAB>...).")
CORPUS = flags.DEFINE_string("corpus", None, "wiki-18 jsonl ({'id', 'contents'}).")
INDEX_DIR = flags.DEFINE_string("index_dir", None, "A retrieval index directory (retrieval.open_index); "
                                "default: BM25 built in memory over --corpus.")
N_PER_HOP = flags.DEFINE_integer("n_per_hop", 1000, "Chains wanted per hop count (ChainConfig.n_per_hop).")
MAX_ATTEMPTS = flags.DEFINE_integer("max_attempts_per_chain", 200, "ChainConfig.max_attempts_per_chain.")
HOP_QUERY = flags.DEFINE_string("hop_query", "{entity}", "ChainConfig.hop_query.")
HOP_MENTION = flags.DEFINE_bool("hop_accepts_mention", False, "ChainConfig.hop_accepts_mention.")
SEED = flags.DEFINE_integer("seed", 0, "Sampling seed (and the synthetic world's).")
SYNTHETIC = flags.DEFINE_bool("synthetic_world", False, "Write the default synthetic world to out_dir/world "
                              "and build chains from it.")
SCALE_TRIPLES = flags.DEFINE_integer("scale_check_triples", 0, "If > 0: generate a synthetic world of about "
                                     "this many triples (child process), build chains, report peak RSS and time.")
WRITE_WORLD = flags.DEFINE_string("write_world", None, "Internal: only write a synthetic world here and exit "
                                  "(with --scale_check_triples, the scaled one).")
REUSE_WORLD = flags.DEFINE_bool("reuse_world", False, "With --synthetic_world / --scale_check_triples: keep an "
                                 "already written out_dir/world instead of generating it again.")
PROGRESS = flags.DEFINE_bool("progress", True, "tqdm progress bars.")


def _peak_rss_mb() -> float:
    """This process's peak resident set size so far, MiB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@contextlib.contextmanager
def _stage(report: dict, name: str):
    """Record a stage's wall time, CPU time (user + system; the machine may be shared) and the peak RSS so far."""
    wall, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    yield
    after = resource.getrusage(resource.RUSAGE_SELF)
    report[f"{name}_wall_s"] = round(time.perf_counter() - wall, 2)
    report[f"{name}_cpu_s"] = round(after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime, 2)
    report[f"{name}_peak_rss_mb"] = round(_peak_rss_mb(), 1)


def _world_files(directory: pathlib.Path) -> dict:
    return {"triples": [directory / "wikidata5m_transductive_train.txt",
                        directory / "wikidata5m_transductive_valid.txt"],
            "entities": directory / "wikidata5m_entity.txt", "relations": directory / "wikidata5m_relation.txt",
            "corpus": directory / "wiki18.jsonl"}


def _retriever(corpus: pathlib.Path):
    if INDEX_DIR.value:
        from retrieval import open_index
        return open_index(INDEX_DIR.value)
    from retrieval.bm25 import BM25Index
    from retrieval.corpus import iter_jsonl_corpus
    return BM25Index.build(list(iter_jsonl_corpus(corpus)))


def main(argv):
    del argv
    from searchjax.data import synthetic
    from searchjax.drfree import chains, kg

    if WRITE_WORLD.value:
        cfg = synthetic.scaled_config(SCALE_TRIPLES.value, SEED.value) if SCALE_TRIPLES.value else \
            synthetic.WorldConfig(seed=SEED.value)
        synthetic.write_world(WRITE_WORLD.value, cfg)
        return

    out_dir = pathlib.Path(OUT_DIR.value)
    report: dict = {}
    if SYNTHETIC.value or SCALE_TRIPLES.value:
        world = out_dir / "world"
        files = _world_files(world)
        if not (REUSE_WORLD.value and all(p.exists() for p in files["triples"] + [files["corpus"]])):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "launch.build_chains", f"--out_dir={out_dir}",
                            f"--write_world={world}", f"--scale_check_triples={SCALE_TRIPLES.value}",
                            f"--seed={SEED.value}"], check=True)
            report["world_wall_s"] = round(time.perf_counter() - start, 2)
            report["world_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
    else:
        missing = [name for name, v in (("triples", TRIPLES.value), ("entities", ENTITIES.value),
                                        ("relations", RELATIONS.value), ("corpus", CORPUS.value)) if not v]
        if missing:
            raise app.UsageError(f"missing --{', --'.join(missing)} (or pass --synthetic_world)")
        files = {"triples": [pathlib.Path(p) for p in TRIPLES.value], "entities": pathlib.Path(ENTITIES.value),
                 "relations": pathlib.Path(RELATIONS.value), "corpus": pathlib.Path(CORPUS.value)}

    cfg = chains.ChainConfig(n_per_hop=N_PER_HOP.value, max_attempts_per_chain=MAX_ATTEMPTS.value,
                             hop_query=HOP_QUERY.value, hop_accepts_mention=HOP_MENTION.value, seed=SEED.value)
    report["start_peak_rss_mb"] = round(_peak_rss_mb(), 1)
    with _stage(report, "kb"):
        kb = kg.load_knowledge_base(files["triples"], files["entities"], files["relations"], files["corpus"],
                                    chains.relation_numbers(cfg.relations), progress=PROGRESS.value)
    with _stage(report, "index"):
        retriever = _retriever(files["corpus"])
    with _stage(report, "chains"):
        records, stats = chains.build_chain_pool(kb, retriever, cfg, progress=PROGRESS.value)
    stats["run"] = report | {"files": {k: [str(p) for p in v] if isinstance(v, list) else str(v)
                                       for k, v in files.items()}}
    chains_path, stats_path = chains.write_chain_pool(out_dir, records, stats)
    summary = {"chains": len(records), "per_hop": stats["per_hop_emitted"], "rejections": stats["rejections"],
               "grounding": stats["grounding"], "graph_edges": stats["graph"]["edges"],
               "triples_read": stats["graph"]["triples_read"], **report}
    if SCALE_TRIPLES.value:
        (out_dir / "scale_check.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"wrote {chains_path} and {stats_path}")


if __name__ == "__main__":
    app.run(main)

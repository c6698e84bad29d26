r"""Dr.Free proposer training: chain prompts -> one proposal each (no search) -> anchor IG reward -> HRPO update.

One proposer step, run by the trainer's host loop (`searchjax.experiment.loop.train`) with three named parts:

    rollout_fn  "drfree_proposer"          `proposer_rollout`: one generation per chain prompt (group_size 1),
                                           a single turn without tools that stops at EOS
    reward_fn   "drfree_information_gain"  `searchjax.rewards.information_gain.information_gain_reward`
                                           (eq. 12) with a frozen anchor
              | "drzero_difficulty"        Dr.Zero's difficulty reward (`searchjax.rewards.difficulty`),
                                           n = 5 multi-turn solver rollouts per question (the ablation)
    advantage   "hrpo"                     Dr.Free eq. 9: z-scores within each hop count of the batch
                                           (`searchjax.experiment.loop.hrpo_estimator`, gathered across processes)

Prompts come from a chain pool (`searchjax.drfree.chains`): `config.chains.pool` is a chains.jsonl built by
launch/build_chains.py, or "synthetic" for a pool built here from the synthetic world
(`searchjax.data.synthetic`, the offline stand-in for Wikidata5M + wiki-18). Each chain becomes one
`chain_prompt` (its hop count rides on `Prompt.hops`, its record on `Prompt.metadata["chain"]`).

The anchor (IG) and the solver (difficulty) are frozen models named by `config.anchor` / `config.difficulty.
solver`: path "" is a frozen copy of the run's initial policy (the base model, the paper's first anchor);
otherwise an HF directory or .gguf file, e.g. a solver checkpoint exported by the solver's run
(`checkpoint.export_hf = True` writes <workdir>/hf/step_XXXXXX/), the paper's later anchor. The
self-evolution driver (`searchjax.experiment.self_evolution`) passes the previous iteration's solver in
memory instead (`SelfPlayComponents.frozen`), which overrides both sections.

The proposer kind (`config.proposer.kind`): "kg" (Dr.Free: one chain per prompt, no search; `proposer_rollout`)
or "search" (the "w/o KG" ablation: a Dr.Zero-style proposer that gets only the chain's seed passage and hop
count and searches before it writes; `searchjax.drfree.search_proposer`). The kind rides on
`SelfPlayComponents.proposer`, so the proposer stage and the generation stage call the same "drfree_proposer"
rollout, and the rewards read the evidence each trajectory carries either way.

Ablation rewards: "drfree_ig_difficulty" (IG + Difficulty, `build_ig_difficulty_reward`) adds Dr.Zero's
difficulty score of the frozen solver to eq. 12. Hop mixes: `config.chains.hops` (the chain lengths of
the pool, e.g. (1, 2, 3, 4)) and `config.chains.hop_ratio` (training chains per hop count, e.g. (4, 3, 2);
`apply_hop_ratio`).

  python -m launch.selfplay --config configs/drfree.py:quickstart --workdir /tmp/drfree_quickstart
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from searchjax import generation
from searchjax.agent.rollout import END_ANSWER, END_EOS, END_TURNS, RolloutConfig, Trajectory
from searchjax.drfree.proposer import chain_of, chain_prompts, parse_proposer_output, proposer_rows
from searchjax.eval.metrics import is_valid_answer
from searchjax.experiment.setup import Components

log = logging.getLogger(__name__)

PROPOSER_ROLLOUT = "drfree_proposer"
IG_REWARD = "drfree_information_gain"
DIFFICULTY_REWARD = "drzero_difficulty"
IG_DIFFICULTY_REWARD = "drfree_ig_difficulty"
_END_REASONS = {"stop": END_ANSWER, "eos": END_EOS, "length": END_TURNS}
PROPOSER_KINDS = ("kg", "search")  # config.proposer.kind: Dr.Free's chain proposer | the w/o KG ablation's searcher


@dataclasses.dataclass
class SelfPlayComponents(Components):
    """loop.Components plus the frozen model of the proposer's reward, passed in memory.

    frozen: (model, params, tokenizer) used as the IG anchor and as the difficulty solver instead of
    config.anchor / config.difficulty.solver; None = load those sections (`frozen_model`).
    proposer: the proposer kind (`PROPOSER_KINDS`, config.proposer.kind) the "drfree_proposer" rollout runs.
    """

    frozen: tuple | None = None
    proposer: str = "kg"


# ------------------------------------------------------------------------------------------------------
# Rollout: one proposal per prompt, single turn, no tool
# ------------------------------------------------------------------------------------------------------
def proposer_rollout(model, params, tokenizer, prompts: Sequence, cfg: RolloutConfig, *, seed: int,
                     logits_fn=None) -> list[Trajectory]:
    """cfg.group_size proposals per chain prompt (HRPO: 1), prompt-major, as rollout Trajectories.

    The prompt is the proposer's user message (`proposer_prompt_text`) rather than Search-R1's template;
    decoding is one turn of cfg.max_new_tokens_per_turn tokens that stops at EOS only (cfg.search must be
    False): the reply is read from its final <question>/<answer> tags, so a draft </answer> inside the
    reasoning must not end it. The KV cache has cfg.max_cache_len slots (fixed across steps, so decode
    compiles once). Every response token is the policy's (loss mask 1). `answer` is the proposed answer.
    """
    if cfg.search:
        raise ValueError("proposer_rollout: the proposer does not search; set rollout.search=False")
    if cfg.group_size < 1 or cfg.max_new_tokens_per_turn < 1:
        raise ValueError(f"proposer_rollout: need group_size >= 1 and max_new_tokens_per_turn >= 1, got {cfg}")
    prompts = list(prompts)
    uids = [p.uid for p in prompts]
    if not prompts or len(set(uids)) != len(uids):
        raise ValueError(f"proposer_rollout: prompts must be non-empty with unique uids, got {uids[:10]}")
    prompt_ids, rows, row_prompts = proposer_rows(prompts, tokenizer, cfg, "the proposer")
    session = generation.start(model, params, row_prompts, max_cache_len=cfg.max_cache_len, tokenizer=tokenizer,
                               seed=seed, logits_fn=logits_fn)
    _, outputs = generation.decode(session, cfg.max_new_tokens_per_turn, temperature=cfg.temperature,
                                   top_p=cfg.top_p, top_k=cfg.top_k)
    trajectories = []
    for (i, g), out in zip(rows, outputs):
        ids = [int(t) for t in out.token_ids]
        text = tokenizer.decode(ids)
        answer = parse_proposer_output(text).answer
        trajectories.append(Trajectory(
            prompt=prompts[i], sample_index=g, prompt_ids=list(prompt_ids[i]), response_ids=ids,
            loss_mask=[1] * len(ids), sampler_logprobs=[float(x) for x in out.logprobs], response_text=text,
            queries=[], doc_ids=[], retrieved=[],
            answer=answer, num_searches=0, duplicate_queries=0, forced_termination=False,
            valid_answer=is_valid_answer(answer), end_reason=_END_REASONS[out.stop_reason], num_turns=1))
    return trajectories


def proposer_rollout_fn(components, params, prompts: list, rollout_cfg: dict, seed: int) -> list:
    """The loop's rollout signature (searchjax.experiment.loop.ROLLOUT_FNS) around `proposer_rollout`, or the
    w/o KG proposer's search rollout when components.proposer is "search"."""
    kind = getattr(components, "proposer", "kg")
    if kind == "search":
        from searchjax.drfree.search_proposer import search_proposer_rollout
        return search_proposer_rollout(components.model, params, components.tokenizer, components.retriever, prompts,
                                       RolloutConfig(**rollout_cfg), seed=seed)
    if kind != "kg":
        raise ValueError(f"config.proposer.kind={kind!r}; valid: {PROPOSER_KINDS}")
    return proposer_rollout(components.model, params, components.tokenizer, prompts, RolloutConfig(**rollout_cfg),
                            seed=seed)


# ------------------------------------------------------------------------------------------------------
# Frozen models (anchor, solver) and the two reward builders
# ------------------------------------------------------------------------------------------------------
def frozen_model(section, components) -> tuple:
    """(model, params, tokenizer) of the frozen model a config section {path, tokenizer, dtype} names.

    path "": a copy of the run's initial policy parameters (the trainer donates and updates its own
    buffers, so the copy is what stays frozen); else an HF directory, a .gguf file or an alias of
    `searchjax.data.assets.MODEL_ALIASES`, loaded on the run's mesh. `SelfPlayComponents.frozen`, when
    set, wins over the section.
    """
    frozen = getattr(components, "frozen", None)
    if frozen is not None:
        return frozen
    if not section.path:
        return components.model, jax.tree.map(jnp.copy, components.params), components.tokenizer
    from searchjax.models import load_pretrained
    from searchjax.data.assets import resolve_model_path
    from searchjax.tokenization import load_tokenizer
    path = resolve_model_path(section.path)
    model, params = load_pretrained(path, dtype=section.dtype, mesh=components.mesh)
    tokenizer = load_tokenizer(resolve_model_path(section.tokenizer) if section.tokenizer else path)
    return model, params, tokenizer


def ig_config(config):
    """searchjax.rewards.information_gain.IGConfig from config.information_gain."""
    from searchjax.rewards.information_gain import IGConfig
    return IGConfig(**config.information_gain.to_dict())


def build_information_gain_reward(config, components, workdir):
    """Loop reward builder: Dr.Free's IG reward with the anchor of config.anchor and the run's retriever."""
    from searchjax.rewards.information_gain import make_information_gain_reward
    model, params, tokenizer = frozen_model(config.anchor, components)
    return make_information_gain_reward(model, params, tokenizer, components.retriever, ig_config(config))


def build_difficulty_reward(config, components, workdir):
    """Loop reward builder: Dr.Zero's difficulty reward with the solver of config.difficulty.solver, which
    answers each question in config.difficulty.rollout.group_size multi-turn search rollouts."""
    from searchjax.rewards.difficulty import make_difficulty_reward
    model, params, tokenizer = frozen_model(config.difficulty.solver, components)
    return make_difficulty_reward(model, params, tokenizer, components.retriever,
                                  RolloutConfig(**config.difficulty.rollout.to_dict()), base_seed=config.seed)


def build_ig_difficulty_reward(config, components, workdir):
    """Loop reward builder for the IG + Difficulty ablation: eq. 12 plus Dr.Zero's difficulty score.

        r = lam * s_fmt + [s_fmt = 1 and grounded] * s_IG + difficulty(c)

    with difficulty(c) = (n - c) / (n - 1) for 0 < c < n solver successes out of n, else 0
    (`searchjax.rewards.difficulty.difficulty_score`). The paper's exact combination was not available to
    us; this sum (each term as in its own paper, the format term counted once) is ours. The anchor and the
    solver are the same frozen model (`frozen_model(config.anchor)`, i.e. the previous solver in the loop).
    """
    from searchjax.rewards.base import RewardOutput
    from searchjax.rewards.difficulty import FORMAT_WEIGHT
    from searchjax.rewards.information_gain import format_score
    ig = build_information_gain_reward(config, components, workdir)
    difficulty = build_difficulty_reward(config, components, workdir)

    def reward_fn(trajectories):
        a, b = ig(trajectories), difficulty(trajectories)
        formats = np.asarray([format_score(t.response_text, chain_of(t)["answer"]) for t in trajectories])
        rewards = a.rewards + (b.rewards - FORMAT_WEIGHT * formats).astype(np.float32)  # b minus its format term
        return RewardOutput(rewards=rewards.astype(np.float32), metrics={**b.metrics, **a.metrics})
    return reward_fn


# ------------------------------------------------------------------------------------------------------
# Chain pools and the run's components
# ------------------------------------------------------------------------------------------------------
def synthetic_chain_pool(directory: str | os.PathLike, *, n_per_hop: int, seed: int = 0,
                         hops: Sequence[int] = (1, 2, 3)) -> tuple[list[dict], pathlib.Path]:
    """(chain records, corpus path) of a pool of `hops`-hop chains over the synthetic world
    (searchjax.data.synthetic) in `directory`.

    Written once (world/ and chains.jsonl, as `launch.build_chains --synthetic_world` does) and read back
    on later calls (a pool there with other hop counts is an error); the chains are verified against a
    BM25 index of the world's corpus.
    """
    from retrieval.bm25 import BM25Index
    from retrieval.corpus import read_jsonl_corpus
    from searchjax.data import synthetic
    from searchjax.drfree import chains, kg
    directory = pathlib.Path(directory)
    corpus = directory / "world" / "wiki18.jsonl"
    pool = directory / "chains.jsonl"
    if pool.exists() and corpus.exists():
        records = chains.read_chain_pool(pool)
        found = sorted({r["hops"] for r in records})
        if found != sorted(hops):
            raise ValueError(f"{pool}: a pool of {found}-hop chains, but config.chains.hops={tuple(hops)}; "
                             "use another chains.synthetic_dir")
        return records, corpus
    world = synthetic.write_world(directory / "world", synthetic.WorldConfig(seed=seed))
    cfg = chains.ChainConfig(n_per_hop=n_per_hop, hops=tuple(hops), max_attempts_per_chain=2000, seed=seed)
    kb = kg.load_knowledge_base([world.paths["train"], world.paths["valid"]], world.paths["entities"],
                                world.paths["relations"], world.paths["corpus"], chains.relation_numbers(cfg.relations),
                                progress=False)
    records, stats = chains.build_chain_pool(kb, BM25Index.build(read_jsonl_corpus(world.paths["corpus"])), cfg,
                                             progress=False)
    chains.write_chain_pool(directory, records, stats)
    return records, world.paths["corpus"]


def load_chains(config, workdir: pathlib.Path) -> tuple[list[dict], object]:
    """(chain records, retriever) for config.chains / config.retrieval (module docstring)."""
    from searchjax.drfree.chains import read_chain_pool
    from searchjax.experiment.setup import build_retriever
    pool = config.chains.pool
    if pool == "synthetic":
        from retrieval.bm25 import BM25Index
        from retrieval.client import InProcessRetriever
        from retrieval.corpus import read_jsonl_corpus
        hops = tuple(config.chains.hops)
        default_dir = workdir / ("synthetic_chains" if hops == (1, 2, 3) else
                                 f"synthetic_chains_h{''.join(map(str, hops))}")
        directory = pathlib.Path(config.chains.synthetic_dir).expanduser() if config.chains.synthetic_dir else \
            default_dir
        records, corpus = synthetic_chain_pool(directory, n_per_hop=config.chains.n_per_hop, seed=config.chains.seed,
                                               hops=hops)
        return records, InProcessRetriever(BM25Index.build(read_jsonl_corpus(corpus)))
    path = pathlib.Path(pool).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"config.chains.pool={pool!r}: no such file (build one with launch/build_chains.py, "
                                "or use 'synthetic')")
    return read_chain_pool(path), build_retriever(config.retrieval)


def build_components(config, workdir: str | os.PathLike):
    """loop.Components for proposer training: the policy on the mesh, its tokenizer, the chain prompts
    (config.chains.eval_chains of them held out for evaluation, `split_by_hops`) and the retriever."""
    from searchjax.distributed import process_shard
    from searchjax.models import Transformer, load_pretrained
    from searchjax.experiment import setup
    from searchjax.experiment.loop import Components
    from searchjax.tokenization import load_tokenizer
    workdir = pathlib.Path(workdir)
    mesh = setup.make_mesh_from_config(config.mesh)
    path = setup.resolve_model_path(config.model.path)
    model, params = load_pretrained(path, dtype=config.model.dtype, param_dtype=config.model.param_dtype, mesh=mesh)
    model = Transformer(model.config.replace(remat_policy=config.model.remat_policy))
    tokenizer = load_tokenizer(setup.resolve_model_path(config.model.tokenizer) if config.model.tokenizer else path)
    records, retriever = load_chains(config, workdir)
    kind = proposer_kind(config)
    prompts, dropped = proposer_prompts(records, kind, tokenizer, config.chains.max_prompt_tokens)
    if dropped:
        log.warning("dropped %d of %d chains whose proposer prompt exceeds %d tokens", dropped, len(records),
                    config.chains.max_prompt_tokens)
    train, held_out = split_by_hops(prompts, config.chains.eval_chains)
    train = apply_hop_ratio(train, tuple(config.chains.hops), tuple(config.chains.hop_ratio))
    return SelfPlayComponents(model=model, params=params, tokenizer=tokenizer, retriever=retriever,  # multi-host:
                              train_prompts=process_shard(train), eval_prompts=process_shard(held_out),  # each
                              mesh=mesh, proposer=kind)  # process its share


def proposer_kind(config) -> str:
    """config.proposer.kind, checked ("kg" when the config has no proposer section)."""
    kind = config.proposer.kind if "proposer" in config else "kg"
    if kind not in PROPOSER_KINDS:
        raise ValueError(f"config.proposer.kind={kind!r}; valid: {PROPOSER_KINDS}")
    return kind


def proposer_prompts(records: Sequence[dict], kind: str, tokenizer, max_prompt_tokens: int | None) -> tuple[list, int]:
    """(prompts, dropped) of the chain records for a proposer kind: chain prompts ("kg") or the w/o KG
    proposer's seed prompts ("search": the seed passage and hop count of each chain, nothing else of it)."""
    if kind == "search":
        from searchjax.drfree.search_proposer import DATA_SOURCE, seed_prompt
        return chain_prompts(records, tokenizer=tokenizer, max_prompt_tokens=max_prompt_tokens,
                             data_source=DATA_SOURCE, build=seed_prompt)
    return chain_prompts(records, tokenizer=tokenizer, max_prompt_tokens=max_prompt_tokens)


def round_robin_by_hops(prompts: Sequence) -> list:
    """Prompts reordered round-robin over hop counts (the first of each hop count in turn: 1, 2, 3, 1, 2, ...),
    keeping pool order within a hop count; a pool is written hop count by hop count."""
    by_hops: dict[int, list] = {}
    for p in prompts:
        by_hops.setdefault(p.hops, []).append(p)
    groups = [by_hops[h] for h in sorted(by_hops)]
    return [g[k] for k in range(max((len(g) for g in groups), default=0)) for g in groups if k < len(g)]


def split_by_hops(prompts: Sequence, held: int) -> tuple[list, list]:
    """(train, held out) of `round_robin_by_hops(prompts)`: the first `held` held out, so evaluation sees
    every hop count, and each process's contiguous `process_shard` of the rest mixes hop counts too."""
    if len(prompts) <= held:
        raise ValueError(f"config.chains: {len(prompts)} usable chains, but eval_chains={held} are held out")
    ordered = round_robin_by_hops(prompts)
    return ordered[held:], ordered[:held]


def apply_hop_ratio(prompts: Sequence, hops: Sequence[int], ratio: Sequence[int]) -> list:
    """The largest subset of `prompts` with hop counts hops[i] in the proportion ratio[i], interleaved in blocks.

    With m = min_i floor(available(hops[i]) / ratio[i]), m * ratio[i] prompts of hop count hops[i] are kept
    (the first ones, in the given order), laid out as m blocks of ratio[0] of hops[0], ratio[1] of hops[1],
    ... so any contiguous shard keeps the mix. ratio () keeps `prompts` as they are. E.g. hops (1, 2, 3),
    ratio (4, 3, 2): 4 one-hop, 3 two-hop and 2 three-hop chains per block.
    """
    prompts = list(prompts)
    if not ratio:
        return prompts
    if len(ratio) != len(hops) or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in ratio):
        raise ValueError(f"config.chains.hop_ratio={tuple(ratio)} must give a positive integer for each of "
                         f"config.chains.hops={tuple(hops)}")
    by_hops = {h: [p for p in prompts if p.hops == h] for h in hops}
    m = min(len(by_hops[h]) // r for h, r in zip(hops, ratio))
    if m == 0:
        raise ValueError(f"config.chains.hop_ratio={tuple(ratio)}: chains per hop count "
                         f"{ {h: len(v) for h, v in by_hops.items()} } cannot fill one block")
    return [by_hops[h][b * r + i] for b in range(m) for h, r in zip(hops, ratio) for i in range(r)]


def train_proposer(config, workdir: str | os.PathLike, *, resume: bool = False, components=None) -> dict[str, float]:
    """Train the proposer for config.total_steps steps through `searchjax.experiment.loop.train`; the last step's
    metrics."""
    from searchjax.experiment import loop
    components = components or build_components(config, workdir)
    return loop.train(config, workdir, resume=resume, components=components)

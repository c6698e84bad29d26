"""Benchmark: Dr.Free's IG proposer reward vs Dr.Zero's difficulty reward, and the whole proposer step with each.

    python -m launch.benchmark --only=drfree [--iters=3] [--quick]

Same models, same batch, measured in one process (calls interleaved, so load from other processes hits
both sides alike): SmolLM2-135M-Instruct is the proposer, the IG anchor and the difficulty solver, in
`--dtype` (float32 by default; `auto`: the host's choice, bf16 on a CPU with AVX-512 BF16 or AMX); the chains
are the quickstart's synthetic pool (configs/drfree.py:quickstart, 8 chains per hop count, written to a
temporary directory) with BM25 over the synthetic corpus as the retriever.

1. Reward time per proposer question. The batch: B = the quickstart's prompts_per_step (6; quick: 3)
   chains, round-robin over hop counts, each with a templated well-formed, grounded reply ("What is the
   r_h of the ... r_1 of e_0?" -> e_h), so both rewards do their full work on every question:
     * IG (eq. 12): one retrieval call + one `answer_logliks` call over every context of the batch;
     * difficulty: n = 5 multi-turn search rollouts per question in one `rollout` call, with the solver
       rollout settings of configs/drfree.py: the quickstart's (2 searching turns x 48 tokens, 96-token
       observations, top-2) and, unless --quick, the paper variant's (Search-R1's: 4 turns x 500 tokens,
       500-token observations, top-3). The paper-solver comparison runs on the first
       PAPER_SOLVER_QUESTIONS_CPU questions of the batch on CPU (its 6144-slot KV cache for 6 x 5 rows takes
       8.5 GB in float32), the whole batch elsewhere; IG is re-timed on that same sub-batch.
   Median seconds per call / questions, calls interleaved; the first call (compilation) is reported apart.
   The solver's mean response tokens and searches per rollout are reported (a solver that answers early
   makes the difficulty reward cheaper). Goal: difficulty / IG >= 5.
2. The whole proposer update step (proposer generation, reward, old log-probs, update) through
   launch/selfplay.py (`searchjax.experiment.loop.train`) with each reward on the quickstart config (B prompts,
   128-token replies, quickstart solver settings), real SmolLM2 generation, each run in its own process
   (memory): median over the steps after the first (which compiles). Reported without a goal; the share
   of proposals each reward actually scored is reported next to it (a 135M proposer rarely writes a gated
   question, so IG scores few). These runs compute in the config's dtypes (the quickstart's anchor and solver
   in float32), whatever `--dtype` says. The temporary directory (chains, the runs' checkpoints) is removed at
   the end.

The paper's 7.37-9.61x is per update and also includes Dr.Zero's live proposer-side search, which ours
does not do.

    python -m launch.benchmark --only=drfree_paper

3. `run_paper_solver`: figure 1 with the paper's solver only, run to completion on as many questions as
   PAPER_SOLVER_BUDGET_S of wall time allow: gated questions in chunks of PAPER_SOLVER_QUESTIONS_CPU (the KV
   cache of 2 x 5 rows x 6,144 slots), each chunk timed with both rewards (IG, then difficulty), chunks until
   the budget is spent; a chunk started is finished. The questions come from a pool of their own, larger than
   the quickstart's (PAPER_SOLVER_CHAINS_PER_HOP: the synthetic world holds ~30 chains per hop count, 90 gated
   questions, more than 45 minutes take at bf16's ~47 s a question), so the budget, not the pool, ends the run;
   the rows say which did (`stopped_by`). Reported: seconds per question of each reward over all chunks (the
   sum over the questions, and the median / min / max per chunk), their ratio, and the first chunk apart (it
   compiles). No lower bounds: every difficulty call ran to its end.
   Measured (2026-12-02, 2-core AMD EPYC, float32, alone): 12 questions in 6 chunks, 52.5 min; IG 6.4 s and
   difficulty 255.9 s per question, 40.0x (36.2x after the first chunk); the 135M solver never searched.
   Again (2026-12-07, same host type, `--dtype=auto`: bf16): all 24 questions of the pool in 12 chunks, 19 min;
   IG 2.44 s and difficulty 44.8 s per question, 18.4x (16.7x after the first chunk). With this pool of its own
   (same day and host type, bf16): 60 of 90 questions in 30 chunks, stopped by the budget (45:39 wall); IG 2.54 s
   and difficulty 42.9 s per question, 16.9x (16.6x after the first chunk).
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import statistics
import tempfile
import time

from searchjax.bench.common import BenchArgs, block

REPO = pathlib.Path(__file__).resolve().parents[2]
PAPER_SOLVER_QUESTIONS_CPU = 2  # questions in the paper-solver comparison on CPU (KV-cache memory)
PAPER_SOLVER_BUDGET_S = 45 * 60  # wall time the paper-solver-only comparison may start chunks in
PAPER_SOLVER_CHAINS_PER_HOP = 32  # its pool's chains asked per hop count (the synthetic world has ~30 of each)


def _config(variant: str):
    spec = importlib.util.spec_from_file_location("searchjax_configs_drfree", REPO / "configs" / "drfree.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(variant)


def _variant(args: BenchArgs) -> str:
    """The configs/drfree.py variant measured: the quickstart, or with --quick its one-step smoke variant
    (3 chains, 32-token proposer replies, a one-turn 8-token solver): a smoke run of this harness, not a
    measurement."""
    return "quickstart_smoke" if args.quick else "quickstart"


def templated_reply(record: dict) -> str:
    """A well-formed proposer reply for a chain: "What is the r_h of the r_(h-1) of ... of e_0?" -> e_h."""
    relations = [r["label"] for r in reversed(record["relations"])]
    question = "What is the " + " of the ".join(relations) + f" of {record['entities'][0]['label']}?"
    return (f"<think>Follow the chain from {record['entities'][0]['label']}.</think>\n<question>{question}"
            f"</question>\n<answer>{record['answer']}</answer>")


def gated_batch(records: list[dict], size: int | None = None) -> list[dict]:
    """`size` chains (None: every one) round-robin over hop counts whose templated reply passes eq. 12's gate."""
    from searchjax.rewards.information_gain import check_proposal
    by_hops: dict[int, list[dict]] = {}
    for r in records:
        if check_proposal(templated_reply(r), r).gated:
            by_hops.setdefault(r["hops"], []).append(r)
    queues = [list(reversed(v)) for _, v in sorted(by_hops.items())]
    size = sum(map(len, queues)) if size is None else size
    out: list[dict] = []
    while len(out) < size and any(queues):
        for q in queues:
            if q and len(out) < size:
                out.append(q.pop())
    if len(out) < size:
        raise ValueError(f"only {len(out)} chains have a gated templated reply; need {size}")
    return out


def _trajectories(records: list[dict], tokenizer) -> list:
    from searchjax.agent.rollout import Trajectory
    from searchjax.drfree.proposer import chain_prompt
    out = []
    for r in records:
        text = templated_reply(r)
        ids = tokenizer.encode(text)
        out.append(Trajectory(prompt=chain_prompt(r), sample_index=0, prompt_ids=[0], response_ids=ids,
                              loss_mask=[1] * len(ids), sampler_logprobs=[0.0] * len(ids), response_text=text,
                              queries=[], doc_ids=[], retrieved=[], answer=r["answer"], num_searches=0,
                              duplicate_queries=0, forced_termination=False, valid_answer=True))
    return out


def _interleaved(fns: dict, iters: int) -> dict[str, list[float]]:
    times = {name: [] for name in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            start = time.perf_counter()
            block(fn())
            times[name].append(time.perf_counter() - start)
    return times


def update_step_rows(args: BenchArgs, work: pathlib.Path, batch_size: int) -> list[dict]:
    """Figure 2: the whole proposer step with each reward, each run in its own process (memory: every run
    holds a policy, Adam moments, a KL reference and a frozen anchor/solver copy of the model) through
    launch/selfplay.py on the quickstart config; medians of the time/* metrics after the first step."""
    import subprocess
    import sys
    from searchjax.experiment import selfplay
    steps = 2 if args.quick else 1 + max(2, min(args.iters, 3))
    rows = []
    for name, reward_name in (("ig", selfplay.IG_REWARD), ("difficulty_quickstart_solver", selfplay.DIFFICULTY_REWARD)):
        workdir = work / f"run_{name}"
        overrides = {"run": "proposer", "reward_fn": reward_name, "eval_reward_fn": reward_name, "total_steps": steps,
                     "prompts_per_step": batch_size, "batch.mini_batch_size": batch_size,
                     "batch.micro_batch_size": 1 if batch_size % 2 else 2, "eval.every": 0, "checkpoint.every": 0,
                     "logging.trajectories_per_step": 0, "logging.progress_bar": False,
                     "chains.synthetic_dir": str(work / "chains")}
        config_arg = f"{REPO / 'configs' / 'drfree.py'}:{_variant(args)}"
        subprocess.run([sys.executable, "-m", "launch.selfplay", "--config", config_arg, f"--workdir={workdir}",
                        *[f"--config.{k}={v}" for k, v in overrides.items()]], check=True, cwd=REPO)
        metrics = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
        timed = metrics[1:]
        med = lambda key: statistics.median(r[key] for r in timed)  # noqa: E731
        scored = "reward/ig/scored" if name == "ig" else "reward/difficulty/questions"
        rows.append({"figure": "whole proposer update step", "reward": name, "batch": batch_size,
                     "step_s": med("time/step"), "rollout_s": med("time/rollout"), "reward_s": med("time/reward"),
                     "old_logprob_s": med("time/old_logprob"), "update_s": med("time/update"),
                     "questions_scored": med(scored), "steps_timed": len(timed),
                     "first_step_s": metrics[0]["time/step"]})
    return rows


def _compare(args: BenchArgs, rewards: dict, trajectories: list, setting: str, *, warmup: int | None = None,
             iters: int | None = None) -> list[dict]:
    """Rows of figure 1 for one solver setting: each reward's median time per question on `trajectories`,
    calls interleaved; the first call (compilation) is reported apart."""
    outputs, first = {}, {}
    for name, fn in rewards.items():
        start = time.perf_counter()
        outputs[name] = fn(trajectories)
        first[name] = time.perf_counter() - start
    default = (0, min(args.iters, 2)) if args.quick else (args.warmup, args.iters)  # quick: a smoke run
    warmup = default[0] if warmup is None else warmup
    iters = default[1] if iters is None else iters
    for _ in range(warmup):
        for fn in rewards.values():
            fn(trajectories)
    times = _interleaved({name: (lambda fn=fn: fn(trajectories)) for name, fn in rewards.items()}, iters)
    batch_size = len(trajectories)
    rows = []
    ig_median = statistics.median(times["ig"])
    for name in rewards:
        median = statistics.median(times[name])
        m = outputs[name].metrics
        row = {"figure": f"reward per proposer question, {setting}", "reward": name, "batch": batch_size,
               "median_s_per_question": median / batch_size, "min_s_per_question": min(times[name]) / batch_size,
               "first_call_s": first[name], "x_vs_ig": median / ig_median}
        if name == "ig":
            row.update(anchor_contexts=m["ig/anchor_contexts"], questions_scored=m["ig/scored"])
        else:
            row.update(solver_rollouts=m["difficulty/solver_rollouts"], solve_rate=m["difficulty/solve_rate"],
                       solver_response_tokens=m["difficulty/solver_response_tokens"],
                       solver_searches=m["difficulty/solver_searches"], goal_5x_met=median / ig_median >= 5.0)
        rows.append(row)
    return rows


def _rewards(work: pathlib.Path, config, dtype: str, chains_per_hop: int | None = None):
    """(IG reward, difficulty(section) -> difficulty reward, chain records, tokenizer) on the quickstart's
    synthetic pool (`chains_per_hop` chains per hop count asked, the config's by default) and models, the model
    computing in `dtype` (`BenchArgs.dtype`: both rewards run on it)."""
    from retrieval.bm25 import BM25Index
    from retrieval.client import InProcessRetriever
    from retrieval.corpus import read_jsonl_corpus
    from searchjax.agent.rollout import RolloutConfig
    from searchjax.data.assets import resolve_model_path
    from searchjax.experiment import selfplay
    from searchjax.models import load_pretrained
    from searchjax.rewards.difficulty import make_difficulty_reward
    from searchjax.rewards.information_gain import make_information_gain_reward
    from searchjax.tokenization import load_tokenizer
    records, corpus = selfplay.synthetic_chain_pool(work / "chains", seed=config.chains.seed,
                                                    n_per_hop=chains_per_hop or config.chains.n_per_hop)
    retriever = InProcessRetriever(BM25Index.build(read_jsonl_corpus(corpus)))
    path = resolve_model_path(config.model.path)
    model, params = load_pretrained(path, dtype=dtype)
    tokenizer = load_tokenizer(path)
    ig = make_information_gain_reward(model, params, tokenizer, retriever, selfplay.ig_config(config))

    def difficulty(section):
        return make_difficulty_reward(model, params, tokenizer, retriever, RolloutConfig(**section.to_dict()),
                                      base_seed=config.seed)

    return ig, difficulty, records, tokenizer


def run_paper_solver(args: BenchArgs) -> list[dict]:
    """Figure 3 (module docstring): the paper solver's difficulty reward against IG on as many questions as
    PAPER_SOLVER_BUDGET_S allow."""
    import shutil
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_drfree_paper_"))
    try:
        config = _config(_variant(args))
        ig, difficulty, records, tokenizer = _rewards(work, config, args.dtype, PAPER_SOLVER_CHAINS_PER_HOP)
        paper = difficulty(_config("").difficulty.rollout)
        batch = gated_batch(records)
        chunks, started = [], time.perf_counter()
        for first in range(0, len(batch), PAPER_SOLVER_QUESTIONS_CPU):
            if chunks and time.perf_counter() - started > PAPER_SOLVER_BUDGET_S:
                break
            trajectories = _trajectories(batch[first:first + PAPER_SOLVER_QUESTIONS_CPU], tokenizer)
            chunk = {"questions": len(trajectories)}
            for name, fn in (("ig", ig), ("difficulty_paper_solver", paper)):
                start = time.perf_counter()
                out = fn(trajectories)
                chunk[name] = time.perf_counter() - start
                if name != "ig":
                    chunk.update({k: out.metrics[f"difficulty/{k}"] for k in
                                  ("solver_response_tokens", "solver_searches", "solve_rate")})
            chunks.append(chunk)
            print(f"drfree_paper chunk {len(chunks)}: {chunk}", flush=True)
        return _with_dtype(paper_solver_rows(chunks, time.perf_counter() - started, len(batch)), args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def paper_solver_rows(chunks: list[dict], wall_s: float, pool_questions: int) -> list[dict]:
    """Rows of figure 3 from its chunks ({"questions", "ig", "difficulty_paper_solver", solver metrics}):
    seconds per question of each reward over every chunk (sum of seconds / sum of questions), per chunk
    (median, min, max), over the chunks after the first (which compiles), and the ratio; what ended the run
    (`stopped_by`): the pool's `pool_questions` all ran, or the budget was spent first."""
    questions = sum(c["questions"] for c in chunks)
    rows = []
    for name in ("ig", "difficulty_paper_solver"):
        per_chunk = [c[name] / c["questions"] for c in chunks]
        later = chunks[1:] or chunks
        row = {"figure": "reward per proposer question, paper solver, to completion", "reward": name,
               "questions": questions, "chunks": len(chunks),
               "s_per_question": sum(c[name] for c in chunks) / questions,
               "s_per_question_after_first_chunk": sum(c[name] for c in later) / sum(c["questions"] for c in later),
               "median_s_per_question_per_chunk": statistics.median(per_chunk),
               "min_s_per_question_per_chunk": min(per_chunk), "max_s_per_question_per_chunk": max(per_chunk),
               "first_chunk_s": chunks[0][name]}
        if name != "ig":
            row.update({k: statistics.mean(c[k] for c in chunks)
                        for k in ("solver_response_tokens", "solver_searches", "solve_rate")})
        rows.append(row)
    rows[1]["x_vs_ig"] = rows[1]["s_per_question"] / rows[0]["s_per_question"]
    rows[1]["x_vs_ig_after_first_chunk"] = (rows[1]["s_per_question_after_first_chunk"]
                                            / rows[0]["s_per_question_after_first_chunk"])
    rows[1]["goal_5x_met"] = rows[1]["x_vs_ig"] >= 5.0
    rows[0].update(wall_s=wall_s, pool_questions=pool_questions,
                   stopped_by="pool" if questions >= pool_questions else "budget")
    return rows


def reward_rows(args: BenchArgs, work: pathlib.Path) -> tuple[list[dict], int]:
    """Figure 1: (rows, batch size): each reward's time per proposer question on the same gated batch."""
    import jax

    config = _config(_variant(args))
    batch_size = config.prompts_per_step
    ig, difficulty, records, tokenizer = _rewards(work, config, args.dtype)
    batch = gated_batch(records, batch_size)
    rows = _compare(args, {"ig": ig, "difficulty_quickstart_solver": difficulty(config.difficulty.rollout)},
                    _trajectories(batch, tokenizer), "quickstart solver")
    if not args.quick:
        # The paper's solver (4 turns x 500 tokens) on a batch whose KV cache fits host memory on CPU:
        # PAPER_SOLVER_QUESTIONS_CPU questions x 5 rollouts x 6144 slots (2.8 GB in float32).
        size = batch_size if jax.default_backend() != "cpu" else PAPER_SOLVER_QUESTIONS_CPU
        paper = {"ig": ig, "difficulty_paper_solver": difficulty(_config("").difficulty.rollout)}
        # One timed call after the first: each difficulty call is minutes of decoding on CPU (compilation is
        # a small part of the first one, which is reported too).
        rows += _compare(args, paper, _trajectories(batch[:size], tokenizer), "paper solver", warmup=0, iters=1)
    return _with_dtype(rows, args), batch_size


def _with_dtype(rows: list[dict], args: BenchArgs) -> list[dict]:
    """The reward rows with the dtype their model computed in (`--dtype`, "auto" resolved for this host)."""
    from searchjax.runtime import resolve_dtype
    return [{**row, "dtype": resolve_dtype(args.dtype)} for row in rows]


def run(args: BenchArgs) -> list[dict]:
    import shutil

    import jax
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_drfree_"))
    try:
        rows, batch_size = reward_rows(args, work)
        rows[0].update(jax_backend=jax.default_backend(), config=f"configs/drfree.py:{_variant(args)}")
        return rows + update_step_rows(args, work, batch_size)
    finally:  # each update-step run leaves a checkpoint of the policy and its optimizer state (GBs)
        shutil.rmtree(work, ignore_errors=True)

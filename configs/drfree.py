r"""Dr.Free: proposer/solver self-evolution; the proposer trained with HRPO on the shortcut-aware
information-gain reward (or Dr.Zero's difficulty reward), the solver with GRPO on the proposer's questions.

The loop (config.run = "self_evolution", searchjax/experiment/self_evolution.py): for each of
self_evolution.iterations (3) iterations, total_steps (50) proposer updates -> generation of the solver's
question-answer pairs from freshly sampled chains -> solver.total_steps (50) GRPO updates of the solver
on them -> that solver becomes the IG anchor of the next iteration. config.run = "proposer" trains the
proposer alone (the description below).

What it does: each step takes `prompts_per_step` chains of 1-3 hops from a chain pool, asks the policy (the
proposer) for ONE question per chain, without searching (<think>/<question>/<answer>, prompt after the
paper's Table 17), and rewards it with eq. 12: 0.2 * s_fmt + [s_fmt = 1 and grounded] * s_IG, where s_IG is
tau * tanh(max(0, g) / tau) of the gain of the full chain evidence over the best shortcut (closed book,
source passage, one retrieval, each hop passage) in a frozen anchor's answer log-likelihood (eqs. 3-7).
Advantages are HRPO's (eq. 9): z-scores within each hop count of the batch. searchjax/experiment/selfplay.py
and searchjax/rewards/information_gain.py have the details.

Variants (`--config configs/drfree.py:<variant>[,<ablation>...]`):
  qwen2.5-3b-instruct (default ""), qwen2.5-7b-instruct, or any model preset of configs/search_r1.py: the
    paper's settings (appendix A.1): proposer 256 chains per step (one generation each), PPO mini-batch 128,
    AdamW lr 1e-6 with 3 % warmup then constant, weight decay 0.01, grad clip 0.1, 50 steps, prompts up to
    2560 tokens, no tool use; solver 256 questions x 5 rollouts per step, mini-batch 128 questions, the same
    optimizer, 50 steps; BF16 with f32 master weights; three iterations. Needs a chain pool
    (launch/build_chains.py over Wikidata5M + wiki-18) in chains.pool and the wiki-18 retriever of
    configs/search_r1.py (retrieval.url) for the retrieval shortcut. Expected result (paper): the share of
    questions with positive gain and the mean IG rise over the 50 steps while source-passage and hop
    shortcuts win less often (metrics reward/ig/*). Run time: hours on 8 GPUs.
  quickstart: SmolLM2-135M-Instruct proposer on a pool of 24 chains (8 per hop count) built from the
    synthetic world (searchjax.data.synthetic) into <workdir>/synthetic_chains, BM25 over the world's corpus,
    the base model as anchor. A 135M model seldom writes a well-formed, grounded question about made-up
    entities, so most rewards are the format term: this run shows the machinery, not the paper's gains.
    One iteration: 4 proposer steps, generation over the 21 training chains (budget 4 pairs), 2 solver
    steps (skipped when no proposal passes the gate). Not timed with this prompt (prompts of 805-1207
    tokens); the proposer part took about 10 minutes on 2 CPU cores with the earlier, shorter prompt.
  quickstart_smoke: one tiny step per stage of the quickstart (a pipeline check).

Ablations (the paper's Tables 2-3 and Figure 4; append to the variant after a comma, several allowed):
  difficulty: Difficulty only (Dr.Zero's reward with the frozen solver); ig_difficulty: IG + Difficulty;
  no_proposer_training: the base proposer generates every iteration's questions; hops_111, hops_432,
  hops_1111: training chains per hop count 1:1:1, 4:3:2, or 1:1:1:1 over 1-4-hop chains; frozen_anchor:
  the base model stays the IG anchor (Figure 4's frozen curve); loo_closed_book, loo_source,
  loo_retrieval, loo_hop: one shortcut type left out of eq. 6 (Table 3); no_kg: "w/o KG", a Dr.Zero-style
  proposer (proposer.kind = "search", searchjax/drfree/search_proposer.py) that gets each chain's seed passage
  and hop count h but no chain, and searches (the Search-R1 tool protocol, 4 searching turns with the
  proposer's reply budget per turn, the solver's observation and top-k settings) before its final
  <question>/<answer>; its questions go through the same IG reward, HRPO, generation and solver stages,
  and its qa_pairs.jsonl records each question's searches for the Table 4 audit (searchjax/drfree/audit.py).

Dr.Zero's difficulty reward instead of IG (the paper's ablation): --config.reward_fn=drzero_difficulty
--config.eval_reward_fn=drzero_difficulty (n = difficulty.rollout.group_size = 5 solver rollouts per question).
The anchor can be a trained solver instead of the base model: --config.anchor.path=<solver run>/hf/step_000200.

  python -m launch.selfplay --config configs/drfree.py:quickstart --workdir /tmp/drfree_quickstart
  python -m launch.selfplay --config configs/drfree.py:quickstart_smoke --workdir /tmp/drfree_smoke
  python -m launch.selfplay --config configs/drfree.py:quickstart,frozen_anchor --workdir /tmp/drfree_frozen
  python -m launch.selfplay --config configs/drfree.py:quickstart,no_kg --workdir /tmp/drfree_no_kg
  python -m launch.selfplay --config configs/drfree.py:qwen2.5-7b-instruct --workdir ~/runs/drfree \
      --config.chains.pool=~/chains/chains.jsonl --config.retrieval.url=http://127.0.0.1:8000
  python -m launch.selfplay --config configs/drfree.py:quickstart --workdir /tmp/drfree_proposer --config.run=proposer
"""


import ml_collections
from searchjax.config_files import sibling

QUICK_VARIANTS = ("quickstart", "quickstart_smoke")
DEFAULT_MODEL = "qwen2.5-3b-instruct"
RUNS = ("self_evolution", "proposer")  # launch/selfplay.py: the whole loop, or proposer HRPO alone


def _leave_out(kind: str):
    def apply(c):
        c.information_gain.leave_out = (kind,)
    return apply


def _hop_mix(hops: tuple, ratio: tuple):
    def apply(c):
        c.chains.hops, c.chains.hop_ratio = hops, ratio
    return apply


def _set(path: str, value):
    def apply(c):
        *parents, leaf = path.split(".")
        node = c
        for name in parents:
            node = node[name]
        node[leaf] = value
    return apply


def _difficulty(c):
    c.reward_fn = c.eval_reward_fn = "drzero_difficulty"


def _ig_difficulty(c):
    c.reward_fn = c.eval_reward_fn = "drfree_ig_difficulty"


NO_KG_SEARCHES = 4  # searching turns of the w/o KG proposer: one per hop, up to 4-hop labels (hops_1111)
# Its prompt is the instruction and one seed passage: 475 SmolLM2 tokens with a one-sentence seed, about 600
# with a 100-word (wiki-18-sized) passage.
NO_KG_PROMPT_TOKENS = 1024


def _no_kg(c):
    """w/o KG: the searching proposer with the solver's observation and top-k settings; its reply budget per turn
    stays the proposer's. Seed prompts longer than NO_KG_PROMPT_TOKENS are dropped (counted); the cache and the
    largest response bucket are sized for every turn and observation (searchjax.experiment.validate checks)."""
    r, s = c.rollout, c.solver.rollout
    c.proposer.kind = "search"
    c.chains.max_prompt_tokens = NO_KG_PROMPT_TOKENS
    c.batch.prompt_buckets = (NO_KG_PROMPT_TOKENS // 2, NO_KG_PROMPT_TOKENS)
    r.search, r.max_turns = True, NO_KG_SEARCHES
    r.max_obs_tokens, r.topk = s.max_obs_tokens, s.topk
    append = max(16, 1 << (r.max_obs_tokens - 1).bit_length())  # generation.append_bucket: next power of two >= 16
    r.max_cache_len = NO_KG_PROMPT_TOKENS + (r.max_turns + 1) * r.max_new_tokens_per_turn + r.max_turns * append
    longest = (r.max_turns + 1) * r.max_new_tokens_per_turn + r.max_turns * r.max_obs_tokens
    c.batch.response_buckets = tuple(b for b in (128, 256, 512, 1024, 2048, 4096) if b < longest) + (
        -(-longest // 128) * 128,)


# The paper's ablations as config switches (`<variant>,<ablation>`); each only edits the fields it names.
ABLATIONS = {
    "difficulty": _difficulty,  # Difficulty only: Dr.Zero's reward, n = 5 solver rollouts per question
    "ig_difficulty": _ig_difficulty,  # IG + Difficulty (selfplay.build_ig_difficulty_reward)
    "no_proposer_training": _set("self_evolution.proposer_training", False),  # w/o proposer training
    "hops_111": _hop_mix((1, 2, 3), (1, 1, 1)),
    "hops_432": _hop_mix((1, 2, 3), (4, 3, 2)),
    "hops_1111": _hop_mix((1, 2, 3, 4), (1, 1, 1, 1)),  # 4-hop chains in the pool too
    "frozen_anchor": _set("self_evolution.anchor", "frozen"),  # Figure 4: the base model anchors every iteration
    "no_kg": _no_kg,  # w/o KG: a Dr.Zero-style proposer that searches from the chains' seed passages
    **{f"loo_{kind}": _leave_out(kind) for kind in ("closed_book", "source", "retrieval", "hop")},  # Table 3
}


def _sibling_config(name: str, arg: str):
    """get_config(arg) of configs/<name>.py (searchjax.config_files.sibling: loaded by path)."""
    return sibling(__file__, name).get_config(arg)


def chains_section(pool: str) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.pool = pool  # chains.jsonl of launch/build_chains.py, or "synthetic" (built under synthetic_dir)
    c.synthetic_dir = ""  # where the synthetic pool is written ("" = <workdir>/synthetic_chains)
    c.n_per_hop = 8  # synthetic pool: chains per hop count (1, 2, 3)
    c.seed = 0  # synthetic pool: world and sampling seed
    c.max_prompt_tokens = 2560  # chains whose proposer prompt is longer are dropped (paper: prompt length 2560)
    c.eval_chains = 64  # chains held out for evaluation, round-robin over hop counts
    c.hops = (1, 2, 3)  # hop counts of the pool (synthetic pools are built with these; a file pool is read as is)
    c.hop_ratio = ()  # training chains per hop count, aligned with hops, e.g. (4, 3, 2); () = the pool's own mix
    return c


def self_evolution_section() -> ml_collections.ConfigDict:
    """The loop around the stages (searchjax.experiment.self_evolution)."""
    c = ml_collections.ConfigDict()
    c.iterations = 3  # paper: three proposer -> generation -> solver iterations
    c.anchor = "solver"  # IG anchor from iteration 2 on: "solver" (the previous solver) | "frozen" (config.anchor)
    c.proposer_training = True  # False: skip the proposer stage (the "w/o proposer training" ablation)
    return c


def generation_section() -> ml_collections.ConfigDict:
    """How the updated proposer writes the solver's training pairs (self_evolution.generate_pairs)."""
    c = ml_collections.ConfigDict()
    c.temperature = 1.0  # sampling temperature of the proposals (ours; Dr.Zero's generation script samples at 1.0)
    c.chains_per_call = 256  # chains per proposer rollout call
    c.max_chains = 0  # chains tried at most (0 = each training chain once); pairs stop at the solver's budget
    return c


def solver_section(solver_rollout: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The solver stage: Search-R1-style GRPO on the generated pairs (self_evolution.solver_config)."""
    c = ml_collections.ConfigDict()
    c.total_steps = 50  # paper: 50 solver updates per iteration
    c.prompts_per_step = 256  # paper: batch 256 questions (x group_size rollouts)
    c.reward_fn = "exact_match"  # outcome EM against the proposer's answer
    c.advantage_estimator = "grpo"  # group z-scores per question
    c.rollout = ml_collections.ConfigDict(solver_rollout.to_dict())  # RolloutConfig: multi-turn search
    c.rollout.group_size = 5  # paper: group size 5
    c.rollout.search = True
    c.optim = ml_collections.ConfigDict()  # trainer.OptimConfig, field for field (appendix A.1)
    c.optim.kind = "adamw"
    c.optim.learning_rate = 1e-6  # paper
    c.optim.warmup_steps = 3  # warmup ratio 0.03 of 50 steps x 2 updates (mini-batch 128 of 256), then constant
    c.optim.b1 = 0.9
    c.optim.b2 = 0.999
    c.optim.eps = 1e-8
    c.optim.weight_decay = 0.01  # paper
    c.optim.max_grad_norm = 0.1  # paper
    c.batch = ml_collections.ConfigDict()
    c.batch.mini_batch_size = 640  # PPO mini-batch 128 questions x 5 rollouts (trajectories): 2 updates a step
    c.batch.micro_batch_size = 16  # trajectories per accumulation chunk (memory knob)
    c.batch.epochs = 1
    c.batch.prompt_buckets = (256, 512)  # a generated question in Search-R1's template (paper: prompts <= 512)
    c.batch.response_buckets = (512, 1024, 2048, 4096)  # up to 4 x (500 generated + 500 retrieved)
    c.eval = ml_collections.ConfigDict()
    c.eval.every = 25  # dev EM every this many solver steps (needs eval_data)
    c.eval.num_prompts = 512  # greedy rollouts on the first N dev questions
    c.eval.seed = 0
    c.eval_data = ""  # dev set for EM (setup.load_prompts: "default", a .parquet / .jsonl); "" = none
    return c


def frozen_model_section() -> ml_collections.ConfigDict:
    """A frozen model (selfplay.frozen_model): "" = a copy of the initial policy (the base model)."""
    c = ml_collections.ConfigDict()
    c.path = ""  # "" = base model; else HF dir / .gguf / "smollm2", e.g. a solver's <workdir>/hf/step_XXXXXX
    c.tokenizer = ""  # tokenizer location if not the model's own ("" = path)
    c.dtype = "bfloat16"  # compute dtype of a model loaded from path
    return c


def information_gain_section() -> ml_collections.ConfigDict:
    """searchjax.rewards.information_gain.IGConfig, field for field."""
    c = ml_collections.ConfigDict()
    c.tau = 3.0  # eq. 7: s_IG = tau * tanh(max(0, g) / tau)
    c.format_weight = 0.2  # eq. 12's lambda
    c.retrieval_topk = 3  # passages of the one-retrieval shortcut (and of eq. 4's full context)
    c.leave_out = ()  # Table 3 leave-one-out: any of "closed_book", "source", "retrieval", "hop"
    c.template = "{context}\n\nQuestion: {question}\nAnswer:"  # anchor prompt (searchjax.scoring's default)
    c.answer_prefix = " "  # text between the anchor prompt and the answer
    c.max_length = 2048  # anchor prompts longer than this lose tokens from the left
    c.max_tokens_per_call = 16384  # padded tokens per jitted anchor call (memory knob)
    return c


def difficulty_section(solver_rollout: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Dr.Zero's difficulty reward (reward_fn=drzero_difficulty): the solver and its rollout settings."""
    c = ml_collections.ConfigDict()
    c.solver = frozen_model_section()  # Dr.Zero: the solver starts from the same base model
    c.rollout = ml_collections.ConfigDict(solver_rollout.to_dict())  # RolloutConfig of the solver's search rollouts
    c.rollout.group_size = 5  # n: solver rollouts per proposed question
    c.rollout.search = True
    return c


def get_config(arg: str = ""):
    arg, *ablations = [part.strip() for part in arg.split(",")]
    unknown = [a for a in ablations if a not in ABLATIONS]
    if unknown:
        raise ValueError(f"configs/drfree.py: unknown ablation(s) {unknown}; valid: {sorted(ABLATIONS)}")
    config = _base_config(arg)
    for name in ablations:
        ABLATIONS[name](config)
    return config


def _base_config(arg: str):
    quick = arg in QUICK_VARIANTS
    if quick:  # configs/quickstart.py (SmolLM2 on CPU), or its one-step smoke variant
        config = _sibling_config("quickstart", "smoke" if arg == "quickstart_smoke" else "")
    else:
        try:
            config = _sibling_config("search_r1", arg or DEFAULT_MODEL)
        except ValueError:
            raise ValueError(f"configs/drfree.py: unknown variant {arg!r}; valid: {QUICK_VARIANTS} or a model preset "
                             "of configs/search_r1.py") from None
    solver_rollout = ml_collections.ConfigDict(config.rollout.to_dict())  # the solver's (Search-R1) rollout settings
    del config.data  # prompts come from the chain pool (config.chains)

    # The paper's proposer settings.
    config.total_steps = 50  # proposer RL steps
    config.prompts_per_step = 256  # chains per step, one proposal each
    config.rollout_fn = "drfree_proposer"  # selfplay.proposer_rollout: single turn, no tool
    config.rollout.group_size = 1  # one generation per prompt: HRPO's baseline is the hop group
    config.rollout.max_turns = 0  # no searching turns
    config.rollout.search = False  # no tool use
    config.rollout.max_new_tokens_per_turn = 512  # proposer reply budget (ours; think + question + answer)
    config.rollout.max_cache_len = 4096 + 512  # a 2560-token prompt pads to 4096 slots, + the reply
    config.reward_fn = "drfree_information_gain"  # eq. 12 with the anchor's IG; or drzero_difficulty
    config.eval_reward_fn = "drfree_information_gain"  # greedy proposals on held-out chains, same reward
    config.advantage.estimator = "hrpo"  # eq. 9: z-scores per hop count across the batch
    config.optim.learning_rate = 1e-6
    config.optim.warmup_steps = 3  # warmup ratio 0.03 of the 50 x 2 = 100 optimizer updates, then constant
    config.optim.weight_decay = 0.01
    config.optim.max_grad_norm = 0.1
    config.batch.mini_batch_size = 128  # paper: PPO mini-batch 128 of the 256 proposals: two updates per step
    # config.loss (both agents) stays Search-R1's (k3 KL 0.001 to the initial policy): appendix A.1's KL setting
    # was not available to us (Dr.Zero's public scripts train without a KL loss: --config.loss.kl_coef=0).
    config.batch.micro_batch_size = 16  # trajectories per accumulation chunk (memory knob)
    config.batch.prompt_buckets = (512, 1024, 2048, 2560)  # prompt length <= 2560
    config.batch.response_buckets = (128, 256, 512)
    config.eval.every = 10  # evaluate the greedy proposer on held-out chains every this many steps
    config.eval.num_prompts = 64  # = chains.eval_chains

    config.chains = chains_section("~/chains/chains.jsonl")
    config.proposer = ml_collections.ConfigDict()
    config.proposer.kind = "kg"  # "kg": a chain per prompt, no search | "search": the w/o KG ablation (no_kg)
    config.anchor = frozen_model_section()  # the IG anchor: the base model at first, later a solver checkpoint
    config.information_gain = information_gain_section()
    config.difficulty = difficulty_section(solver_rollout)
    config.run = "self_evolution"  # RUNS: the paper's loop, or "proposer" (HRPO of the proposer alone)
    config.self_evolution = self_evolution_section()
    config.generation = generation_section()
    config.solver = solver_section(solver_rollout)
    if not quick:
        return config

    # CPU quickstart: the synthetic world's chains, the SmolLM2 policy as proposer and anchor.
    config.chains.pool = "synthetic"
    config.chains.eval_chains = 3
    config.anchor.dtype = "float32"
    config.difficulty.solver.dtype = "float32"
    config.total_steps = 4
    config.prompts_per_step = 6  # two chains per hop count on average
    config.rollout.max_new_tokens_per_turn = 128
    config.rollout.max_cache_len = 2048 + 128  # synthetic chain prompts (805-1207 tokens) pad to <= 2048 slots
    config.optim.warmup_steps = 0
    config.batch.mini_batch_size = 6
    config.batch.micro_batch_size = 2
    config.batch.prompt_buckets = (1024, 2048)
    config.batch.response_buckets = (128,)
    config.eval.every = 4
    config.eval.num_prompts = 3
    config.information_gain.max_tokens_per_call = 8192  # smaller jitted calls on CPU
    # one toy iteration; the solver with configs/quickstart.py's rollout (2 searching turns of 48 tokens)
    config.self_evolution.iterations = 1
    config.generation.chains_per_call = 6
    config.solver.total_steps = 2
    config.solver.prompts_per_step = 2
    config.solver.rollout.group_size = 4
    config.solver.optim.warmup_steps = 0
    config.solver.batch.mini_batch_size = 8
    config.solver.batch.micro_batch_size = 2
    config.solver.batch.prompt_buckets = (192, 384)
    config.solver.batch.response_buckets = (128, 256, 384)
    config.solver.eval.every = 0
    config.solver.eval.num_prompts = 8
    if arg == "quickstart_smoke":
        config.total_steps = 1
        config.prompts_per_step = 3
        config.rollout.max_new_tokens_per_turn = 32
        config.rollout.max_cache_len = 2048 + 32
        config.batch.mini_batch_size = 3
        config.batch.micro_batch_size = 1
        config.batch.response_buckets = (32,)
        config.eval.every = 1
        config.generation.chains_per_call = 3
        config.solver.total_steps = 1
        config.solver.prompts_per_step = 1
        config.solver.rollout.group_size = 2
        config.solver.batch.mini_batch_size = 2
        config.solver.batch.micro_batch_size = 1
    return config

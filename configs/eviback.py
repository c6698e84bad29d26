r"""EviBack: Search-R1 GRPO with an evidence-constrained Teacher backoff for all-zero groups.

What it does: the Search-R1 recipe (EM reward, GRPO, observation tokens masked, k3 KL 0.001, clip 0.2,
temperature 1, top-3 passages, up to 4 searches) with 8 rollouts per question. Whenever all 8 rollouts of
a question score EM = 0, a Teacher judges each trajectory's own retrieved evidence (Stage A, gold-blind:
Supported / Insufficient / Ambiguous) and, unless Insufficient, its answer against the reference (Stage
B); the resulting fallback rewards are z-scored within the group and their advantages scaled by
lambda = 0.1 (searchjax/rewards/eviback.py has the formulas). Mixed groups train exactly as plain GRPO.
The Teacher runs only in training; evaluation is Actor-only (EM).

Variants (`--config configs/eviback.py:<variant>`):
  qwen3-0.6b | qwen3-1.7b | qwen3-4b (default "" = qwen3-4b): the paper's settings. The policy is the HF
    checkpoint directory in model.path; the Teacher is the paper's frozen training Teacher, GLM-4.7-Flash
    (the public release, github.com/chery-nextai/eviback, names it in ape/contract.md and serves it through
    an OpenAI-compatible chat-completions endpoint), self-hosted with vLLM on port 8001 next to the
    retriever on 8000:
      vllm serve zai-org/GLM-4.7-Flash --port 8001      # teacher.base_url=http://127.0.0.1:8001/v1
    Stage B refines the answer (stage_b_mode "refine", the release's reward weights 0.1 / 0.1). GLM-4.7-Flash
    is a reasoning model: its replies may start with a <think> block, which the parsers skip, and
    max_reply_tokens leaves room for it (a reply cut inside the block fails and its group gets zero
    advantage; serving with a reasoning parser that moves the block out of the content also works).
    Expected result (paper): Stage A insufficient-evidence F1 0.8924 and gold coverage 0.6825 for its
    frozen gate; EM gains over Search-R1 GRPO. Run time: days on a GPU/TPU pod.
  quickstart: the embedded default on CPU: SmolLM2-135M-Instruct policy (configs/quickstart.py) with the
    same SmolLM2 weights, frozen, as a local Teacher answering by option log-likelihood. A few minutes
    on 2 CPU cores; a 135M Teacher is a weak gate (run the harness below to see how weak).
  quickstart_smoke: one tiny step of the above (a pipeline check).

  python -m launch.train --config configs/eviback.py:quickstart --workdir /tmp/eviback_quickstart
  python -m launch.train --config configs/eviback.py:qwen3-4b --workdir /ckpt/eviback_qwen3_4b \
      --config.teacher.base_url=http://teacher:8000/v1 --config.teacher.model=Qwen/Qwen3-32B
  python -m searchjax.eval.stage_a_harness --config configs/eviback.py:quickstart --limit 20   # gate quality
"""


import ml_collections
from searchjax.config_files import sibling

PAPER_PRESETS = {  # variant -> HF checkpoint directory of the policy (download it first; nothing is fetched)
    "qwen3-0.6b": "~/models/Qwen3-0.6B",
    "qwen3-1.7b": "~/models/Qwen3-1.7B",
    "qwen3-4b": "~/models/Qwen3-4B",
}
VARIANTS = ("", *PAPER_PRESETS, "quickstart", "quickstart_smoke")


def _sibling_config(name: str, arg: str):
    """get_config(arg) of configs/<name>.py (searchjax.config_files.sibling: loaded by path)."""
    return sibling(__file__, name).get_config(arg)


def eviback_section() -> ml_collections.ConfigDict:
    """searchjax.rewards.eviback.EvibackConfig, field for field."""
    c = ml_collections.ConfigDict()
    c.lam = 0.1  # lambda: fallback advantages = lambda * within-group z-scores (paper: 0.1)
    c.stage_a_prompt = "eviback_stage_a.v1"  # gold-blind gate prompt: a versioned file in judges/prompts/ or a path
    c.stage_b_prompt = "eviback_stage_b.v1"  # gold-aware Stage B prompt (refine: eviback_stage_b_refine.v1)
    c.stage_b_mode = "grade"  # "refine" (the paper's: Teacher writes the evidence-supported, reference-aligned
    # answer; reward on its F1) | "grade" (Teacher judges the Actor's answer)
    c.bundle = ""  # a frozen Teacher bundle directory (launch/ape.py writes them; hashes verified, a mismatch is
    # refused): its prompts, parsers, Stage B mode and gate replace the fields above and below; "" = unused
    c.max_evidence_passages = 10  # unique retrieved passages per trajectory shown to Stage A
    c.max_passage_chars = 1200  # each passage cut to this many characters
    c.max_reply_tokens = 32  # Teacher completion limit (one short JSON object; a reasoning Teacher's think
    # block needs thousands: the paper presets set 4096)
    c.open_stage_b = ("Supported", "Ambiguous")  # Stage A verdicts that open Stage B (never Insufficient)
    c.weight_supported = 1.0  # s(Supported) in r = s(v) (1 + F1_ref) / 2
    c.weight_ambiguous = 0.5  # s(Ambiguous); s(Insufficient) = 0 by design
    c.credit_correct = 1.0  # c(Correct) in F1_ref = max(F1, c(j))
    c.credit_partial = 0.5  # c(Partial); c(Incorrect) = 0
    c.status_credit = 0.1  # refine: beta in r = s(v) (beta a + gamma [answered] F1(refined, golds)) (release: 0.1)
    c.answer_credit = 0.1  # refine: gamma (release: 0.1)
    c.no_answer_factor = 0.5  # refine: a, beta's factor for a trajectory that never answered (ours; 1 = release)
    c.correction_rounds = 1  # re-asks of an unparseable reply, with a correction message
    c.epsilon = 1e-6  # GRPO std epsilon of the within-group normalisation
    c.audit_path = "eviback_audit.jsonl"  # one JSON line per Teacher request; relative to --workdir; "" = off
    return c


def teacher_section(backend: str) -> ml_collections.ConfigDict:
    """searchjax.judges.build_judge's fields (both backends' fields are always present)."""
    c = ml_collections.ConfigDict()
    c.backend = backend  # "openai_compat" (any OpenAI-compatible endpoint) | "local" (a JAX checkpoint)
    # openai_compat
    c.base_url = "http://127.0.0.1:8000/v1"  # endpoint base URL (vLLM/SGLang /v1, Gemini .../v1beta/openai/, ...)
    c.model = "teacher"  # served model name
    c.api_key_env = "OPENAI_API_KEY"  # NAME of the environment variable with the key ("" = no key); never the key
    c.api_key_header = ""  # send the key in this header instead of Authorization (Azure OpenAI: "api-key")
    c.default_query = {}  # query parameters on every request (Azure: {"api-version": "..."})
    c.timeout_s = 60.0  # per HTTP attempt
    c.temperature = 0.0  # Teacher sampling temperature
    c.max_tokens_param = "max_tokens"  # or "max_completion_tokens" (newer OpenAI models)
    c.json_mode = False  # response_format={"type": "json_object"} (OpenAI, vLLM)
    c.guided_choice = False  # vLLM/SGLang guided decoding: replies constrained to the allowed JSON verdicts
    c.seed = -1  # sampling seed sent to the server (-1 = none)
    c.max_concurrency = 16  # Teacher requests in flight at once
    c.max_attempts = 3  # tries per request (timeouts, connection errors, HTTP 408/429/5xx are retried)
    c.backoff_initial_s = 1.0  # exponential backoff: min(max, initial * 2^k) seconds before retry k
    c.backoff_max_s = 16.0
    c.price_per_million_input = 0.0  # USD per million prompt tokens (cost accounting)
    c.price_per_million_output = 0.0  # USD per million completion tokens
    # local
    c.local_checkpoint = "policy"  # "policy" (a frozen copy of the initial policy), "smollm2", an HF dir or .gguf
    c.local_dtype = "float32"  # compute dtype of the local judge
    c.choice_score = "sum"  # closed choice: "sum" (log-prob of the whole reply) | "mean" (per token)
    c.max_prompt_tokens = 1024  # longer Teacher chats fail (that group gets zero advantage)
    c.batch_rows = 8  # rows per scoring / generation call
    c.calibrate = False  # closed choice: scores relative to the same chat without evidence (Zhao et al. 2021)
    return c


def harness_section() -> ml_collections.ConfigDict:
    """searchjax.eval.stage_a_harness.build_labelled_set's settings."""
    c = ml_collections.ConfigDict()
    c.topk = 3  # passages per labelled trace
    c.passage_chars = 600  # characters per passage (the gold passage is a window around the answer)
    return c


def get_config(arg: str = ""):
    if arg not in VARIANTS:
        raise ValueError(f"configs/eviback.py: unknown variant {arg!r}; valid: {VARIANTS}")
    quick = arg.startswith("quickstart")
    if quick:  # configs/quickstart.py (SmolLM2 on the embedded default), or its one-step smoke variant
        config = _sibling_config("quickstart", "smoke" if arg == "quickstart_smoke" else "")
    else:  # configs/search_r1.py: the Search-R1 GRPO recipe every EviBack setting starts from
        config = _sibling_config("search_r1", "qwen3-4b")
    config.reward_fn = "eviback"  # loop reward: EM for the Actor, the Teacher backoff for all-zero groups
    config.eval_reward_fn = "exact_match"  # evaluation is Actor-only: the Teacher is never called there
    config.eviback = eviback_section()
    config.teacher = teacher_section("local" if quick else "openai_compat")
    config.harness = harness_section()
    if quick:
        config.eviback.max_evidence_passages = 3  # keeps the local Teacher's chats under 512 tokens (one
        config.eviback.max_passage_chars = 300  # scoring bucket, half the CPU time of 1024)
        config.harness.passage_chars = 300
        config.teacher.max_concurrency = 1  # one device: the local judge batches instead
        # Recompute activations in the update: the policy, its optimizer state and a frozen Teacher copy
        # then fit a small CPU box's memory together.
        config.model.remat_policy = "full"
        return config

    # The paper's settings on top of Search-R1's: 8 rollouts per question, the Qwen3 policy presets.
    config.model.path = PAPER_PRESETS[arg or "qwen3-4b"]  # HF checkpoint directory of the policy
    config.rollout.group_size = 8  # G: rollouts per question (EviBack; Search-R1 used 5)
    config.batch.mini_batch_size = 256 * 8  # trajectories per optimizer step: 256 questions x 8 rollouts
    config.teacher.max_concurrency = 64  # Teacher requests in flight (a step has up to 512 x 8 Stage A requests)
    config.teacher.model = "zai-org/GLM-4.7-Flash"  # the paper's frozen training Teacher (served name)
    config.teacher.base_url = "http://127.0.0.1:8001/v1"  # where it is served (vLLM, see the docstring)
    config.teacher.api_key_env = ""  # a self-hosted vLLM needs no key; a hosted API: the variable's name
    config.teacher.timeout_s = 180.0  # per attempt (the release's Teacher timeout; thinking replies are long)
    config.eviback.max_reply_tokens = 4096  # room for a reasoning Teacher's <think> block before the JSON
    config.eviback.stage_b_mode = "refine"  # the paper's Stage B
    config.eviback.stage_b_prompt = "eviback_stage_b_refine.v1"
    return config

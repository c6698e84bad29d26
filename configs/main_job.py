r"""The main job (launch/main_job.py): SmolLM2-135M-Instruct learns the Search-R1 protocol on the embedded default.

What it does, on CPU (every stage is described in searchjax/experiment/main_job.py):

1. demonstrations: Search-R1 traces (think, <search> the question, the real <information> block of the BM25
   index over the 10,033 default passages, <answer>) for DEMO_QUESTIONS questions drawn at random from the
   default QA train split, kept where the gold answer was retrieved (searchjax.data.demonstrations); cached;
2. warm start: SFT_STEPS steps of supervised fine-tuning on them (SFT_BATCH demonstrations per step, AdamW
   lr SFT_LR), loss on the policy's own tokens only;
3. GRPO: GRPO_STEPS steps of the quickstart's Search-R1 GRPO (PROMPTS_PER_STEP default QA train questions x
   GROUP_SIZE rollouts, exact-match reward, k3 KL 0.001 to the warm start), from the warm start;
4. evaluation, greedy, with the training rollout's limits (up to 2 searches of 2 passages cut to 96 tokens,
   48-token turns): the untrained model on UNTRAINED_LIMIT questions of each set, the warm-started and the
   GRPO-trained policies on all of them; sets: the default QA test split (100 questions) and the 75 FanOutQA
   questions of the embedded default;
5. one table (systems x sets: n, EM, F1, valid-answer rate, mean searches, EM difference against the warm
   start with its paired bootstrap 95% interval), printed and written to <workdir>/table.md, and
   <workdir>/report/ (report.md, PNG plots, GRPO training curves).

  python -m launch.main_job --config configs/main_job.py --workdir workdir/main_job
  python -m launch.main_job --config configs/main_job.py --workdir workdir/main_job --resume   # after a stop

Expected result and cost: see MEASURED below (figures of the run that set these sizes).

Any field can be overridden on the command line, e.g. --config.sft.steps=100 --config.total_steps=10.
"""

from searchjax.config_files import sibling

# Sizes of the job (see the module docstring and MEASURED).
DEMO_QUESTIONS = 1024  # train questions demonstrations are built for (drawn at random; ~87% are kept)
SFT_STEPS, SFT_BATCH, SFT_LR = 10, 8, 1e-4
GRPO_STEPS, PROMPTS_PER_STEP, GROUP_SIZE = 2, 2, 4
UNTRAINED_LIMIT = 16  # per evaluation set: 32 questions in all

MEASURED = """2026-12-01, 2 CPU cores (Intel Xeon with AMX: model.dtype "auto" = bfloat16 compute, f32 parameters),
nothing else running; 14 min 42 s wall in all, peak RSS 5.3 GiB (launch.main_job under /usr/bin/time -v):

  stage             wall    CPU     peak RSS
  demonstrations       6 s     6 s  0.45 GiB   (cached: 904 of 1,024 kept; a fresh machine builds them first)
  warm start         188 s   352 s  4.28 GiB   (10 SFT steps of 8; loss 2.41 -> 0.111)
  GRPO (2 steps)     122 s   210 s  5.31 GiB
  eval untrained      85 s   137 s  5.31 GiB   (16 + 16 questions)
  eval warm start    245 s   417 s  5.31 GiB   (100 + 75 questions, 16 per rollout call)
  eval GRPO          228 s   393 s  5.31 GiB
  table                2 s     2 s

  | set             | system     |   n |    EM |    F1 | valid answer | mean searches | EM - warm start [95% CI]       |
  | default_qa_test | untrained  |  16 | 0.000 | 0.000 |        0.000 |         0.000 | -0.438 [-0.688, -0.188] (n=16) |
  | default_qa_test | warm_start | 100 | 0.560 | 0.611 |        0.990 |         1.000 | -                              |
  | default_qa_test | grpo       | 100 | 0.540 | 0.606 |        1.000 |         1.000 | -0.020 [-0.050, +0.000]        |
  | fanoutqa        | untrained  |  16 | 0.000 | 0.000 |        0.000 |         0.000 | -0.500 [-0.750, -0.250] (n=16) |
  | fanoutqa        | warm_start |  75 | 0.440 | 0.458 |        1.000 |         1.000 | -                              |
  | fanoutqa        | grpo       |  75 | 0.440 | 0.458 |        1.000 |         1.000 | +0.000 [+0.000, +0.000]        |

The warm start meets the targets (valid answers >= 0.8, >= 0.8 searches per question, EM far above the untrained
model's 0). Two GRPO steps at the quickstart's learning rate (1e-6) change one greedy answer in a hundred: they
show the stage runs, not a gain (docs/learning_run.md is the learning run).

What 15 minutes cost. The same job with 16 SFT steps and 32 questions per rollout call took 17 min 54 s here
(loss 0.007, EM 0.720 / 0.373 after the warm start): 6 more SFT steps buy 16 points of test EM and cost 100 s.
In float32 (--config.model.dtype=float32; what a CPU without a bf16 matrix unit runs) that configuration took
21 min 13 s (warm start 412 s, evaluations 90 + 315 + 328 s). The smallest warm start that met the targets in
15 minutes is the 10 steps above.

Again on 2026-12-07, 2 CPU cores of an AMD EPYC with AVX-512 BF16 (bf16 compute by "auto"), nothing else running:
8 min 28 s wall in all, peak RSS 6.3 GiB; demonstrations 13 s (cached), warm start 168 s (loss 2.40 -> 0.111),
GRPO 102 s, evaluations 42 + 78 + 99 s. Default QA test EM: warm start 0.590 (F1 0.629, valid 0.990), GRPO 0.570
(0.608, 0.990); FanOutQA as above (0.440 / 0.440); every searches column 1.000, the untrained rows 0.
Later that day, same host type: 6 min 12 s, peak RSS 8.6 GiB (warm start 134 s, GRPO 64 s, evaluations 20 + 69 + 75
s), the same EMs; with SEARCHJAX_HUGE_PAGES=0 (malloc gives freed memory back) right before it: 6 min 42 s, 4.6 GiB."""


def main_section(arms=("grpo",)):
    """config.main: what the main job (searchjax/experiment/main_job.py) adds to a training config."""
    import ml_collections
    main = ml_collections.ConfigDict()
    main.demo_questions = DEMO_QUESTIONS  # train questions to build demonstrations for (0 = all 5,270)
    main.demo_seed = 0  # which train questions (a seeded draw: the split is stored in article order)
    main.warm_start = ""  # an existing warm start (HF dir, a main job's <workdir>/warm_start) instead of stage 2
    # GRPO runs from the warm start: "grpo", "control" (shuffled retrieval), or a gold-free reward's name
    # (main_job.REWARD_ARMS: ccs, rlif, ttrl, constitutional_judge; configs/experiments/gold_free_default.py)
    main.arms = tuple(arms)
    main.arm_fields = ml_collections.ConfigDict()  # per-arm overrides: arm_fields.<arm>.<section>.<field> = value
    main.baseline = "warm_start"  # the table's paired EM differences are against this system (or an arm)
    main.dev_questions = 0  # > 0: the arms' dev evaluations use this many random dev questions (0 = data.eval as is)
    main.control_seed = 0  # seed of the control's question substitution (searchjax/experiment/shuffled_retrieval.py)
    main.eval_sets = ("default_qa:test", "default")  # default QA test split (100) and the 75 FanOutQA questions
    main.eval_limit = 0  # questions per set for the trained systems (0 = all)
    main.untrained_limit = UNTRAINED_LIMIT  # questions per set for the untrained model (0 = all)
    main.eval_batch_size = 16  # questions per rollout call (the untrained evaluation's size: one set of programs)
    main.bootstrap_resamples = 10_000  # paired bootstrap of the EM differences (searchjax.eval.stats)
    main.curve_metrics = ("reward/mean", "eval/reward", "rollout/search/mean", "rollout/response_length",
                          "update/kl/mean", "rollout/entropy_mc")  # training curves in report/training_curves.png
    return main


def get_config(arg: str = ""):
    """arg: "" (the README's main job)."""
    if arg not in ("",):
        raise ValueError(f"configs/main_job.py: unknown variant {arg!r}; valid: ''")
    config = sibling(__file__, "quickstart").get_config()
    # The host's fast compute dtype (searchjax.runtime.host_compute_dtype): bfloat16 where the CPU has a bf16
    # matrix unit (AMX / AVX-512 BF16; about 2x faster prefill, scoring and updates there), float32 elsewhere.
    # Parameters stay float32 (the optimizer updates f32 weights; each forward casts them). --config.model.dtype=
    # float32 reproduces a run bit for bit across hosts.
    config.model.dtype = "auto"
    config.total_steps = GRPO_STEPS
    config.prompts_per_step = PROMPTS_PER_STEP
    config.rollout.group_size = GROUP_SIZE
    config.data.train = "default_qa:train"  # searchjax.data.default_qa: 5,270 template questions over the leads
    config.data.eval = "default_qa:dev"  # in-training evaluation (config.eval.every; off here)
    config.batch.mini_batch_size = PROMPTS_PER_STEP * GROUP_SIZE
    # Tight buckets: prompts are 150-172 tokens, one-search demonstrations 114-~170 response tokens; the
    # largest response bucket holds the longest response the rollout allows (3 x 48 + 2 x 96 = 336).
    config.batch.prompt_buckets = (176, 192)
    config.batch.response_buckets = (176, 256, 336)
    config.sft.steps = SFT_STEPS
    config.sft.batch_size = SFT_BATCH
    config.sft.micro_batch_size = SFT_BATCH
    config.sft.learning_rate = SFT_LR
    config.checkpoint.every = 0  # only the last step (and on SIGTERM)
    config.checkpoint.max_to_keep = 1
    config.checkpoint.export_hf = False  # the evaluation reads the orbax checkpoint; no 540 MB export per arm
    config.logging.trajectories_per_step = 8
    config.main = main_section()
    return config

r"""The CCS comparison on the embedded default at CPU scale: Search-R1 EM against four gold-free rewards.

The paper's comparison (An et al. 2026, its Table 1 and Figures 5-6) trains one policy per reward with the
same trainer and search interface and compares EM. Here, on 2 CPU cores, with SmolLM2-135M-Instruct:

* one warm start (the README main job's: configs/main_job.py, SFT on Search-R1 demonstrations), because an
  untrained 135M policy never searches and every gold-free reward would then be 0 or noise;
* five arms from it, identical except for the reward (searchjax/experiment/main_job.py, REWARD_ARMS):
  grpo (Search-R1: exact match against the gold answer), ccs (question reconstruction, cosine of MiniLM
  embeddings), rlif (self-certainty of the final response), ttrl (agreement with the group's majority
  answer) and constitutional_judge (a 1-5 rubric over three dimensions, mapped to [0, 1]);
  the reconstructor and the rubric judge are a frozen copy of the initial SmolLM2 weights (local backend);
* TTRL trains, as the paper trains it, on the evaluation set's own questions with their labels unused (the
  default QA test split; on FanOutQA, which it never saw, it is a transfer figure); the others train on the
  default QA train split;
* the test table (default QA test, FanOutQA) with EM differences against the grpo arm (paired bootstrap 95 %),
  and training curves per arm: reward (Figure 5) and searches per question (Figure 6).

This is a 135M-scale run. A 135M reconstructor and judge write off-target questions and rarely a parseable
rubric reply (those groups get zero advantages, counted in cj/failed_groups), and TOTAL_STEPS steps of
PROMPTS_PER_STEP x GROUP_SIZE rollouts are far too few for a gain: the table shows what each reward does to
a warm-started policy in a few steps, not the paper's result. docs/methods/ccs.md has what ran.

  python -m launch.main_job --config configs/experiments/gold_free_default.py --workdir ~/runs/gold_free
  python -m launch.main_job --config configs/experiments/gold_free_default.py --workdir ~/runs/gold_free --resume
  # one arm per piece (each is resume-safe; SIGTERM ends a step, saves and stops):
  python -m launch.main_job --config configs/experiments/gold_free_default.py --workdir ~/runs/gold_free \
      --resume --config.main.arms=grpo,ccs
"""

import pathlib

from searchjax.config_files import sibling

TOTAL_STEPS = 6
PROMPTS_PER_STEP, GROUP_SIZE = 2, 4
LEARNING_RATE = 1e-5  # configs/experiments/learning_default.py's: 1e-6 moves a 135M policy too little in 6 steps
EVAL_LIMIT = 50  # questions per evaluation set for each trained system (6 systems; the untrained model gets 16)
ARMS = ("grpo", "ccs", "rlif", "ttrl", "constitutional_judge")
# What each gold-free reward reads, copied from configs/ccs.py:quickstart (SmolLM2 as local reconstructor and
# judge, spaCy NER, MiniLM embeddings).
REWARD_SECTIONS = ("ccs", "rlif", "cj", "reconstructor", "cj_judge", "ner", "embedder")


def get_config(arg: str = ""):
    """arg: "" (all five arms)."""
    if arg not in ("",):
        raise ValueError(f"configs/experiments/gold_free_default.py: unknown variant {arg!r}; valid: ''")
    configs = pathlib.Path(__file__).resolve().parent
    config = sibling(str(configs), "main_job").get_config()
    ccs = sibling(str(configs), "ccs").get_config("quickstart")
    for section in REWARD_SECTIONS:
        config[section] = ccs[section]
    config.eval_reward_fn = "exact_match"  # in-training dev evaluation reports EM for every arm
    config.total_steps = TOTAL_STEPS
    config.prompts_per_step = PROMPTS_PER_STEP
    config.rollout.group_size = GROUP_SIZE
    config.batch.mini_batch_size = PROMPTS_PER_STEP * GROUP_SIZE
    config.batch.micro_batch_size = 4
    config.optim.learning_rate = LEARNING_RATE
    config.checkpoint.every = 2  # a stopped piece loses at most one step
    config.checkpoint.max_to_keep = 1
    config.main.arms = ARMS
    # TTRL's pseudo-labels need no gold: the paper trains it on each evaluation set's unlabelled questions.
    config.main.arm_fields.ttrl = {"data": {"train": "default_qa:test"}}
    config.main.baseline = "grpo"  # the paper compares each gold-free reward with gold-supervised Search-R1
    config.main.eval_limit = EVAL_LIMIT
    config.main.curve_metrics = ("reward/mean", "rollout/search/mean", "rollout/response_length",
                                 "update/kl/mean")
    return config

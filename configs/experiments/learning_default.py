r"""The documented learning run on the embedded default: warm start, then GRPO, against a shuffled-retrieval control.

Two arms from one warm start (the main job's stages, searchjax/experiment/main_job.py; the warm start is configs/main_job.py's):

* grpo: Search-R1 GRPO (exact-match reward, k3 KL 0.001 to the warm start), PROMPTS_PER_STEP default QA train
  questions x GROUP_SIZE rollouts per step, AdamW lr LEARNING_RATE, evaluated greedily on EVAL_PROMPTS random
  dev questions every EVAL_EVERY steps (eval/reward = dev EM);
* control: identical, except that every search returns the passages of another, randomly drawn training
  question (searchjax/experiment/shuffled_retrieval.py). Its dev evaluations during training see that
  retrieval too; the final test table evaluates every system with the real retriever.

Then the untrained model, the warm start and both arms on the default QA test split and the 75 FanOutQA
questions: <workdir>/table.md (EM differences against the warm start with paired bootstrap 95% intervals) and
<workdir>/report/ (training_curves.png: reward, dev EM, searches per question, response length, KL, entropy).

Budget: TOTAL_STEPS steps per arm were sized for at most 45 minutes of CPU on 2 cores each (docs/learning_run.md
has the measured cost per step and what completed). The run can be done in pieces: SIGTERM (e.g. `timeout -s
TERM 30m ...`) ends the current step, saves a checkpoint and stops; --resume continues exactly where it stopped,
--config.main.arms=grpo (or control) trains one arm per piece, and raising --config.total_steps on a resume
extends a finished arm.

  python -m launch.main_job --config configs/experiments/learning_default.py --workdir ~/runs/learning_default
  python -m launch.main_job --config configs/experiments/learning_default.py --workdir ~/runs/learning_default --resume
  # start both arms from the main job's warm start instead of training another:
  python -m launch.main_job --config configs/experiments/learning_default.py --workdir ~/runs/learning_default \
      --config.main.warm_start=workdir/main_job/warm_start
"""

import pathlib

from searchjax.config_files import sibling

TOTAL_STEPS = 20
PROMPTS_PER_STEP, GROUP_SIZE = 2, 4
LEARNING_RATE = 1e-5
EVAL_EVERY, EVAL_PROMPTS = 5, 32


def get_config(arg: str = ""):
    """arg: "" (both arms)."""
    if arg not in ("",):
        raise ValueError(f"configs/experiments/learning_default.py: unknown variant {arg!r}; valid: ''")
    # sibling() resolves a name next to the given path: configs/experiments -> configs/main_job.py
    config = sibling(str(pathlib.Path(__file__).resolve().parent), "main_job").get_config()
    # The warm start docs/learning_run.md measured: 16 SFT steps in float32 (the main job now runs 10 in the
    # host's dtype to fit 15 minutes); pinned so that the documented run reproduces on any host.
    config.sft.steps = 16
    config.model.dtype = "float32"
    config.total_steps = TOTAL_STEPS
    config.prompts_per_step = PROMPTS_PER_STEP
    config.rollout.group_size = GROUP_SIZE
    config.batch.mini_batch_size = PROMPTS_PER_STEP * GROUP_SIZE
    config.batch.micro_batch_size = 4  # peak memory: 4 trajectories' activations at a time
    config.optim.learning_rate = LEARNING_RATE
    config.eval.every = EVAL_EVERY
    config.eval.num_prompts = EVAL_PROMPTS
    config.main.dev_questions = EVAL_PROMPTS  # a random sample of dev (the split is stored in article order)
    config.checkpoint.every = EVAL_EVERY
    config.checkpoint.max_to_keep = 2
    config.main.arms = ("grpo", "control")
    return config

r"""The main job: demonstrations -> SFT warm start -> GRPO -> evaluation table, on the embedded default.

  python -m launch.main_job --config configs/main_job.py --workdir workdir/main_job
  python -m launch.main_job --config configs/experiments/learning_default.py --workdir ~/runs/learning [--resume]

The stages, their outputs in --workdir and what --resume skips: searchjax/experiment/main_job.py.
Bad input ends with one line naming the field or file; --verbose adds the traceback.
"""

from __future__ import annotations

from absl import flags, logging
from ml_collections import config_flags

from searchjax.experiment.validate import run_launcher, start_launcher  # stdlib-only at import

_CONFIG = config_flags.DEFINE_config_file("config", None, "Main-job config: configs/main_job.py[:variant].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for every stage's outputs.")
_RESUME = flags.DEFINE_bool("resume", False, "Skip finished stages and continue an unfinished GRPO arm.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Show the traceback of a bad-input error, not just its one line.")


def main(argv):
    def body():
        logging.info("config:\n%s", _CONFIG.value)
        from searchjax.experiment import main_job
        return main_job.run(_CONFIG.value, _WORKDIR.value, resume=_RESUME.value)
    run_launcher(argv, body, distributed_cfg=_CONFIG.value.distributed, verbose=_VERBOSE.value,
                 program="launch.main_job")


if __name__ == "__main__":
    start_launcher(main)

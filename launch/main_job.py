r"""The main job: demonstrations -> SFT warm start -> GRPO -> evaluation table, on the embedded default.

  python -m launch.main_job --config configs/main_job.py --workdir workdir/main_job
  python -m launch.main_job --config configs/experiments/learning_default.py --workdir ~/runs/learning [--resume]

The stages, their outputs in --workdir and what --resume skips: searchjax/experiment/main_job.py.
Bad input ends with one line naming the field or file; --verbose adds the traceback.
"""

from __future__ import annotations

import os

from absl import app, flags, logging
from ml_collections import config_flags

from searchjax.experiment.validate import exit_on_user_error  # stdlib-only at import

_CONFIG = config_flags.DEFINE_config_file("config", None, "Main-job config: configs/main_job.py[:variant].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for every stage's outputs.")
_RESUME = flags.DEFINE_bool("resume", False, "Skip finished stages and continue an unfinished GRPO arm.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Show the traceback of a bad-input error, not just its one line.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # hubs are never contacted at run time

    def body():
        from searchjax import distributed, runtime
        distributed.initialize(_CONFIG.value.distributed)  # before anything touches a JAX backend
        runtime.enable_compilation_cache()
        logging.info("config:\n%s", _CONFIG.value)
        from searchjax.experiment import main_job
        return main_job.run(_CONFIG.value, _WORKDIR.value, resume=_RESUME.value)
    exit_on_user_error(body, verbose=_VERBOSE.value, program="launch.main_job")


if __name__ == "__main__":
    from searchjax.runtime import use_transparent_huge_pages
    use_transparent_huge_pages()  # re-executes once with GLIBC_TUNABLES set (faster XLA:CPU buffers)
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(main)

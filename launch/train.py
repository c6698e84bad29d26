r"""Train a search agent with RL (GRPO / HRPO), configured by one ml-collections file.

  python -m launch.train --config configs/quickstart.py --workdir /tmp/searchjax_quickstart
  python -m launch.train --config configs/quickstart.py --workdir /tmp/searchjax_quickstart --resume
  python -m launch.train --config configs/search_r1.py:qwen2.5-7b --workdir ~/runs/sr1 --config.optim.learning_rate=2e-6

This file is intentionally short: flags -> `searchjax.rl.loop.train(config, workdir)`. Everything the
run does is in the config file (every field commented there) and in searchjax/rl/loop.py. The resolved
config is written to <workdir>/config.json. SIGTERM saves a checkpoint and exits with status 0;
`--resume` then continues exactly where the run stopped.
"""

import json
import os
import pathlib
from typing import Callable

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config: configs/<name>.py[:variant].", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and trajectories.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue from the latest checkpoint in --workdir.")


def run(argv, train: Callable[..., dict]) -> dict:
    """The body shared with launch/selfplay.py: start-up, config.json, then `train(config, workdir, resume=...)`.

    `train` imports what it needs itself: nothing may touch a JAX backend before `distributed.initialize`.
    """
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # hubs are never contacted at run time
    from searchjax import distributed, runtime
    distributed.initialize(config.distributed)  # before anything touches a JAX backend
    runtime.enable_compilation_cache()
    import jax
    workdir = pathlib.Path(_WORKDIR.value).expanduser()
    workdir.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
        (workdir / "config.json").write_text(json.dumps(config.to_dict(), indent=2, default=str))
    logging.info("devices: %s; config:\n%s", jax.devices(), config)
    metrics = train(config, workdir, resume=_RESUME.value)
    logging.info("last step's metrics: %s", json.dumps(metrics, sort_keys=True))
    return metrics


def _search_agent_train(config, workdir, *, resume: bool) -> dict:
    from searchjax.rl import loop
    return loop.train(config, workdir, resume=resume)


def main(argv):
    run(argv, _search_agent_train)


if __name__ == "__main__":
    from searchjax.runtime import use_transparent_huge_pages
    use_transparent_huge_pages()  # re-executes once with GLIBC_TUNABLES set (faster XLA:CPU buffers)
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(main)

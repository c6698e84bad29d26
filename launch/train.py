r"""Train a search agent with RL (GRPO / HRPO), configured by one ml-collections file.

  python -m launch.train --config configs/quickstart.py --workdir /tmp/searchjax_quickstart
  python -m launch.train --config configs/quickstart.py --workdir /tmp/searchjax_quickstart --resume
  python -m launch.train --config configs/search_r1.py:qwen2.5-7b --workdir ~/runs/sr1 --config.optim.learning_rate=2e-6

This file is intentionally short: flags -> `searchjax.experiment.loop.train(config, workdir)`. Everything the
run does is in the config file (every field commented there) and in searchjax/experiment/loop.py. Before
anything loads, searchjax/experiment/validate.py checks the config, the workdir, the data files and the
services (retrieval server, judges); only then is the resolved config written to <workdir>/config.json.
A workdir that holds a run is refused unless `--resume`; `--resume` needs a checkpoint there and an
unchanged config and data (`--allow_config_change=field,...` overrides, naming the fields).
SIGTERM saves a checkpoint and exits with status 0; `--resume` then continues exactly where the run stopped.
Bad input (config, file, data row, workdir, endpoint) ends with one line; `--verbose` adds the traceback.
"""

import json
import pathlib
from typing import Callable

from absl import flags, logging
from ml_collections import config_flags

from searchjax.experiment.validate import run_launcher, start_launcher  # stdlib-only at import (no JAX backend touched)

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config: configs/<name>.py[:variant].", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and trajectories.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue from the latest checkpoint in --workdir.")
_ALLOW_CHANGE = flags.DEFINE_list(
    "allow_config_change", [], "With --resume: config fields (dotted, e.g. batch.micro_batch_size, data.train) that "
    "may differ from the saved run although exact resume depends on them; 'all' allows any.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Show the traceback of a bad-input error, not just its one line.")


def run(argv, train: Callable[..., dict]) -> dict:
    """The body shared with launch/selfplay.py: start-up (validate.run_launcher), pre-flight checks, config.json,
    then `train(config, workdir, resume=...)`, which imports what it needs itself."""
    return run_launcher(argv, lambda: _start(_CONFIG.value, train), distributed_cfg=_CONFIG.value.distributed,
                        verbose=_VERBOSE.value, program=f"launch.{pathlib.Path(argv[0]).stem}")


def _start(config, train: Callable[..., dict]) -> dict:
    import jax
    from searchjax.experiment import run_dir, validate
    workdir = pathlib.Path(_WORKDIR.value).expanduser()
    fingerprints = validate.preflight(config, workdir, resume=_RESUME.value, allow_changes=_ALLOW_CHANGE.value)
    if jax.process_index() == 0:
        run_dir.record(workdir, config, fingerprints)  # only now: the workdir is accepted
    logging.info("devices: %s; config:\n%s", jax.devices(), config)
    metrics = train(config, workdir, resume=_RESUME.value)
    logging.info("last step's metrics: %s", json.dumps(metrics, sort_keys=True))
    return metrics


def _search_agent_train(config, workdir, *, resume: bool) -> dict:
    from searchjax.experiment import loop
    return loop.train(config, workdir, resume=resume)


def main(argv):
    run(argv, _search_agent_train)


if __name__ == "__main__":
    start_launcher(main)

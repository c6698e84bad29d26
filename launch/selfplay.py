r"""Train Dr.Free's proposer with HRPO, configured by one ml-collections file (configs/drfree.py).

  python -m launch.selfplay --config configs/drfree.py:quickstart --workdir /tmp/drfree_quickstart
  python -m launch.selfplay --config configs/drfree.py:quickstart --workdir /tmp/drfree_quickstart --resume
  python -m launch.selfplay --config configs/drfree.py:qwen2.5-7b-instruct --workdir ~/runs/drfree_proposer \
      --config.chains.pool=~/chains/chains.jsonl --config.retrieval.url=http://127.0.0.1:8000

Like launch/train.py (same flags, same outputs under --workdir, SIGTERM saves and --resume continues), but
the prompts are chain-pool proposer prompts and the loop gets the proposer's rollout and rewards:
flags -> `searchjax.drfree.selfplay.train_proposer(config, workdir)`.
"""

import json
import os
import pathlib

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config: configs/drfree.py[:variant].", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, trajectories and the chain pool.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue from the latest checkpoint in --workdir.")


def main(argv):
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
    from searchjax.drfree import selfplay
    metrics = selfplay.train_proposer(config, workdir, resume=_RESUME.value)
    logging.info("last step's metrics: %s", json.dumps(metrics, sort_keys=True))


if __name__ == "__main__":
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(main)

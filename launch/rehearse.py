r"""Scale rehearsal: one step of an experiment's host path at the config's real batch, on a CPU host.

  # CI size (what tests/rollout/test_rehearsal.py runs): 2,560 rows x 2 searching turns x 16 tokens
  nice -n 10 python -m launch.rehearse --config configs/search_r1.py \
      --config.rollout.max_turns=2 --config.rollout.max_new_tokens_per_turn=16

  # the papers' full turns: 2,560 rows x 4 searching turns (+ the final one) x 500 tokens, top-3
  nice -n 10 python -m launch.rehearse --config configs/search_r1.py --rehearsal.fill_turns=True

  # EviBack: 4,096 rows, the Teacher replaced by a scripted loopback server
  nice -n 10 python -m launch.rehearse --config configs/eviback.py:qwen3-4b \
      --config.rollout.max_turns=2 --config.rollout.max_new_tokens_per_turn=16

No model is loaded: a scripted policy (searchjax/experiment/rehearsal.py) writes searches and answers; the
retrieval server runs in this process over the config's index (the default BM25 corpus for the papers'
configs, whose index is a remote URL) unless --rehearsal.retrieval_url names one. Prints one JSON object:
host seconds per phase (tokenize, retrieval, parse, reward, batching; "generate" is the scripted decode
loop itself), peak host memory, retrieval errors. Exits non-zero if any retrieval failed.
"""

import json
import os

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config: configs/<name>.py[:variant].", lock_config=True)


def _rehearsal_defaults():
    from searchjax.experiment.rehearsal import rehearsal_config
    return rehearsal_config()


_REHEARSAL = config_flags.DEFINE_config_dict("rehearsal", _rehearsal_defaults(), "Rehearsal settings.",
                                             lock_config=True)
_OUT = flags.DEFINE_string("out", "", "Also write the report (JSON) to this file.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import logging
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per HTTP request otherwise
    import jax
    jax.config.update("jax_platforms", "cpu")  # a CPU-host rehearsal, even where an accelerator runtime is installed
    from searchjax import runtime
    runtime.enable_compilation_cache()
    from searchjax.experiment import rehearsal
    result = rehearsal.run(_CONFIG.value, _REHEARSAL.value)
    text = json.dumps(result.report, indent=1, sort_keys=True)
    print(text)
    if _OUT.value:
        with open(os.path.expanduser(_OUT.value), "w") as f:
            f.write(text + "\n")
    if result.report["retrieval_errors"]:
        raise SystemExit(f"launch.rehearse: {result.report['retrieval_errors']} of "
                         f"{result.report['searches_sent']} searches failed")


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)

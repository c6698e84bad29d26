r"""Evaluate systems (the policy as a search agent, and inference baselines on the same model) on QA datasets,
with EM, F1 and LLM-judge grades: one predictions jsonl per (system, dataset) + a summary table.

  python -m launch.evaluate --config configs/evaluate.py --workdir /tmp/searchjax_eval
  python -m launch.evaluate --config configs/evaluate.py --workdir /tmp/eval3 --config.systems=policy,direct,rag
  python -m launch.report --eval_dirs=/tmp/eval3 --baseline=direct --out=/tmp/eval3/report

This file is intentionally short: flags -> `searchjax.experiment.evaluation.run_from_config(config, workdir)`, which
loads the model, tokenizer, retriever, judge and datasets the config names, runs every system greedily on
every dataset (on pods each process runs its share of the batches; process 0 gathers, grades and writes),
writes <workdir>/<system>/predictions_<dataset>.jsonl, summary.json, table.md and config.json, and prints the
table. Every knob is a field of configs/evaluate.py (commented there). Inputs are checked before the model
loads; bad input (config, file, data row, endpoint) ends with one line, `--verbose` adds the traceback.
"""

from absl import flags
from ml_collections import config_flags

from searchjax.experiment.validate import run_launcher, start_launcher  # stdlib-only at import

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Evaluation config: configs/evaluate.py[:variant].", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for predictions.jsonl, summary.json and table.md.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Show the traceback of a bad-input error, not just its one line.")


def main(argv):
    def body():
        from searchjax.experiment import evaluation
        return evaluation.run_from_config(_CONFIG.value, _WORKDIR.value)
    run_launcher(argv, body, distributed_cfg=_CONFIG.value.distributed, verbose=_VERBOSE.value,
                 program="launch.evaluate")


if __name__ == "__main__":
    start_launcher(main)

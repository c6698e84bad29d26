r"""The papers' result tables and plots from evaluation directories and training runs.

  python -m launch.report --eval_dirs=/tmp/eval_base,/tmp/eval_rl --names=base,rl --baseline=base \
      --runs=/tmp/run_grpo,/tmp/run_eviback --out=/tmp/report

Reads every predictions*.jsonl under each --eval_dirs entry (launch/evaluate.py's output, with judge grades
where graded) and writes into --out: report.md (EM, F1 and judge accuracy per benchmark with single-hop /
multi-hop macro averages, best in bold, paired bootstrap intervals against --baseline, question counts),
report.json (every number), benchmarks_<metric>.png (bars with intervals) and, with --runs,
training_curves.png (--curve_metrics from each run's metrics.jsonl, overlaid). Prints report.md.
Definitions: searchjax/eval/report.py.
"""

from absl import app, flags

_EVAL_DIRS = flags.DEFINE_list("eval_dirs", None, "Evaluation directories (or predictions .jsonl files).")
_NAMES = flags.DEFINE_list("names", [], "System name per --eval_dirs entry (default: the directory names).")
_BASELINE = flags.DEFINE_string("baseline", "", "System the differences and their intervals are taken against.")
_RUNS = flags.DEFINE_list("runs", [], "Training run directories (metrics.jsonl) for the training-curve plot.")
_RUN_NAMES = flags.DEFINE_list("run_names", [], "Legend name per --runs entry (default: the directory names).")
_CURVE_METRICS = flags.DEFINE_list("curve_metrics", ["reward/mean"], "metrics.jsonl keys to plot against step.")
_OUT = flags.DEFINE_string("out", None, "Output directory for report.md, report.json and the PNGs.")
_CONFIDENCE = flags.DEFINE_float("confidence", 0.95, "Bootstrap interval confidence level.")
_RESAMPLES = flags.DEFINE_integer("resamples", 10_000, "Bootstrap resamples.")
_SEED = flags.DEFINE_integer("seed", 0, "Bootstrap seed.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import matplotlib
    matplotlib.use("Agg")  # files only, never a display
    from searchjax.eval import report
    written = report.write_report(_EVAL_DIRS.value, _OUT.value, names=_NAMES.value, baseline=_BASELINE.value,
                                  run_dirs=_RUNS.value, run_names=_RUN_NAMES.value,
                                  curve_metrics=_CURVE_METRICS.value, confidence=_CONFIDENCE.value,
                                  resamples=_RESAMPLES.value, seed=_SEED.value)
    print(written["markdown"].read_text(), flush=True)
    for what, path in written.items():
        print(f"wrote {what}: {path}")


if __name__ == "__main__":
    flags.mark_flags_as_required(["eval_dirs", "out"])
    app.run(main)

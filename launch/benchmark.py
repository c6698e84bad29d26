r"""Benchmark suites: each figure measured next to its reference in the same run.

  python -m launch.benchmark --only=scoring,generation --out_dir=bench_results

Prints one table per suite and writes bench_results/<suite>.json. Suites (one module each under
searchjax/bench/): scoring (token_logprobs vs transformers), generation (decode vs transformers
generate), retrieval (encoder vs sentence-transformers, ANN recall/QPS, server latency), train
(update step vs a torch loss), drfree (IG reward vs difficulty reward; drfree_paper: with the paper's solver
only, to completion on as many questions as 45 minutes allow), decode_window (the decode step against
its window), rollout (the search agent's rollout at the papers' shapes vs transformers).
"""

import importlib
import json
import os
import pathlib

from absl import app, flags

FLAGS = flags.DEFINE_list("only", ["scoring"], "Suites to run (comma separated).")
OUT_DIR = flags.DEFINE_string("out_dir", "bench_results", "Where <suite>.json files go.")
QUICK = flags.DEFINE_bool("quick", False, "Small shapes: a smoke run of the harness.")
ITERS = flags.DEFINE_integer("iters", 5, "Timed iterations per figure (median reported).")
DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16", "auto"],
                          "Compute dtype of both sides (auto: searchjax.runtime.host_compute_dtype()).")
MODEL = flags.DEFINE_string("model", "smollm2", "The rollout suite's policy: a Hugging Face checkpoint directory, a "
                            "GGUF file or an alias (searchjax.data.assets.MODEL_ALIASES).")

# Suite name -> module (its run(args)) or module:function. Listed explicitly so `--only` can name exactly what exists.
SUITES = {
    "scoring": "searchjax.bench.scoring",
    "generation": "searchjax.bench.generation",
    "retrieval": "searchjax.bench.retrieval",
    "train": "searchjax.bench.train",
    "drfree": "searchjax.bench.drfree",
    "decode_window": "searchjax.bench.decode_window",
    "rollout": "searchjax.bench.rollout",
    "drfree_paper": "searchjax.bench.drfree:run_paper_solver",
}


def main(argv):
    del argv
    # The suites run their sides in several processes on this host's one accelerator, where JAX would otherwise
    # take 75 % of its memory at start-up in each: here (a dtype of "auto" starts JAX's backend) and per side.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from searchjax import runtime
    from searchjax.bench.common import BenchArgs, format_table
    from searchjax.data import assets
    runtime.enable_compilation_cache()
    unknown = [name for name in FLAGS.value if name not in SUITES]
    if unknown:
        raise app.UsageError(f"unknown suite(s) {unknown}; valid: {sorted(SUITES)}")
    if MODEL.value not in assets.MODEL_ALIASES and not os.path.exists(os.path.expanduser(MODEL.value)):
        raise app.UsageError(f"--model={MODEL.value!r}: no such file or directory")  # before any suite loads
    dtype = runtime.host_compute_dtype() if DTYPE.value == "auto" else DTYPE.value
    args = BenchArgs(iters=ITERS.value, quick=QUICK.value, out_dir=OUT_DIR.value, dtype=dtype, model=MODEL.value)
    out = pathlib.Path(OUT_DIR.value)
    out.mkdir(parents=True, exist_ok=True)
    for name in FLAGS.value:
        module, _, function = SUITES[name].partition(":")
        rows = getattr(importlib.import_module(module), function or "run")(args)
        print(f"\n== {name} ==\n{format_table(rows)}")
        tmp = out / f".{name}.json.tmp"
        tmp.write_text(json.dumps(rows, indent=2, default=float))
        os.replace(tmp, out / f"{name}.json")


if __name__ == "__main__":
    from searchjax.runtime import use_transparent_huge_pages
    use_transparent_huge_pages()  # re-executes once with GLIBC_TUNABLES set (XLA:CPU's buffers: huge pages, kept)
    app.run(main)

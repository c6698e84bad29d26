r"""Compile a run's accelerator programs for a TPU topology on this CPU host, and project its RL step time.

  python -m launch.compile_check --config configs/search_r1.py:qwen2.5-7b --topology v5p:2x4x4
  python -m launch.compile_check --config configs/eviback.py:qwen3-4b --topology v5e:16x16 --config.mesh.tensor=4
  python -m launch.compile_check --config configs/drfree.py --topology v5p:2x4x4 --num_slices 2 --json_out r.json
  python -m launch.compile_check --config configs/drfree.py:qwen2.5-7b-instruct --stage solver --topology v5p:2x4x4

Needs the TPU runtime (`pip install -e '.[tpu]'`); JAX itself stays on the CPU. Every program of the run
(searchjax/aot/programs.py) is lowered with abstract inputs at the config's largest shapes and compiled by
the TPU compiler for `--topology` (a chip grid: v4 / v5p AxBxC, v5e / v6e AxB); no weights are loaded (the
model comes from its checkpoint's config.json when config.model.path exists here, else from the preset its
name names). Printed per program: per-chip argument / output / temporary bytes against the chip's HBM, the
collectives in the compiled HLO, and the compiler's FLOPs against the analytic count; then the projected RL
step (searchjax/roofline.py). A program that does not fit prints the compiler's out-of-memory message with
the figures on one line; the exit status is then 1 (2 for a config that cannot run on this mesh at all).
"""

import json
import os
import pathlib
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config: configs/<name>.py[:variant].",
                                          lock_config=True)
_TOPOLOGY = flags.DEFINE_string("topology", None, "TPU chip grid, e.g. v5p:2x4x4 (32 chips) or v5e:16x16 (256), or "
                                 "the GPUs of one node, h100:8 (needs the CUDA plugin: docs/compile_check.md).")
_SLICES = flags.DEFINE_integer("num_slices", 1, "Slices of that topology (multi-slice over the data-center network).")
_PROGRAMS = flags.DEFINE_list("programs", [], "Compile only these programs (default: all of the run's).")
_SKIP = flags.DEFINE_list("skip_programs", [], "Do not compile these programs (e.g. retrieval_enc, the same for all).")
_STAGE = flags.DEFINE_enum("stage", "", ["", "solver"], "Dr.Free (configs/drfree.py): 'solver' checks the solver "
                            "stage's run (searchjax.experiment.self_evolution.solver_config), not the proposer's.")
_PROJECT_ONLY = flags.DEFINE_bool("project_only", False, "Skip compilation: the analytic projection alone (seconds).")
_JSON = flags.DEFINE_string("json_out", "", "Also write the full result as JSON to this path.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _TOPOLOGY.value:
        raise app.UsageError("--topology is required (e.g. v5p:2x4x4)")
    import jax
    jax.config.update("jax_platforms", "cpu")  # compile-only TPU devices; nothing executes
    from searchjax.aot import check
    config = _CONFIG.value
    if _STAGE.value == "solver":
        if "solver" not in config:
            raise app.UsageError("--stage solver needs a config with a `solver` section (configs/drfree.py)")
        from searchjax.experiment.self_evolution import solver_config
        config = solver_config(config, iteration=1)
    try:
        result = check.check(config, _TOPOLOGY.value, _SLICES.value, only=tuple(_PROGRAMS.value),
                              skip=tuple(_SKIP.value), compile_programs=not _PROJECT_ONLY.value)
    except ValueError as e:  # a config that cannot run on this mesh (batch arithmetic, unknown model)
        print(f"CONFIG ERROR: {e}", file=sys.stderr)
        return 2
    print(check.format_projection(result["projection"]))
    if _JSON.value:
        path = pathlib.Path(_JSON.value)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1, default=str))
    for line in result["oom"]:
        print(line, file=sys.stderr)
    return 1 if result["oom"] else 0


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    flags.mark_flag_as_required("config")
    app.run(main)  # exits with main's return value

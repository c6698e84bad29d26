r"""The compile-check table of docs/compile_check.md: the papers' configs x TPU topologies, resumable.

  nice -n 10 python -m launch.compile_table                      # runs what is missing, then writes the doc
  python -m launch.compile_table --only "EviBack qwen3-0.6b"     # entries whose label contains this text
  python -m launch.compile_table --write_only                    # rewrite the doc from the cache
  python -m launch.compile_table --reproject                     # redo the cached projections, then the doc

Each (entry, topology) pair runs `launch.compile_check` in its own process (minutes on 2 cores) and leaves
one JSON in --cache_dir (rewritten after each attempt); a pair whose JSON is complete is skipped, so an
interrupted table resumes where it stopped (delete a JSON to redo it). A config whose batch arithmetic does
not fit the topology gets the overrides of `searchjax.aot.check.batch_fit`; one whose update runs out of
memory is retried with mesh.tensor doubled, twice at most (not one whose rollout does: its KV cache is
sharded over the batch only); every attempt and its overrides are recorded and shown.

The projection is analytic (`searchjax.aot.check.project`: roofline x calls, nothing compiled), so when the
rollout's shapes or the roofline change, `--reproject` recomputes it for every cached pair (the last attempt's
config and overrides, in this process, seconds per pair) and keeps the compiled figures as they are.
"""

import json
import math
import os
import pathlib
import subprocess
import sys
import time

from absl import app, flags

ROOT = pathlib.Path(__file__).resolve().parent.parent
ENTRIES = (  # (label, config file:variant[,solver]), smallest first; ",solver" = Dr.Free's solver stage
    ("EviBack qwen3-0.6b", "configs/eviback.py:qwen3-0.6b"),
    ("EviBack qwen3-1.7b", "configs/eviback.py:qwen3-1.7b"),
    ("Search-R1 qwen2.5-3b", "configs/search_r1.py:qwen2.5-3b"),
    ("Dr.Free proposer qwen2.5-3b-instruct", "configs/drfree.py:qwen2.5-3b-instruct"),
    ("Dr.Free solver qwen2.5-3b-instruct", "configs/drfree.py:qwen2.5-3b-instruct,solver"),
    ("EviBack qwen3-4b", "configs/eviback.py:qwen3-4b"),
    ("Search-R1 qwen2.5-7b", "configs/search_r1.py:qwen2.5-7b"),
    ("CCS qwen2.5-7b-instruct", "configs/ccs.py:qwen2.5-7b-instruct"),
    ("Dr.Free proposer qwen2.5-7b-instruct", "configs/drfree.py:qwen2.5-7b-instruct"),
    ("Dr.Free solver qwen2.5-7b-instruct", "configs/drfree.py:qwen2.5-7b-instruct,solver"),
    ("CCS qwen3-32b", "configs/ccs.py:qwen3-32b"),
)
TOPOLOGIES = ("v5p:2x4x4", "v5e:16x16")
OOM_RETRIES = 2

_CACHE = flags.DEFINE_string("cache_dir", str(ROOT / "docs" / "compile_check"),
                             "One JSON per (entry, topology); kept in the repository so that any machine resumes.")
_OUT = flags.DEFINE_string("out", str(ROOT / "docs" / "compile_check.md"), "The markdown table written.")
_ONLY = flags.DEFINE_string("only", "", "Run only entries whose label contains this text.")
_TOPOS = flags.DEFINE_list("topologies", list(TOPOLOGIES), "Topologies to run.")
_TIMEOUT = flags.DEFINE_integer("timeout_s", 3600, "Per compile_check process.")
_WRITE_ONLY = flags.DEFINE_bool("write_only", False, "Only rewrite the doc from the cache.")
_REPROJECT = flags.DEFINE_bool("reproject", False, "Recompute the projection of every cached pair (both kinds) "
                                "with the code as it is now, then rewrite the doc; compiled figures are kept.")
_PROJECT_ONLY = flags.DEFINE_bool("project_only", False, "The analytic projection of every pair (no compilation; "
                                  "seconds per pair), cached apart from the compiled results.")


def _key(label: str, topology: str, kind: str = "compiled") -> str:
    name = f"{label}@{topology}".replace(" ", "_").replace(":", "-").replace("/", "-")
    return name + (".json" if kind == "compiled" else ".projection.json")


def _split(spec: str) -> tuple[str, str, bool]:
    """"configs/drfree.py:qwen2.5-3b-instruct,solver" -> (path, variant, solver stage?)."""
    path, _, variant = spec.partition(":")
    solver = variant.endswith(",solver")
    return path, variant.removesuffix(",solver"), solver


def _load_config(spec: str):
    from searchjax.config_files import sibling
    path, variant, solver = _split(spec)
    config = sibling(str(ROOT / path), pathlib.Path(path).stem).get_config(variant)
    if solver:
        from searchjax.experiment.self_evolution import solver_config
        config = solver_config(config, iteration=1)
    return config


def _chips(topology: str) -> int:
    from searchjax.aot.compiler import parse_topology
    return math.prod(parse_topology(topology)[1])


def _attempt(spec: str, topology: str, overrides: dict, skip_encoder: bool, json_path: pathlib.Path) -> dict:
    path, variant, solver = _split(spec)
    cmd = [sys.executable, "-m", "launch.compile_check", "--config", f"{ROOT / path}:{variant}", "--topology", topology,
           "--json_out", str(json_path)] + (["--stage", "solver"] if solver else [])
    # The solver stage's batch is config.solver.batch (solver_config copies it over config.batch).
    cmd += [f"--config.{'solver.' if solver and k.startswith('batch.') else ''}{k}={v}" for k, v in overrides.items()]
    if _PROJECT_ONLY.value:
        cmd.append("--project_only")
    # Compiled here: the update (the most memory: optimizer state + one micro-batch's activations), the rollout
    # and the reward models. The log-prob passes are forward-only at the update's shapes with less state, so
    # they fit when the update does; the retrieval server's encoder is the same for every entry (compiled with
    # the first). All stay in the projection, which is analytic. `launch.compile_check` compiles everything.
    skip = ["old_logprob", "ref_logprob"] + (["retrieval_enc"] if skip_encoder else [])
    cmd += ["--skip_programs", ",".join(skip)]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    started = time.time()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=_TIMEOUT.value)
        status, tail = proc.returncode, (proc.stdout + proc.stderr)[-4000:]
    except subprocess.TimeoutExpired:
        status, tail = "timeout", f"timed out after {_TIMEOUT.value} s"
    result = json.loads(json_path.read_text()) if status in (0, 1) and json_path.exists() else None
    return {"overrides": overrides, "status": status, "seconds": round(time.time() - started), "result": result,
            "log_tail": "\n".join(line for line in tail.splitlines() if "OUT OF MEMORY" in line or "ERROR" in line
                                  or "Error" in line)[-2000:]}


def run_pair(label: str, spec: str, topology: str, cache: pathlib.Path, first_of_topology: bool,
             save=lambda row: None) -> dict:
    from searchjax.aot.check import batch_fit
    config = _load_config(spec)
    chips = _chips(topology)
    overrides = batch_fit(config, chips)
    attempts = []
    for retry in range(OOM_RETRIES + 1):
        tmp = cache / (_key(label, topology, _kind()) + f".attempt{retry}")
        attempt = _attempt(spec, topology, overrides, not first_of_topology, tmp)
        attempts.append(attempt)
        save({"label": label, "config": spec, "topology": topology, "attempts": attempts, "complete": False})
        print(f"{label} @ {topology} {overrides or ''}: status {attempt['status']} in {attempt['seconds']} s",
              flush=True)
        tmp.unlink(missing_ok=True)
        failed = {line.split("program ", 1)[1].split()[0] for line in (attempt["result"] or {}).get("oom", [])}
        # Tensor parallelism shrinks the weights and optimizer state per chip; the rollout's KV cache is sharded
        # over the batch only, so an out-of-memory rollout is not retried (no mesh field shrinks it).
        if attempt["status"] != 1 or not failed & {"update", "old_logprob", "ref_logprob"}:
            break
        tensor = int(overrides.get("mesh.tensor", config.mesh.tensor)) * 2
        if chips % tensor:
            break
        config.mesh.tensor = tensor
        # batch_fit from the config's own micro-batch: a micro-batch raised for the smaller tensor is dropped
        overrides = {**{k: v for k, v in overrides.items() if k not in ("mesh.tensor", "batch.micro_batch_size")},
                     "mesh.tensor": tensor, **batch_fit(config, chips)}
    return {"label": label, "config": spec, "topology": topology, "attempts": attempts, "complete": True}


def _kind() -> str:
    return "projection" if _PROJECT_ONLY.value else "compiled"


def reproject(cache: pathlib.Path) -> None:
    """Replace the projection in the last attempt of every cached pair with the current code's (see the module
    docstring); pairs whose last attempt has no result are left as they are."""
    import jax
    jax.config.update("jax_platforms", "cpu")
    from searchjax.aot import check
    for topology in TOPOLOGIES:
        for label, spec in ENTRIES:
            for kind in ("compiled", "projection"):
                path = cache / _key(label, topology, kind)
                row = json.loads(path.read_text()) if path.exists() else None
                last = row["attempts"][-1] if row else None
                if not last or last["result"] is None:
                    continue
                config = _load_config(spec)
                config.update_from_flattened_dict(last["overrides"])  # {"batch.micro_batch_size": 128, ...}
                result = check.check(config, topology, compile_programs=False, log=lambda *_: None)
                before, last["result"]["projection"] = last["result"]["projection"]["step_s"], result["projection"]
                path.write_text(json.dumps(row, indent=1, default=str))
                print(f"{label} @ {topology} ({kind}): projected step {before:.1f} -> "
                      f"{result['projection']['step_s']:.1f} s", flush=True)


def main(argv):
    del argv
    cache = pathlib.Path(_CACHE.value)
    cache.mkdir(parents=True, exist_ok=True)
    if _REPROJECT.value:
        reproject(cache)
    elif not _WRITE_ONLY.value:
        for topology in _TOPOS.value:
            for i, (label, spec) in enumerate(ENTRIES):
                path = cache / _key(label, topology, _kind())
                if _ONLY.value not in label or (path.exists() and json.loads(path.read_text()).get("complete", True)):
                    continue  # done; a pair interrupted between attempts (complete: false) is run again

                def save(row, path=path):
                    path.write_text(json.dumps(row, indent=1, default=str))
                save(run_pair(label, spec, topology, cache, i == 0, save))
                write_doc(cache, pathlib.Path(_OUT.value))
    write_doc(cache, pathlib.Path(_OUT.value))


BEGIN, END = "<!-- compile_table:begin -->", "<!-- compile_table:end -->"


def write_doc(cache: pathlib.Path, out: pathlib.Path) -> None:
    """Replace the generated part of `out` (between BEGIN and END) with the tables; the rest stays as written."""
    def load(kind):
        return [json.loads((cache / _key(label, t, kind)).read_text()) for t in TOPOLOGIES for label, _ in ENTRIES
                if (cache / _key(label, t, kind)).exists()]
    rows = load("compiled")
    pending = [f"{label} @ {t}" for t in TOPOLOGIES for label, _ in ENTRIES if not (cache / _key(label, t)).exists()]
    table = render(rows, pending) + "\n" + render_projections(load("projection"))
    text = out.read_text() if out.exists() else f"# Compile check\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        raise ValueError(f"{out}: the markers {BEGIN} / {END} are missing; put them where the table goes")
    head, rest = text.split(BEGIN, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(head + BEGIN + "\n" + table + "\n" + END + rest.split(END, 1)[1])
    print(f"wrote {out} ({len(rows)} compiled pairs, {len(pending)} pending)", flush=True)


def render_projections(rows: list[dict]) -> str:
    """The analytic projection of every pair (no compilation): where the step time goes."""
    if not rows:
        return ""
    lines = ["### Analytic projection of every pair (roofline x calls; `--project_only`, nothing compiled)", "",
             "| experiment | topology | mesh (overrides) | update s | log-prob s | rollout s (prefill + decode + "
             "append) | decode bound | other s | step s | MFU % |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        last = row["attempts"][-1]
        result = last["result"]
        if result is None:
            lines.append(f"| {row['label']} | {row['topology']} | error: {last['log_tail'][-200:]} |||||||")
            continue
        tried = json.dumps(last["overrides"]) if last["overrides"] else ""
        by = {}
        for p in result["projection"]["programs"]:
            group = ("update" if p["name"] == "update" else "logprob" if p["name"].endswith("logprob") else
                     "rollout" if p["name"].split()[0] in ("prefill", "decode", "append") else "other")
            by[group] = by.get(group, 0.0) + p["seconds_per_step"]
        bounds = sorted({p["bound"] for p in result["projection"]["programs"] if p["name"].startswith("decode")})
        lines.append(f"| {row['label']} | {row['topology']} | {result['mesh']} {tried} | {by.get('update', 0):.0f} | "
                     f"{by.get('logprob', 0):.0f} | {by.get('rollout', 0):.0f} | {'/'.join(bounds)} | "
                     f"{by.get('other', 0):.0f} | {result['projection']['step_s']:.0f} | "
                     f"{100 * result['projection']['mfu']:.0f} |")
    return "\n".join(lines) + "\n"


def _ratio(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _gib(x: float) -> str:
    return f"{x / 2 ** 30:.1f}"


def render(rows: list[dict], pending: list[str]) -> str:
    """Markdown: one summary row per pair, then each pair's programs and projection."""
    lines = ["| experiment | topology | mesh (overrides tried) | fits | update peak GiB | rollout peak GiB (prefill / "
             "decode / append) | largest peak that fits GiB (program) | projected step s | MFU % | compile min |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    details = []
    for row in rows:
        last = row["attempts"][-1]
        result = last["result"]
        tried = " → ".join(json.dumps(a["overrides"]) if a["overrides"] else "as configured" for a in row["attempts"])
        tried += "" if row.get("complete", True) else " (interrupted: the next attempt was not run)"
        minutes = sum(a["seconds"] for a in row["attempts"]) / 60
        if result is None:
            lines.append(f"| {row['label']} | {row['topology']} | {tried} | error ({last['status']}) | | | | | | "
                         f"{minutes:.0f} |")
            details.append(f"#### {row['label']} @ {row['topology']}\n\n```\n{last['log_tail']}\n```\n")
            continue
        programs = {p["program"]: p for p in result["programs"]}
        failed = {line.split("program ", 1)[1].split()[0]: line for line in result["oom"]}

        def peak(name):  # "12.3", or the compiler's own figure for a program that did not fit
            if name in programs:
                return _gib(programs[name]["peak_bytes"])
            if name in failed:
                line = failed[name]
                needed = line.split("temporaries (")[-1].split(")")[0] if "temporaries (" in line else "?"
                return f"OOM ({needed} temporaries)"
            return "-"
        rollout = " / ".join(peak(n) for n in ("prefill", "decode", "append") if n in programs or n in failed)
        largest = max(result["programs"], key=lambda p: p["peak_bytes"], default=None)
        fits = "yes" if not failed else "NO: " + ", ".join(failed)
        proj = result["projection"]
        lines.append(f"| {row['label']} | {row['topology']} | {result['mesh']} {tried} | {fits} | {peak('update')} | "
                     f"{rollout} | {_gib(largest['peak_bytes']) + ' (' + largest['program'] + ')' if largest else '-'} "
                     f"| {proj['step_s']:.0f} | {100 * proj['mfu']:.1f} | {minutes:.0f} |")
        block = [f"#### {row['label']} @ {row['topology']} ({result['chips']} chips, mesh {result['mesh']}, "
                 f"model {result['models']})", "",
                 "| program | shapes | args / out / temp / peak GiB per chip | collectives | compiler / analytic "
                 "FLOPs (loops once) | calls per step |", "|---|---|---|---|---|---|"]
        for p in result["programs"]:
            coll = ", ".join(f"{k} {v}" for k, v in p["collectives"].items() if v) or "none"
            block.append(f"| {p['program']} | {p['shapes']} | {_gib(p['argument_bytes'])} / {_gib(p['output_bytes'])}"
                         f" / {_gib(p['temp_bytes'])} / {_gib(p['peak_bytes'])} | {coll} | "
                         f"{_ratio(p['compiler_over_analytic_once'])} ({p['trips'] or 'no loops'}) | "
                         f"{p['calls_per_step']:.0f}{'' if p['in_step'] else ' (outside the step)'} |")
        for oom in result["oom"]:
            block.append(f"\n`{oom}`")
        block.append("\nProjected step (roofline x calls): " + "; ".join(
            f"{p['name']} {p['seconds_per_step']:.1f} s ({p['bound']})" for p in proj["programs"]) + "\n")
        details.append("\n".join(block))
    if pending:
        lines.append("")
        lines.append("Not yet run (resume with `nice -n 10 python -m launch.compile_table`): " + "; ".join(pending))
    return "\n".join(lines) + "\n\n" + "\n".join(details)


if __name__ == "__main__":
    app.run(main)

"""A config's accelerator programs compiled for a TPU topology, and the projected RL step (launch/compile_check.py).

    result = check(config, "v5p:2x4x4")          # dict: per-program reports, OOM lines, projection

The model is the checkpoint directory's config.json when config.model.path exists on this machine, else the
preset of `searchjax.models.presets` its directory name names ("~/models/Qwen2.5-7B-Instruct" ->
"qwen2.5-7b" after dropping "-instruct" when the exact name is not a preset). Which programs a config runs:
the update and log-prob passes and the rollout always; Dr.Free's anchor scorer when reward_fn is
"drfree_information_gain"; CCS's decoder embedder when config.embedder.kind is "decoder"; the retrieval
server's E5 encoder when the rollout searches or the reward retrieves (outside the step: its own server).
"""

from __future__ import annotations

import json
import math
import pathlib

from searchjax import roofline
from searchjax.aot import compiler, programs as progs

# Embedders whose shapes are those of a decoder preset (their HF config.json: same layers, widths and heads).
EMBEDDER_SHAPES = {"qwen3-embedding-0.6b": "qwen3-0.6b", "qwen3-embedding-4b": "qwen3-4b",
                   "qwen3-embedding-8b": "qwen3-8b"}


def preset_for(path: str) -> str | None:
    """The preset a model directory's name stands for, or None."""
    from searchjax.models.presets import PRESET_NAMES
    name = pathlib.Path(path).name.lower()
    for candidate in (name, name.removesuffix("-instruct"), EMBEDDER_SHAPES.get(name)):
        if candidate in PRESET_NAMES:
            return candidate
    return None


def model_config(path: str, *, dtype: str, param_dtype: str, field: str):
    """(ModelConfig, where it came from): config.json of the directory if present here, else the preset."""
    from searchjax.models import config_from_hf
    from searchjax.models.presets import get_preset
    local = pathlib.Path(path).expanduser() / "config.json"
    if local.is_file():
        return config_from_hf(json.loads(local.read_text()), source=str(local), dtype=dtype,
                              param_dtype=param_dtype), str(local)
    preset = preset_for(path)
    if preset is None:
        raise ValueError(f"{field}={path!r}: no config.json there and no model preset named like it; set {field} "
                         "to a checkpoint directory or a name of searchjax/models/presets.py")
    return get_preset(preset, dtype=dtype, param_dtype=param_dtype), f"preset {preset}"


def validate_batch(config, mesh) -> None:
    """The trainer's batch arithmetic on this mesh (searchjax.experiment.loop.validate's rules), one clear line."""
    from searchjax.sharding import batch_shard_count
    u = config.batch
    rows = config.prompts_per_step * config.rollout.group_size
    shards = batch_shard_count(mesh)
    if rows % u.mini_batch_size or u.mini_batch_size % u.micro_batch_size:
        raise ValueError(f"config.batch: mini_batch_size={u.mini_batch_size} must divide the {rows} rows per step "
                         f"and be a multiple of micro_batch_size={u.micro_batch_size}")
    if u.micro_batch_size % shards:
        raise ValueError(f"config.batch.micro_batch_size={u.micro_batch_size} is not a multiple of the mesh's "
                         f"{shards} batch shards (data x fsdp = {mesh.shape['data']} x {mesh.shape['fsdp']}): set "
                         f"config.mesh (e.g. tensor > 1) or micro_batch_size")


def batch_shards(data: int, fsdp: int, tensor: int, chips: int) -> int:
    """data x fsdp of a (data, fsdp, tensor) mesh on `chips` chips (one size may be -1), without building it."""
    sizes = [int(data), int(fsdp), int(tensor)]
    if -1 in sizes:
        sizes[sizes.index(-1)] = chips // math.prod(x for x in sizes if x != -1)
    return sizes[0] * sizes[1]


def batch_fit(config, chips: int) -> dict:
    """Config overrides that make `validate_batch` pass on `chips` chips; {} when the config already does.

    For mesh.tensor = the config's, then doubled while it divides the chips: the smallest micro_batch_size that
    is >= the config's, a multiple of the batch shards and a divisor of mini_batch_size. So pure FSDP is kept
    when the mini-batch allows it (fewer, larger micro-batches also gather the weights fewer times), and tensor
    parallelism comes in only when the batch shards outnumber the mini-batch's rows.
    """
    u, m = config.batch, config.mesh
    tensor = int(m.tensor)
    while tensor <= chips and chips % tensor == 0:
        shards = batch_shards(m.data, m.fsdp, tensor, chips)
        for micro in range(shards, u.mini_batch_size + 1, shards):
            if micro >= u.micro_batch_size and u.mini_batch_size % micro == 0:
                return ({} if tensor == int(m.tensor) else {"mesh.tensor": tensor}) | (
                    {} if micro == u.micro_batch_size else {"batch.micro_batch_size": micro})
        tensor *= 2
    raise ValueError(f"config.batch.mini_batch_size={u.mini_batch_size}: no mesh of {chips} chips splits it")


def build_programs(config, mesh) -> tuple[list[compiler.Program], dict]:
    """Every program of the run (see the module docstring) and a description of the model(s)."""
    from searchjax.models import Transformer
    m = config.model
    cfg, source = model_config(m.path, dtype=m.dtype, param_dtype=m.param_dtype, field="config.model.path")
    model = Transformer(cfg.replace(remat_policy=m.remat_policy))
    found = {"policy": source, "params": roofline.param_count(cfg)}
    out = progs.update_programs(config, model, mesh) + progs.rollout_programs(config, model, mesh)
    rows = config.prompts_per_step * config.rollout.group_size
    if config.reward_fn == "drfree_information_gain":
        anchor = config.anchor
        anchor_cfg = model.config
        if anchor.path:
            anchor_cfg, found["anchor"] = model_config(anchor.path, dtype=anchor.dtype, param_dtype=anchor.dtype,
                                                       field="config.anchor.path")
        out.append(progs.information_gain_program(config, model, mesh, anchor_cfg))
    if "embedder" in config and config.embedder.kind == "decoder":
        e = config.embedder
        ecfg, found["embedder"] = model_config(e.path, dtype=e.dtype, param_dtype=e.dtype, field="config.embedder.path")
        out.append(progs.decoder_embedder_program(ecfg, mesh, 2 * rows, e.batch_size))
    queries = rows * config.rollout.max_turns if config.rollout.search else 0
    if config.reward_fn == "drfree_information_gain":
        queries += rows  # one retrieval per proposal (the retrieval shortcut)
    if queries and config.retrieval.url:
        out.append(progs.retrieval_encoder_program(mesh, queries))
    return out, found


def project(config, mesh, programs: list[compiler.Program], chip: roofline.Chip) -> dict:
    """The projected RL step: roofline x calls per program; decode per turn at that turn's windows."""
    rows = []
    for p in programs:
        if not p.in_step:
            continue
        if p.name != "decode":
            rows.append({"name": p.name, "cost": p.cost, "calls": p.calls, "chips": p.chips})
            continue
        s = progs.rollout_shapes(config, mesh)
        model_cfg = p.static["model"].config
        for turn, segments in enumerate(progs.decode_turn_segments(config, mesh)):
            for window, steps in segments:
                cost = roofline.decode_step_cost(model_cfg, progs._layout(mesh), rows=s["B"], window=window)
                rows.append({"name": f"decode t{turn} W={window}", "cost": cost, "calls": s["sessions"] * steps,
                             "chips": p.chips})
    return roofline.project_step(rows, chip, mesh.size)


def check(config, topology: str, num_slices: int = 1, *, only: tuple[str, ...] = (), skip: tuple[str, ...] = (),
          compile_programs: bool = True, log=print) -> dict:
    """Compile every program (those named in `only`, less those in `skip`) for the topology; OOMs are collected,
    not raised. The projection (analytic) covers every program of the run, or only those of `only`;
    compile_programs=False gives it alone, in seconds."""
    chip_name, _ = compiler.parse_topology(topology)
    chip = roofline.CHIPS[chip_name]
    devices = compiler.topology_devices(topology, num_slices)
    mesh = compiler.mesh_from_config(config.mesh, devices)
    validate_batch(config, mesh)
    programs, models = build_programs(config, mesh)
    unknown = set(only) - {p.name for p in programs}  # skipping a program the config lacks is no error
    if unknown:
        raise ValueError(f"--programs: unknown {sorted(unknown)}; this config has {[p.name for p in programs]}")
    every = programs
    programs = [p for p in programs if (not only or p.name in only) and p.name not in skip]
    where = f"{topology}" + (f" x {num_slices} slices" if num_slices > 1 else "")
    log(f"{where}: {len(devices)} chips ({chip.name}), mesh {dict(mesh.shape)}; model {models}")
    reports, failures = [], []
    for program in programs if compile_programs else ():
        program.check_peak = chip_name in compiler.GPU_TARGETS
        try:
            reports.append(compiler.compile_program(program, topology=where, hbm_bytes=chip.hbm_bytes))
            log(compiler.format_report(reports[-1]))
        except compiler.CompileOOMError as e:
            failures.append(str(e))
            log(str(e))
    projection = project(config, mesh, programs if only else every, chip)  # analytic: skipped ones count too
    return {"topology": topology, "num_slices": num_slices, "chips": len(devices), "chip": chip.name,
            "mesh": dict(mesh.shape), "models": models, "programs": reports, "oom": failures,
            "projection": projection}


def format_projection(projection: dict) -> str:
    lines = [f"{'program':<22}{'calls':>8}{'compute s':>11}{'hbm s':>9}{'ici s':>9}  bound   {'s/step':>8}"]
    for row in projection["programs"]:
        lines.append(f"{row['name']:<22}{row['calls']:>8.0f}{row['compute_s']:>11.4f}{row['hbm_s']:>9.4f}"
                     f"{row['ici_s']:>9.4f}  {row['bound']:<7}{row['seconds_per_step']:>8.2f}")
    lines.append(f"projected RL step {projection['step_s']:.1f} s, MFU {100 * projection['mfu']:.1f} %")
    return "\n".join(lines)

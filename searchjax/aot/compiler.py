"""Compile-only TPU devices on a CPU host, the run's mesh over them, and one program's compile report.

TPU, the approach of MaxText's train_compile: `jax.experimental.topologies.get_topology_desc` asks libtpu (the
`tpu` extra of setup.py) for the devices of a TPU topology that is not attached; a mesh over them lays out
abstract inputs (`jax.ShapeDtypeStruct` with NamedShardings), and `jit(f).lower(...).compile()` runs the
TPU compiler itself. The result reports per-chip argument / output / temporary bytes (`memory_analysis`),
the per-chip FLOPs and bytes the compiler counts (`cost_analysis`, loop bodies counted once) and the
compiled HLO, whose collectives we count. A program that does not fit fails inside the compiler with the
TPU's own out-of-memory error (RESOURCE_EXHAUSTED: ... exceeds available HBM ...): `CompileOOMError`.

GPU (`--topology h100:8`, one node): the CUDA PJRT plugin (GPU_PLUGIN, not a dependency of this package)
describes GPUs that are not attached when given XLA's GpuTargetConfigProto of the device (GPU_TARGETS), and
XLA:GPU compiles for them; it reports memory but no cost analysis, and it does not refuse a program that is
too large, so a peak above the device's memory is reported as out of memory here.

JAX's own platform stays the CPU (JAX_PLATFORMS=cpu): nothing here runs on the compile-only devices.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
from typing import Any, Sequence

import jax
import numpy as np

from searchjax import roofline

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# An HLO instruction whose opcode is a collective: `= <shape> all-gather(` or its async `all-gather-start(`.
_COLLECTIVE_RE = re.compile(r"\b(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_TWO_D = ("v5e", "v6e")  # chip grids "AxB"; v4 / v5p "AxBxC"; GPUs "N" (GPUs of one node)
# XLA's GpuTargetConfigProto of a GPU that is not attached (what deviceless GPU compilation needs): the device
# facts of an H100 SXM5 80GB (NVIDIA's H100 datasheet and CUDA occupancy tables: 132 SMs at 1.98 GHz, 50 MiB
# L2, 228 KiB shared memory per SM, 3.35 TB/s, compute capability 9.0).
GPU_TARGETS = {"h100": """gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000 l2_cache_size: 52428800 clock_rate_ghz: 1.98
  device_memory_size: 84978434048 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 } registers_per_core_limit: 65536 registers_per_block_limit: 65536
}
platform_name: "CUDA"
device_description_str: "NVIDIA H100 80GB HBM3"
"""}
GPU_PLUGIN = "jax-cuda12-plugin==0.10.2 jax-cuda12-pjrt==0.10.2"  # the CUDA plugin matching jax 0.10.2


class CompileOOMError(RuntimeError):
    """The TPU compiler's out-of-memory error for one program, with the program and topology named."""

    def __init__(self, program: str, topology: str, compiler_message: str, argument_bytes: float, hbm_bytes: float):
        self.program, self.topology, self.compiler_message = program, topology, compiler_message
        self.argument_bytes, self.hbm_bytes = argument_bytes, hbm_bytes
        first = " ".join(compiler_message.strip().split())
        super().__init__(f"OUT OF MEMORY: program {program} on {topology}: arguments {argument_bytes / 2**30:.2f} GiB "
                         f"per chip of {hbm_bytes / 2**30:.2f} GiB HBM; compiler: {first}")


def parse_topology(spec: str) -> tuple[str, tuple[int, ...]]:
    """"v5p:2x4x4" -> ("v5p", (2, 4, 4)); "h100:8" -> ("h100", (8,)). Chips: `roofline.CHIPS`; grids are 2-D
    for v5e / v6e, 3-D for v4 / v5p, and a GPU count (one node) for GPUs."""
    chip, _, grid = spec.partition(":")
    if chip not in roofline.CHIPS or not grid:
        raise ValueError(f"--topology {spec!r}: expected <chip>:<grid> with chip one of {list(roofline.CHIPS)}, "
                         "e.g. v5p:2x4x4, v5e:16x16, h100:8")
    try:
        dims = tuple(int(x) for x in grid.split("x"))
    except ValueError:
        raise ValueError(f"--topology {spec!r}: the grid {grid!r} is not integers joined by 'x'") from None
    rank = 1 if chip in GPU_TARGETS else 2 if chip in _TWO_D else 3
    if len(dims) != rank or min(dims) < 1:
        raise ValueError(f"--topology {spec!r}: {chip} grids have {rank} positive dimension(s)")
    return chip, dims


def topology_devices(spec: str, num_slices: int = 1) -> list:
    """Compile-only devices of `num_slices` slices (GPU: nodes) of the topology, one per chip (megacore on
    v4 / v5p)."""
    chip, dims = parse_topology(spec)
    if num_slices < 1:
        raise ValueError(f"--num_slices must be >= 1, got {num_slices}")
    from jax.experimental import topologies
    if chip in GPU_TARGETS:
        try:
            topology = topologies.get_topology_desc(platform="cuda", topology_name="", target_config=GPU_TARGETS[chip],
                                                    topology=f"1x{num_slices}x{dims[0]}")
        except (NotImplementedError, RuntimeError) as e:
            raise RuntimeError(f"--topology {spec}: no CUDA compile-only topology ({e}); install {GPU_PLUGIN}") from e
        return list(topology.devices)
    # libtpu otherwise queries a GCE metadata server for the host's TPU, which a CPU host does not have; and
    # it takes /tmp/libtpu_lockfile, which any process that initialised libtpu (a launcher started without
    # JAX_PLATFORMS=cpu) holds for its lifetime. Compile-only devices never open a TPU, so share the load.
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    kwargs = {"chip_config_name": "megacore"} if chip in ("v4", "v5p") else {}
    if num_slices > 1:
        kwargs["num_slices"] = num_slices
    try:
        topology = topologies.get_topology_desc(topology_name=f"{chip}:{'x'.join(map(str, dims))}", platform="tpu",
                                                **kwargs)
    except RuntimeError as e:
        raise RuntimeError(f"--topology {spec}: libtpu could not describe it ({e}); is the TPU runtime installed "
                           "(pip install -e '.[tpu]')?") from e
    devices = list(topology.devices)
    if len(devices) != math.prod(dims) * num_slices:
        raise RuntimeError(f"--topology {spec}: libtpu gave {len(devices)} devices, expected "
                           f"{math.prod(dims) * num_slices} chips")
    return devices


def mesh_from_config(mesh_cfg, devices: Sequence[Any]):
    """The run's mesh (config.mesh.{data,fsdp,tensor}, one may be -1) over `devices`, by `sharding.make_mesh`;
    a fixed mesh smaller than the topology takes its first devices, as the trainer does with jax.devices().

    Multi-slice devices: `jax.make_mesh` (hence `sharding.make_mesh`, which the trainer calls) refuses them, so
    the mesh is built as a hybrid one: "data" across the slices (the data-center network; data = 1 becomes one
    replica per slice), "fsdp" and "tensor" within each slice.
    """
    from jax.experimental import mesh_utils
    from jax.sharding import AxisType, Mesh
    from searchjax.sharding import MESH_AXES, make_mesh
    sizes = [int(mesh_cfg.data), int(mesh_cfg.fsdp), int(mesh_cfg.tensor)]
    slices = len({getattr(d, "slice_index", 0) or 0 for d in devices})
    if slices == 1:
        used = list(devices) if -1 in sizes else list(devices)[:math.prod(sizes)]
        return make_mesh(*sizes, devices=used)
    data = slices if sizes[0] == 1 else sizes[0]
    if data == -1 or data % slices:
        raise ValueError(f"config.mesh.data={sizes[0]}: on {slices} slices it must be 1 or a multiple of {slices}")
    inner = [data // slices, sizes[1], sizes[2]]
    per_slice = len(devices) // slices
    if -1 in inner:
        inner[inner.index(-1)] = per_slice // math.prod(x for x in inner if x != -1)
    if math.prod(inner) != per_slice:
        raise ValueError(f"config.mesh {sizes}: {inner} per slice does not match the {per_slice} chips of a slice")
    grid = mesh_utils.create_hybrid_device_mesh(inner, [slices, 1, 1], list(devices))
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def sharded_bytes(tree: Any) -> float:
    """Bytes one chip holds of a pytree of ShapeDtypeStructs: the product of each leaf's shard shape (as its
    sharding splits it) times its item size (a threefry PRNG key is two uint32 words)."""
    total = 0.0
    for leaf in jax.tree.leaves(tree):
        if not isinstance(leaf, jax.ShapeDtypeStruct):  # static arguments (a model, a tail length)
            continue
        sharding = getattr(leaf, "sharding", None)
        shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
        itemsize = 8 if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key) else np.dtype(leaf.dtype).itemsize
        total += math.prod(shape) * itemsize
    return total


def count_collectives(hlo_text: str) -> dict[str, int]:
    """Collective instructions of a compiled HLO module by kind (async start/done pairs counted once)."""
    counts = dict.fromkeys(COLLECTIVES, 0)
    for match in _COLLECTIVE_RE.finditer(hlo_text):
        counts[match.group(1)] += 1
    return counts


@dataclasses.dataclass
class Program:
    """One jitted program of the run at its real shapes: `jitted.lower(*args, **static)`."""

    name: str
    jitted: Any
    args: tuple
    static: dict
    cost: roofline.Cost  # one call (analytic)
    calls: float  # calls per RL step (decode: steps)
    chips: int  # chips it runs on
    in_step: bool = True  # counted in the projected RL step (False: e.g. the retrieval server's encoder)
    shapes: str = ""  # what the shapes are, for the report
    trips: str = ""  # the loops the compiler counts once
    check_peak: bool = False  # compare the peak with the device memory here (GPUs: their compiler does not)


def _first_cost(compiled) -> dict:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    return dict(cost or {})


def compile_program(program: Program, *, topology: str, hbm_bytes: float) -> dict:
    """Lower and compile `program`; its per-chip memory, collectives and FLOPs against the analytic count.

    Raises CompileOOMError when the TPU compiler reports RESOURCE_EXHAUSTED.
    """
    started = time.perf_counter()
    argument_bytes = sharded_bytes(program.args)
    try:
        compiled = program.jitted.lower(*program.args, **program.static).compile()
    except Exception as e:  # JaxRuntimeError / XlaRuntimeError: the compiler's own status text
        if "RESOURCE_EXHAUSTED" in str(e) or "Ran out of memory" in str(e):
            raise CompileOOMError(program.name, topology, str(e), argument_bytes, hbm_bytes) from None
        raise
    seconds = time.perf_counter() - started
    memory = compiled.memory_analysis()
    cost = _first_cost(compiled)
    compiler_flops = float(cost.get("flops", 0.0))
    arg, out = memory.argument_size_in_bytes, memory.output_size_in_bytes
    alias, temp = memory.alias_size_in_bytes, memory.temp_size_in_bytes
    peak = getattr(memory, "peak_memory_in_bytes", 0) or (arg + out - alias + temp)
    if program.check_peak and peak > hbm_bytes:  # XLA:GPU compiles what cannot run (the TPU compiler refuses it)
        raise CompileOOMError(program.name, topology, f"peak {peak / 2**30:.2f} GiB per device (arguments "
                              f"{arg / 2**30:.2f}, temporaries {temp / 2**30:.2f}) exceeds the device's memory",
                              argument_bytes, hbm_bytes)
    once_per_chip = program.cost.once / program.chips
    return {
        "program": program.name, "shapes": program.shapes, "trips": program.trips, "chips": program.chips,
        "compile_s": round(seconds, 2), "argument_bytes": arg, "argument_bytes_expected": argument_bytes,
        "output_bytes": out, "alias_bytes": alias, "temp_bytes": temp, "peak_bytes": peak, "hbm_bytes": hbm_bytes,
        "collectives": count_collectives(compiled.as_text()),
        "compiler_flops_per_chip": compiler_flops, "compiler_bytes_per_chip": float(cost.get("bytes accessed", 0.0)),
        "analytic_once_flops_per_chip": once_per_chip,
        # XLA:GPU's compile-only executables report no cost analysis: None there.
        "compiler_over_analytic_once": compiler_flops / once_per_chip if compiler_flops and once_per_chip else None,
        "analytic_flops_per_call": program.cost.flops, "calls_per_step": program.calls, "in_step": program.in_step,
    }


def _ratio(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def format_report(row: dict) -> str:
    """Two lines per compiled program for the console."""
    g = 2 ** 30
    coll = " ".join(f"{k}={v}" for k, v in row["collectives"].items() if v) or "none"
    return (f"{row['program']:<14} {row['shapes']}\n"
            f"{'':14} per chip: args {row['argument_bytes'] / g:.2f} GiB, out {row['output_bytes'] / g:.2f} GiB "
            f"(aliased {row['alias_bytes'] / g:.2f}), temp {row['temp_bytes'] / g:.2f} GiB, peak "
            f"{row['peak_bytes'] / g:.2f} of {row['hbm_bytes'] / g:.2f} GiB HBM; collectives: {coll}; compiler "
            f"{row['compiler_flops_per_chip']:.3e} FLOP/chip vs analytic {row['analytic_once_flops_per_chip']:.3e} "
            f"(loops once: {row['trips'] or 'none'}; ratio {_ratio(row['compiler_over_analytic_once'])}); "
            f"{row['compile_s']:.0f} s")

"""One rules table from logical axis names to mesh axes, and the shardings derived from it.

Code names only *logical* axes ("batch", "embed", "vocab", ...); `ShardingRules` maps each to a mesh
axis of the 3-axis mesh ("data", "fsdp", "tensor") built by `make_mesh`. `tree_shardings` maps a tree
of logical axes and shapes to NamedShardings; the model's parameter shardings
(`searchjax.models.param_shardings`) apply it to `param_logical_axes(config)` (each parameter declares its
logical axes once, on its initialiser). This module knows nothing of the model: models import it, never the
reverse. Batch shardings come from the `batch`/`seq` rules.

    mesh   = make_mesh(data=2, fsdp=2, tensor=2)                  # -1 = all remaining devices
    shards = models.param_shardings(config, mesh)                  # pytree of NamedSharding like params
    params = models.init_params_sharded(config, mesh, seed=0)      # created on-mesh, never whole on one device
    batch  = jax.device_put(ids, batch_sharding(mesh, ndim=2))     # [B, T] rows over data x fsdp
    (multi-host: searchjax.distributed.global_batch(local_rows, batch_sharding(mesh)) instead)

Default rules (a Megatron/FSDP hybrid): batch -> ("data", "fsdp"); embed -> "fsdp" (parameters are
gathered per layer, ZeRO-3 style); vocab, mlp, q_heads, kv_heads -> "tensor" (column/row-parallel
projections); layers, head_dim, seq -> None.

Indivisible dimensions (chosen policy): a parameter dimension whose size is not a multiple of the
mesh-axis size it maps to (e.g. SmolLM2's 3 kv heads on tensor=2) is *replicated* along that dimension,
with one warning per (parameter, dimension); pass `indivisible="raise"` to make it an error instead.
Replicating keeps every model loadable on every mesh; the warning says which tensor lost which split.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import warnings
from typing import Any, Sequence, Union

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

MeshAxes = Union[str, tuple[str, ...], None]


@dataclasses.dataclass(frozen=True)
class ShardingRules:
    """Logical axis -> mesh axis name, tuple of mesh axis names, or None (replicated).

    Parameters use layers, vocab, embed, mlp, q_heads, kv_heads, head_dim; activations use batch, seq,
    embed, vocab. Within one tensor no mesh axis may be used twice: `logical_to_spec` raises on that.
    """

    batch: MeshAxes = ("data", "fsdp")
    seq: MeshAxes = None
    embed: MeshAxes = "fsdp"
    vocab: MeshAxes = "tensor"
    mlp: MeshAxes = "tensor"
    q_heads: MeshAxes = "tensor"
    kv_heads: MeshAxes = "tensor"
    head_dim: MeshAxes = None
    layers: MeshAxes = None


LOGICAL_AXES = tuple(f.name for f in dataclasses.fields(ShardingRules))


def _mesh_axes_tuple(value: MeshAxes) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def logical_to_spec(axes: Sequence[str | None], rules: ShardingRules | None = None) -> PartitionSpec:
    """PartitionSpec for a tensor whose dimensions carry the logical names `axes` (None = replicated).

    Raises ValueError on an unknown logical name or when two dimensions map to the same mesh axis
    (e.g. ("batch", "embed") under the default rules: both would use "fsdp").
    """
    rules = rules or ShardingRules()
    spec, used = [], {}
    for dim, name in enumerate(axes):
        if name is None:
            spec.append(None)
            continue
        if name not in LOGICAL_AXES:
            raise ValueError(f"unknown logical axis {name!r} in {tuple(axes)}; valid: {LOGICAL_AXES}")
        value = getattr(rules, name)
        for mesh_axis in _mesh_axes_tuple(value):
            if mesh_axis in used:
                raise ValueError(
                    f"logical axes {tuple(axes)}: dimensions {used[mesh_axis]} ({axes[used[mesh_axis]]!r}) and "
                    f"{dim} ({name!r}) both map to mesh axis {mesh_axis!r}; change ShardingRules")
            used[mesh_axis] = dim
        spec.append(value)
    return PartitionSpec(*spec)


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """Mesh with axes ("data", "fsdp", "tensor"); one size may be -1 = all devices left over.

    `devices` defaults to every device of every process (`jax.devices()`), so the same call builds the
    global mesh on each host of a pod. Axes are `AxisType.Auto`: XLA's GSPMD propagates shardings
    through the model from the parameter and batch shardings.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = [int(data), int(fsdp), int(tensor)]
    if sizes.count(-1) > 1:
        raise ValueError(f"make_mesh: at most one axis may be -1, got data={data}, fsdp={fsdp}, tensor={tensor}")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"make_mesh: axis sizes must be positive or -1, got {sizes}")
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        if len(devices) % known:
            raise ValueError(f"make_mesh: {len(devices)} devices are not divisible by the fixed axes {sizes}")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f"make_mesh: data*fsdp*tensor = {'*'.join(map(str, sizes))} = {math.prod(sizes)} "
            f"but {len(devices)} devices are given")
    return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def _fit_spec(spec: PartitionSpec, shape: Sequence[int], mesh: Mesh, where: str, indivisible: str) -> PartitionSpec:
    """Replicate (or raise on) dimensions whose size the mapped mesh axes do not divide."""
    if len(spec) > len(shape):
        raise ValueError(f"{where}: {len(spec)} logical axes for a tensor of shape {tuple(shape)}")
    fitted = []
    for dim, value in enumerate(spec):
        parts = math.prod(mesh.shape[a] for a in _mesh_axes_tuple(value))
        if parts > 1 and shape[dim] % parts:
            message = (f"{where}: dimension {dim} (size {shape[dim]}) is not divisible by mesh axes {value} "
                       f"(size {parts})")
            if indivisible == "raise":
                raise ValueError(message)
            warnings.warn(message + "; replicating that dimension", stacklevel=3)
            value = None
        fitted.append(value)
    return PartitionSpec(*fitted)


def _path_name(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def tree_shardings(axes: Any, shapes: Any, mesh: Mesh, rules: ShardingRules | None = None, *,
                   indivisible: str = "replicate") -> Any:
    """Pytree of NamedSharding for a pytree of arrays (or ShapeDtypeStructs) `shapes` whose logical axes are
    `axes` (the same tree with a tuple of logical names, or None, per leaf), through `rules`.

    A dimension whose size the mesh axis does not divide follows the indivisible policy: "replicate" (warn,
    replicate that dimension) or "raise". Model-agnostic: `searchjax.models.param_shardings` applies it to
    a Transformer's parameters.
    """
    if indivisible not in ("replicate", "raise"):
        raise ValueError(f"indivisible must be 'replicate' or 'raise', got {indivisible!r}")
    rules = rules or ShardingRules()
    is_axes = lambda x: isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)
    axes_flat, axes_def = jax.tree_util.tree_flatten_with_path(axes, is_leaf=is_axes)
    shape_flat, shape_def = jax.tree_util.tree_flatten_with_path(shapes)
    axes_paths = [_path_name(p) for p, _ in axes_flat]
    shape_paths = [_path_name(p) for p, _ in shape_flat]
    if axes_paths != shape_paths:
        missing = sorted(set(shape_paths) - set(axes_paths))
        extra = sorted(set(axes_paths) - set(shape_paths))
        raise ValueError(f"the logical axes do not match the parameters: no axes for {missing}, "
                         f"axes for unknown parameters {extra}")
    shardings = []
    for (path, names), (_, leaf) in zip(axes_flat, shape_flat):
        where = f"parameter {_path_name(path)}"
        if len(names) != len(leaf.shape):
            raise ValueError(f"{where}: logical axes {names} do not match its shape {tuple(leaf.shape)}")
        spec = _fit_spec(logical_to_spec(names, rules), leaf.shape, mesh, where, indivisible)
        shardings.append(NamedSharding(mesh, spec))
    return jax.tree_util.tree_unflatten(shape_def, shardings)


def batch_sharding(mesh: Mesh, rules: ShardingRules | None = None, ndim: int = 2) -> NamedSharding:
    """NamedSharding for [B, T, ...] arrays: B over `rules.batch`, T over `rules.seq`, the rest replicated.

    B must be a multiple of the batch shard count (`batch_shard_count`); scoring pads batches to it.
    """
    rules = rules or ShardingRules()
    names = ("batch", "seq", *([None] * (ndim - 2)))[:ndim]
    return NamedSharding(mesh, logical_to_spec(names, rules))


def batch_shard_count(mesh: Mesh, rules: ShardingRules | None = None) -> int:
    """How many ways the batch dimension is split on `mesh` (data x fsdp under the default rules)."""
    rules = rules or ShardingRules()
    return math.prod(mesh.shape[a] for a in _mesh_axes_tuple(rules.batch))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device of `mesh` holds the whole array."""
    return NamedSharding(mesh, PartitionSpec())


def spans_processes(mesh: Mesh | None) -> bool:
    """True when `mesh` holds devices of other processes (a multi-host mesh). A host array cannot be
    `device_put` onto such a mesh (each process supplies the shards its own devices hold), reading an array
    back needs a gather, and every jitted call on it is a collective that all processes must make together."""
    return mesh is not None and mesh.is_multi_process


def mesh_of(tree) -> Mesh | None:
    """The Mesh of the first NamedSharding-placed array in `tree` (e.g. params), else None."""
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding):
            return sharding.mesh
    return None


def flax_axis_rules(rules: ShardingRules | None = None) -> tuple[tuple[str, MeshAxes], ...]:
    """The rules as Flax's ((logical, mesh_axes), ...) list, for `nn.logical_axis_rules(...)` contexts.

    For code that pins activations with Flax's own `nn.with_logical_constraint`; ours uses `constrain`,
    whose `activation_spec` follows the same precedence (Flax skips a mesh axis already used by an earlier
    dimension, so ("batch", "seq", "embed") activations shard over batch only under the default rules).
    """
    rules = rules or ShardingRules()
    return tuple((name, getattr(rules, name)) for name in LOGICAL_AXES)


# ------------------------------------------------------------------------------------------------------
# Activation constraints
# ------------------------------------------------------------------------------------------------------
_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("searchjax_activation_sharding", default=None)


@contextlib.contextmanager
def activation_sharding(mesh: Mesh | None, rules: ShardingRules | None = None):
    """Within this context (entered while a jitted function is traced), `constrain` pins activations.

    Without it GSPMD alone lays activations out from the parameter and batch shardings, and it may pick
    a layout that is not split over the batch: the update's [rows, columns, vocab chunk] float32 logits of
    `scoring.target_logprobs`, contracted over the fsdp-sharded hidden dimension, came out whole on every
    chip (63 G of temporaries for Qwen3-0.6B at 256 rows on v5e:16x16). mesh None: no constraints.
    """
    token = _ACTIVE.set(None if mesh is None else (mesh, rules or ShardingRules()))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def activation_spec(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules: ShardingRules | None = None) -> PartitionSpec:
    """PartitionSpec of an activation whose dimensions carry the logical names `axes`.

    Flax's precedence (`nn.logical_to_mesh_axes`): the rules are taken in their table order and a
    dimension gets its rule's mesh axes unless an earlier-assigned dimension already uses one of them
    (("batch", "seq", "embed") shards over the batch only under the default rules). Unlike parameters, an
    activation dimension that those mesh axes do not divide stays replicated, silently (a 49,152-column
    vocabulary chunk of 12,288 on tensor=8 is fine, one of 3 columns is not worth a warning per trace).
    """
    rules = rules or ShardingRules()
    unknown = [a for a in axes if a is not None and a not in LOGICAL_AXES]
    if unknown:
        raise ValueError(f"activation_spec: unknown logical axes {unknown}; known: {LOGICAL_AXES}")
    spec: list[MeshAxes] = [None] * len(axes)
    used: set[str] = set()
    for name in LOGICAL_AXES:
        if name not in axes:
            continue
        dim = list(axes).index(name)
        mesh_axes = _mesh_axes_tuple(getattr(rules, name))
        if not mesh_axes or used.intersection(mesh_axes):
            continue
        if shape[dim] % math.prod(mesh.shape[a] for a in mesh_axes):
            continue
        spec[dim] = getattr(rules, name)
        used.update(mesh_axes)
    return PartitionSpec(*spec)


def activation_sharding_active() -> bool:
    """Whether code is being traced inside `activation_sharding` with a mesh (its activations pinned to one)."""
    return _ACTIVE.get() is not None


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
    """`x` pinned to its logical axes' layout inside `activation_sharding` (under jit); else x unchanged."""
    active = _ACTIVE.get()
    if active is None:
        return x
    mesh, rules = active
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, activation_spec(axes, x.shape, mesh, rules)))


def with_activation_sharding(fn, mesh: Mesh | None, rules: ShardingRules | None = None):
    """`fn` traced inside `activation_sharding(mesh, rules)` (wrap before `jax.jit`); fn itself when mesh is None."""
    if mesh is None:
        return fn

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with activation_sharding(mesh, rules):
            return fn(*args, **kwargs)
    return traced

"""The decoder's parameter shardings and its sharded initialisation (the rules table: searchjax.sharding)."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh

from searchjax.models.transformer import abstract_params, init_params, param_logical_axes
from searchjax.sharding import ShardingRules, tree_shardings


def param_shardings(config, mesh: Mesh, rules: ShardingRules | None = None, *, shapes: Any = None,
                    indivisible: str = "replicate") -> Any:
    """Pytree of NamedSharding matching the params of `Transformer(config)`.

    Specs come from `param_logical_axes(config)` through `rules`; `shapes` (a pytree like params of arrays or
    ShapeDtypeStructs, default `abstract_params(config)`) is used to apply the indivisible-dimension policy:
    "replicate" (warn, replicate that dimension) or "raise".
    """
    shapes = abstract_params(config) if shapes is None else shapes
    return tree_shardings(param_logical_axes(config), shapes, mesh, rules, indivisible=indivisible)


def init_params_sharded(config, mesh: Mesh, rules: ShardingRules | None = None, *, seed: int = 0,
                        indivisible: str = "replicate") -> Any:
    """Random parameters of `Transformer(config)` created directly in their shardings.

    `abstract_params` (jax.eval_shape) gives the shapes, `param_shardings` the shardings, and `init_params` is
    jitted with those `out_shardings`, so each device only ever materialises its own shards (never the whole
    model on one device, then moved).
    """
    shardings = param_shardings(config, mesh, rules, shapes=abstract_params(config), indivisible=indivisible)
    return jax.jit(lambda key: init_params(config, key), out_shardings=shardings)(jax.random.key(seed))
